"""`zoe sim predict|replay|calibrate` and the --engine sim adapter."""

from __future__ import annotations

import json
import subprocess
import sys

from zoe_cluster.engines.base import LaunchContext
from zoe_cluster.engines.sim import SimAdapter
from zoe_cluster.recipes import RecipeRegistry
from tests.conftest import REPO


def zoe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_predict_ttft_and_decode_json():
    p = zoe("sim", "predict", "--model", "glm-5.3", "--variant", "fp8-tp8", "--input-len", "65536",
            "--hit-rate", "0.6", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert abs(out["ttft_s"] / 1.715 - 1) < 0.1  # seed table A5 (baseline), 64K at 60%
    p = zoe("sim", "predict", "--model", "glm-5.3", "--variant", "fp8-tp8", "--concurrency", "8", "--output-len",
            "256", "--json")
    out = json.loads(p.stdout)
    assert abs(out["decode_tok_s_per_node"] / 389.9 - 1) < 0.08  # seed table A7
    assert out["decode_tok_s_per_user"] * 8 == __import__("pytest").approx(out["decode_tok_s_per_node"], rel=1e-3)


def test_bad_arguments_exit_non_zero_with_a_reason(tmp_path):
    cases = [
        (("sim", "predict", "--model", "nope", "--input-len", "10"), "unknown model"),
        (("sim", "predict", "--model", "glm-5.3", "--variant", "x", "--input-len", "10"), "no variant"),
        (("sim", "predict", "--model", "glm-5.3", "--input-len", "10", "--hit-rate", "1.5"), "hit-rate"),
        (("sim", "predict", "--model", "glm-5.3"), "either"),
        (("sim", "replay", str(tmp_path / "missing.jsonl"), "--model", "glm-5.3"), "cannot read"),
        (("sim", "replay", str(tmp_path / "missing.jsonl"), "--model", "glm-5.3", "--policy", "zzz"), "unknown policy"),
        (("sim", "serve", "--model", "glm-5.3", "--time-scale", "0"), "time-scale"),
        (("sim", "serve", "--model", "glm-5.3", "--error-rate", "2"), "error_rate"),
    ]
    for args, needle in cases:
        p = zoe(*args)
        assert p.returncode != 0, args
        assert needle in (p.stderr + p.stdout).lower().replace("\n", " "), (args, p.stderr)


def test_replay_cli_json(tmp_path):
    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": i * 200, "input_length": 2000 + 10 * i, "output_length": 20, "hash_ids": [0, 1, 2 + i, 99 + i]}
             for i in range(30)]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    p = zoe("sim", "replay", str(trace), "--model", "glm-5.3", "--replicas", "2", "--policy", "prefix", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in ("requests", "completed", "dropped", "prefix_hit_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
                "output_tok_s"):
        assert key in out
    assert out["requests"] == out["completed"] == 30 and out["prefix_hit_rate"] > 0.3


def test_adapter_argv_env_and_metrics():
    r = RecipeRegistry.default().get("glm-5.3")
    ctx = LaunchContext(gpu_ids=(0, 1), platform="cpu", host="127.0.0.1", port=9001, served_model_name="glm",
                        extra_env={"ZOE_SIM_TIME_SCALE": "0.01", "ZOE_SIM_CRASH_AFTER": "5"})
    a = SimAdapter()
    cmd = a.command(r, "fp8-tp8", ctx)
    assert a.name == "sim" and a.health_path == "/health"
    assert cmd.argv[:5] == [sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve"]
    assert cmd.argv[5:] == ["--model", "glm-5.3", "--variant", "fp8-tp8", "--host", "127.0.0.1", "--port", "9001",
                            "--served-model-name", "glm"]
    assert cmd.env["ZOE_SIM_TIME_SCALE"] == "0.01" and cmd.env["ZOE_SIM_CRASH_AFTER"] == "5"
    text = (
        'vllm:num_requests_running{engine="0",model_name="glm"} 3.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="glm"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="glm"} 0.25\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="glm"} 100.0\n'
        'vllm:prefix_cache_hits_total{engine="0",model_name="glm"} 40.0\n'
        'vllm:num_preemptions_total{engine="0",model_name="glm"} 1.0\n'
    )
    s = a.parse_metrics(text, 12.5)
    assert (s.scraped_at, s.running, s.waiting, s.kv_cache_usage, s.prefix_cache_hits, s.preemptions) == (
        12.5, 3.0, 2.0, 0.25, 40.0, 1.0)
