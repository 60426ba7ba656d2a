"""`zoe bench` end to end against zoe's simulated engine (GLM-5.3 fp8-tp8 baseline, time scale 0.05).

The simulated engine reports its time scale in /sim/info, so the bench reports modelled seconds: the
numbers can be held against the seed's tables (A5 TTFT, A7 decode) loosely (the sim's fidelity is its own
benchmark's business; here they show that the bench converts time and counts tokens correctly)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zoe_cluster.bench.report import load_report
from zoe_cluster.cli.main import app

runner = CliRunner()


def zoe(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_prefill_hit_rate_control_reaches_the_target(sim_url, tmp_path):
    out = tmp_path / "prefill.json"
    res = zoe("bench", "prefill", "--url", sim_url, "--lengths", "8k,32k", "--hit-rates", "0,0.6,0.9",
              "--runs", "2", "--warmup", "1", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    report = load_report(out)
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert report.command.startswith("zoe bench prefill --url") and "--hit-rates 0,0.6,0.9" in report.command
    assert "--seed" in report.command and report.versions["zoe"]
    assert report.server.engine == "vllm" and report.server.sim["variant"] == "fp8-tp8"
    assert report.config["server_time_scale"] == 0.05
    assert report.server.token_counter.startswith("simulated engine")
    assert len(report.rows) == 6
    for row in report.rows:
        assert row["completed"] == 2 and row["ttft_s"]["n"] == 2
        # 16-token blocks: the engine sees the target to within a block.
        assert row["engine_hit_rate"] == pytest.approx(row["hit_rate_target"], abs=0.01)
        assert row["prompt_tokens_mean"] == pytest.approx(row["input_len"], abs=2)
        assert row["client_cached_fraction"] == pytest.approx(row["engine_hit_rate"], abs=0.01)
    by = {(r["input_len"], r["hit_rate_target"]): r["ttft_s"]["mean"] for r in report.rows}
    # Modelled seconds (seed table A5, baseline: 1.752 s at 32K, 0.240 s at 32K with 90% cached), not wall time.
    assert 1.2 < by[(32768, 0.0)] < 2.5
    assert by[(32768, 0.9)] < by[(32768, 0.6)] < by[(32768, 0.0)] / 1.5


def test_a_server_without_tokenize_gets_a_ratio_calibrated_from_usage(sim_url):
    import asyncio

    import aiohttp

    from zoe_cluster.bench.prompts import probe_token_counter

    async def probe():
        async with aiohttp.ClientSession() as session:
            return await probe_token_counter(session, sim_url, "glm-5.3")

    counter = asyncio.run(probe())  # the simulated engine has no /tokenize
    assert counter.name == "usage-calibrated ratio" and not counter.exact
    assert counter.tokens_per_char == pytest.approx(0.25, rel=0.01)  # its documented 4 characters per token


def test_prefill_reads_sglang_metric_names(sim_sglang_url, tmp_path):
    out = tmp_path / "prefill.json"
    res = zoe("bench", "prefill", "--url", sim_sglang_url, "--lengths", "8k", "--hit-rates", "0.6,0.9",
              "--runs", "2", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    report = load_report(out)
    assert report.server.engine == "sglang"
    for row in report.rows:
        assert row["engine_hit_rate"] == pytest.approx(row["hit_rate_target"], abs=0.01)


def test_decode_per_user_and_per_node_are_consistent(sim_url, tmp_path):
    out = tmp_path / "decode.json"
    res = zoe("bench", "decode", "--url", sim_url, "--concurrency", "1,4", "--output-len", "64",
              "--prompt", "gsm8k", "--runs", "2", "--warmup", "0", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    report = load_report(out)
    assert "Tobias" in report.config["prompt_text"] and report.config["prompt_label"] == "gsm8k"
    per_user = {}
    for row in report.rows:
        c = row["concurrency"]
        assert row["completed"] == 2 * c and row["output_tokens_mean"] == 64
        per_user[c], per_node = row["per_user_tok_s"]["mean"], row["per_node_tok_s"]["mean"]
        assert per_node == pytest.approx(c * per_user[c], rel=0.15)
        assert per_node == pytest.approx(row["per_node_from_users_tok_s"]["mean"], rel=0.15)
    # Seed table A7 (GLM-5.3 baseline, MTP off): 56.4 tok/s per node at 1 request; a batch of 4 costs a bit more.
    assert 35 < per_user[1] < 80
    assert per_user[4] <= per_user[1] * 1.05


def test_trace_replay_azure_open_and_closed_loop(sim_url, tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,{100 + 10 * i},{3 + i % 4}\n" for i in range(12)))  # fmt: skip
    out = tmp_path / "trace.json"
    res = zoe("bench", "trace", str(trace), "--url", sim_url, "--time-scale", "0.2", "--out", str(out))
    assert res.exit_code == 0, res.output
    row = load_report(out).rows[0]
    assert row["requests"] == row["completed"] == 12 and row["errors"] == 0
    assert row["prompt_tokens_total"] == pytest.approx(row["trace_input_tokens_total"], rel=0.05)
    assert row["output_tokens_total"] == sum(3 + i % 4 for i in range(12))
    res = zoe("bench", "trace", str(trace), "--url", sim_url, "--closed-loop", "3", "--limit", "6",
              "--out", str(tmp_path / "closed.json"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert load_report(tmp_path / "closed.json").rows[0]["completed"] == 6


def test_mooncake_replay_keeps_the_sharing_structure_and_fresh_seeds_do_not_reuse_the_cache(sim_url, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = [(0, 1024, [0, 1]), (10, 1024, [0, 2]), (20, 1536, [0, 1, 3])]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": h}) + "\n"
                             for t, n, h in rows))  # fmt: skip
    rates = []
    for seed in ("1", "2"):
        out = tmp_path / f"moon{seed}.json"
        res = zoe("bench", "trace", str(trace), "--url", sim_url, "--closed-loop", "1", "--seed", seed,
                  "--out", str(out))  # fmt: skip
        assert res.exit_code == 0, res.output
        report = load_report(out)
        row = report.rows[0]
        assert report.config["trace_format"] == "mooncake" and row["completed"] == 3
        # The simulated engine's tokenization makes the trace's lengths exact.
        assert row["prompt_tokens_total"] == row["trace_input_tokens_total"] == 3584
        rates.append(row["engine_hit_rate"])
    # Request 2 shares block 0 with request 1 (512 tokens), request 3 shares blocks 0-1 (1024): 1536 / 3584.
    # A replay with another seed sees the same structure, not the first replay's cache.
    assert rates[0] == pytest.approx(1536 / 3584, abs=0.01)
    assert rates[1] == pytest.approx(rates[0], abs=0.005)


def test_compare_prints_ratios_and_writes_a_png(sim_url, tmp_path):
    for name in ("a", "b"):
        res = zoe("bench", "prefill", "--url", sim_url, "--lengths", "8k,16k", "--hit-rates", "0,0.5",
                  "--runs", "2", "--label", name.upper(), "--out", str(tmp_path / f"{name}.json"))  # fmt: skip
        assert res.exit_code == 0, res.output
    res = zoe("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json",
              "--plot", str(tmp_path / "cmp.png"))  # fmt: skip
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["cells"]) == 4 and not data["unmatched"]
    for cell in data["cells"]:
        assert cell["ratio"] == pytest.approx(cell["b_mean"] / cell["a_mean"])
        assert cell["speedup"] == pytest.approx(1 / cell["ratio"])  # TTFT: lower is better
        assert 0.5 < cell["ratio"] < 2  # the same engine twice
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    res = zoe("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert res.exit_code == 0 and "B/A" in res.output and "8K @ 50%" in res.output


@pytest.mark.parametrize(
    "args, reason",
    [
        (["prefill", "--url", "http://127.0.0.1:9", "--lengths", "1k"], "cannot reach"),
        (["prefill", "--url", "URL", "--lengths", "8q"], "not a token count"),
        (["prefill", "--url", "URL", "--hit-rates", "0.6", "--warmup", "0"], "warmup"),
        (["decode", "--url", "URL", "--prompt", "/nonexistent/prompt.txt"], "unknown prompt"),
        (["decode", "--url", "URL", "--concurrency", "1,x"], "not a positive concurrency"),
        (["decode", "--url", "URL", "--api", "grpc"], "--api: expected"),
        (["trace", "/nonexistent.jsonl", "--url", "URL"], "does not exist"),
        (["prefill", "--url", "URL", "--model", "nope", "--lengths", "64"], "does not serve model"),
    ],
)
def test_bad_input_exits_non_zero_with_a_reason(sim_url, args, reason, tmp_path):
    args = [sim_url if a == "URL" else a for a in args]
    res = runner.invoke(app, ["bench", *args, "--out", str(tmp_path / "r.json")])
    assert res.exit_code != 0
    assert reason in res.output, res.output


def test_a_cell_with_no_successful_request_exits_1_after_writing_the_report(sim_url, tmp_path):
    # 600K tokens is past GLM-5.3's context: every request gets the engine's 400.
    out = tmp_path / "r.json"
    res = runner.invoke(app, ["bench", "prefill", "--url", sim_url, "--lengths", "600000", "--hit-rates", "0",
                              "--runs", "1", "--out", str(out)])  # fmt: skip
    assert res.exit_code == 1 and "no successful request" in res.output
    assert "maximum context length" in load_report(out).rows[0]["error_samples"][0]


def test_compare_rejects_a_malformed_report(tmp_path):
    (tmp_path / "bad.json").write_text('{"kind": "prefill"}')
    res = runner.invoke(app, ["bench", "compare", str(tmp_path / "bad.json"), str(tmp_path / "bad.json")])
    assert res.exit_code != 0 and "bad.json: field" in res.output
