"""`zoe bench` end to end against the FAKE engine (tests/bench/fake_engine.py: a real block prefix cache over
whitespace words, vLLM's counter names)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zoe_cluster.bench.report import load_report
from zoe_cluster.cli.main import app

runner = CliRunner()


def zoe(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_prefill_hit_rate_control_reaches_the_target(fake_engine_url, tmp_path):
    out = tmp_path / "prefill.json"
    res = zoe("bench", "prefill", "--url", fake_engine_url, "--lengths", "1k,2k", "--hit-rates", "0,0.6,0.9",
              "--runs", "3", "--warmup", "1", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    report = load_report(out)
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert report.command.startswith("zoe bench prefill") and "--hit-rates" in report.command
    assert report.versions["zoe"] and report.server.token_counter == "server /tokenize"
    assert len(report.rows) == 6
    for row in report.rows:
        assert row["completed"] == 3 and row["ttft_s"]["n"] == 3
        # The engine caches 16-token blocks, so it sees the target rounded down to a block.
        assert row["engine_hit_rate"] == pytest.approx(row["hit_rate_target"], abs=0.02)
        assert row["prompt_tokens_mean"] == pytest.approx(row["input_len"], abs=2)
    by = {(r["input_len"], r["hit_rate_target"]): r["ttft_s"]["mean"] for r in report.rows}
    assert by[(2048, 0.9)] < by[(2048, 0.0)] / 3 and by[(2048, 0.6)] < by[(2048, 0.0)]


def test_decode_per_user_and_per_node_are_consistent(fake_engine_url, tmp_path):
    out = tmp_path / "decode.json"
    res = zoe("bench", "decode", "--url", fake_engine_url, "--concurrency", "1,4", "--output-len", "40",
              "--prompt", "gsm8k", "--runs", "2", "--warmup", "0", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    report = load_report(out)
    assert "Tobias" in report.config["prompt_text"] and report.config["prompt_label"] == "gsm8k"
    for row in report.rows:
        c = row["concurrency"]
        assert row["completed"] == 2 * c and row["output_tokens_mean"] == 40
        per_user, per_node = row["per_user_tok_s"]["mean"], row["per_node_tok_s"]["mean"]
        # The fake engine emits a token every 3 ms per stream: ~330 tok/s per user, c times that per node.
        assert 150 < per_user < 340
        assert per_node == pytest.approx(c * per_user, rel=0.15)
        assert per_node == pytest.approx(row["per_node_from_users_tok_s"]["mean"], rel=0.15)


def test_trace_replay_azure_open_and_closed_loop(fake_engine_url, tmp_path):
    trace = tmp_path / "azure.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,{100 + 10 * i},{3 + i % 4}\n" for i in range(12)))  # fmt: skip
    out = tmp_path / "trace.json"
    res = zoe("bench", "trace", str(trace), "--url", fake_engine_url, "--time-scale", "0.2", "--out", str(out))
    assert res.exit_code == 0, res.output
    row = load_report(out).rows[0]
    assert row["requests"] == row["completed"] == 12 and row["errors"] == 0
    assert row["prompt_tokens_total"] == pytest.approx(row["trace_input_tokens_total"], rel=0.05)
    assert row["output_tokens_total"] == sum(3 + i % 4 for i in range(12))
    # 12 arrivals over 1.1 s of trace time, scaled by 0.2: the replay takes about 0.22 s plus the last request.
    assert 0.2 < row["duration_s"] < 2.0
    res = zoe("bench", "trace", str(trace), "--url", fake_engine_url, "--closed-loop", "3", "--limit", "6",
              "--out", str(tmp_path / "closed.json"))  # fmt: skip
    assert res.exit_code == 0, res.output
    assert load_report(tmp_path / "closed.json").rows[0]["completed"] == 6


def test_compare_prints_ratios_and_writes_a_png(fake_engine_url, tmp_path):
    for name in ("a", "b"):
        res = zoe("bench", "prefill", "--url", fake_engine_url, "--lengths", "512,1k", "--hit-rates", "0,0.5",
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
        assert 0.3 < cell["ratio"] < 3
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    res = zoe("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert res.exit_code == 0 and "B/A" in res.output and "512 @ 50%" in res.output


@pytest.mark.parametrize(
    "args, reason",
    [
        (["prefill", "--url", "http://127.0.0.1:9", "--lengths", "1k"], "cannot reach"),
        (["prefill", "--url", "URL", "--lengths", "8q"], "not a token count"),
        (["prefill", "--url", "URL", "--hit-rates", "0.6", "--warmup", "0"], "warmup"),
        (["decode", "--url", "URL", "--prompt", "/nonexistent/prompt.txt"], "unknown prompt"),
        (["decode", "--url", "URL", "--concurrency", "1,x"], "not a positive concurrency"),
        (["trace", "/nonexistent.jsonl", "--url", "URL"], "does not exist"),
        (["prefill", "--url", "URL", "--model", "nope", "--lengths", "64"], "does not serve model"),
    ],
)
def test_bad_input_exits_non_zero_with_a_reason(fake_engine_url, args, reason, tmp_path):
    args = [fake_engine_url if a == "URL" else a for a in args]
    res = runner.invoke(app, ["bench", *args, "--out", str(tmp_path / "r.json")])
    assert res.exit_code != 0
    assert reason in res.output, res.output


def test_compare_rejects_reports_of_different_workloads(tmp_path):
    (tmp_path / "bad.json").write_text('{"kind": "prefill"}')
    res = runner.invoke(app, ["bench", "compare", str(tmp_path / "bad.json"), str(tmp_path / "bad.json")])
    assert res.exit_code != 0 and "bad.json: field" in res.output


def test_mooncake_replay_keeps_the_sharing_structure_and_fresh_seeds_do_not_reuse_the_cache(fake_engine_url, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = [(0, 1024, [0, 1]), (10, 1024, [0, 2]), (20, 1536, [0, 1, 3])]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": h}) + "\n"
                             for t, n, h in rows))  # fmt: skip
    rates = []
    for seed in ("1", "2"):
        out = tmp_path / f"moon{seed}.json"
        res = zoe("bench", "trace", str(trace), "--url", fake_engine_url, "--closed-loop", "1", "--seed", seed,
                  "--out", str(out))  # fmt: skip
        assert res.exit_code == 0, res.output
        report = load_report(out)
        assert report.config["trace_format"] == "mooncake" and report.rows[0]["completed"] == 3
        rates.append(report.rows[0]["engine_hit_rate"])
    # Request 2 shares block 0 with request 1, request 3 shares blocks 0-1: about 2 of 4.7 blocks' words are
    # hits (the fake caches 16-word blocks). A second replay with another seed sees the same, not ~100%.
    assert 0.35 < rates[0] < 0.5
    assert rates[1] == pytest.approx(rates[0], abs=0.02)
