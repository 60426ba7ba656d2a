"""Pure parts of the bench: option parsing, statistics, metrics parsing, trace files, decode arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TRACES

from zoe_cluster.bench.client import RequestResult
from zoe_cluster.bench.decode import summarize_run
from zoe_cluster.bench.engine_metrics import CacheCounters, hit_rate_between, parse_cache_counters
from zoe_cluster.bench.prompts import load_prompt
from zoe_cluster.bench.sizes import format_tokens, parse_positive_ints, parse_rates, parse_token_counts
from zoe_cluster.bench.stats import summarize
from zoe_cluster.bench.traces import load_trace


def test_token_counts_accept_the_seeds_notation():
    assert parse_token_counts("8k,16K, 128k,1000") == [8192, 16384, 131072, 1000]
    assert format_tokens(131072) == "128K" and format_tokens(1000) == "1000"


@pytest.mark.parametrize("bad", ["8q", "", "8k,,16k", "-1", "0", "1.5"])
def test_malformed_lengths_are_rejected_with_the_culprit(bad):
    with pytest.raises(ValueError):
        parse_token_counts(bad)


def test_rates_and_ints():
    assert parse_rates("0,0.6,90%") == [0.0, 0.6, 0.9]
    with pytest.raises(ValueError, match="outside"):
        parse_rates("1.0")
    with pytest.raises(ValueError):
        parse_rates("x")
    assert parse_positive_ints("1,2,32") == [1, 2, 32]
    with pytest.raises(ValueError):
        parse_positive_ints("1,0")


def test_summarize():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s["n"] == 4 and s["mean"] == 2.5 and s["p50"] == 2.5
    assert s["std"] == pytest.approx(1.2909944, rel=1e-6)  # sample std
    assert summarize([])["mean"] is None and summarize([5.0])["std"] == 0.0


VLLM_TEXT = """# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 500.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 600.0
"""
SGLANG_TEXT = """# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 2000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m",cache_source="device"} 1500.0
"""


def test_cache_counters_of_both_engines_and_the_window_hit_rate():
    v = parse_cache_counters(VLLM_TEXT)
    assert (v.engine, v.queries, v.hits) == ("vllm", 1500.0, 600.0)
    s = parse_cache_counters(SGLANG_TEXT)
    assert (s.engine, s.queries, s.hits) == ("sglang", 2000.0, 1500.0)
    assert parse_cache_counters("other_metric 1\n").engine is None
    assert hit_rate_between(CacheCounters("vllm", 100, 1000), CacheCounters("vllm", 190, 1100)) == pytest.approx(0.9)
    assert hit_rate_between(CacheCounters(None), CacheCounters("vllm", 1, 1)) is None
    assert hit_rate_between(CacheCounters("vllm", 1, 5), CacheCounters("vllm", 1, 5)) is None


def test_prompts(tmp_path):
    assert "gcd" in load_prompt("apex")[1] and "Tobias" in load_prompt("GSM8K")[1]
    f = tmp_path / "p.txt"
    f.write_text("hello there\n")
    assert load_prompt(str(f)) == ("p.txt", "hello there")
    with pytest.raises(ValueError, match="unknown prompt"):
        load_prompt(str(tmp_path / "missing.txt"))


def test_traces(tmp_path):
    moon = tmp_path / "m.jsonl"
    moon.write_text(
        json.dumps({"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 2]}) + "\n"
        + json.dumps({"timestamp": 0, "input_length": 512, "output_length": 3, "hash_ids": [0]}) + "\n"
    )  # fmt: skip
    fmt, reqs = load_trace(moon)
    assert fmt == "mooncake" and [r.arrival_s for r in reqs] == [0.0, 1.5] and reqs[1].hash_ids == (0, 2)
    az = tmp_path / "a.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                  "2023-11-16 18:15:50.9951690,396,109\n")  # fmt: skip
    fmt, reqs = load_trace(az)
    assert fmt == "azure" and reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-5) and reqs[0].hash_ids is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trace(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(tmp_path / "none.jsonl")


def test_the_vendored_azure_trace_loads():
    fmt, reqs = load_trace(TRACES / "azure2023_conv.csv")
    assert fmt == "azure" and len(reqs) == 19366 and reqs[0].arrival_s == 0.0


def _stream(start, ttft, e2e, tokens):
    return RequestResult(tag="", ok=True, start_s=start, ttft_s=ttft, e2e_s=e2e, output_tokens=tokens)


def test_decode_per_user_and_per_node_agree_in_lockstep():
    # 4 streams, 101 tokens, 1 s of decode each, all in the same window: 100 tok/s per user, 400 per node.
    run = summarize_run(4, [_stream(0.0, 0.1, 1.1, 101) for _ in range(4)], nodes=1)
    assert run.per_user_tok_s == pytest.approx(100.0)
    assert run.per_node_tok_s == pytest.approx(400.0)
    assert run.per_node_from_users_tok_s == pytest.approx(400.0)
    # Two nodes behind the URL halve the per-node figure; staggered streams widen the window.
    assert summarize_run(4, [_stream(0.0, 0.1, 1.1, 101)] * 4, nodes=2).per_node_tok_s == pytest.approx(200.0)
    staggered = summarize_run(2, [_stream(0.0, 0.1, 1.1, 101), _stream(0.5, 0.1, 1.1, 101)], nodes=1)
    assert staggered.per_node_tok_s == pytest.approx(200 / 1.5)


def test_text_of_tokens_hits_the_target_with_an_exact_counter_and_comes_close_with_a_ratio():
    import asyncio
    import random

    from zoe_cluster.bench.prompts import RatioTokenCounter, SimTokenCounter, text_of_tokens
    from zoe_cluster.sim.tokens import count_text_tokens

    exact = SimTokenCounter()
    for target in (1, 100, 5000):
        text = asyncio.run(text_of_tokens(random.Random(target), target, exact))
        assert abs(count_text_tokens(text) - target) <= 1
    # A ratio calibrated 10% off lands 10% off, in one pass (no server round trips).
    text = asyncio.run(text_of_tokens(random.Random(0), 4000, RatioTokenCounter(0.25 * 1.1)))
    assert count_text_tokens(text) == pytest.approx(4000 / 1.1, rel=0.02)
    # Fresh draws: two texts of the same length share no prefix block.
    a = asyncio.run(text_of_tokens(random.Random(1), 64, exact))
    b = asyncio.run(text_of_tokens(random.Random(2), 64, exact))
    assert a[:64] != b[:64]


def _report(kind, rows, label):
    from zoe_cluster.bench.report import BenchReport, ServerInfo

    return BenchReport(kind=kind, label=label, command="zoe bench", created_at="t", versions={},
                       server=ServerInfo(url="u", model="m"), config={}, rows=rows)  # fmt: skip


def test_compare_orients_speedup_by_metric_and_lists_unmatched_cells():
    from zoe_cluster.bench.compare import compare_reports

    def row(c, user, node):
        return {"concurrency": c, "per_user_tok_s": {"mean": user, "std": 1.0}, "per_node_tok_s": {"mean": node}}

    a = _report("decode", [row(1, 50.0, 50.0), row(2, 45.0, 90.0)], "A")
    b = _report("decode", [row(1, 60.0, 60.0), row(4, 40.0, 160.0)], "B")
    cells, unmatched = compare_reports(a, b)
    assert [(c["cell"], c["metric"]) for c in cells] == [("C=1", "per_user_tok_s"), ("C=1", "per_node_tok_s")]
    assert cells[0]["ratio"] == pytest.approx(1.2) and cells[0]["speedup"] == pytest.approx(1.2)  # higher is better
    assert unmatched == ["C=2 (only in A)", "C=4 (only in B)"]
    with pytest.raises(ValueError, match="cannot compare"):
        compare_reports(a, _report("prefill", [], "P"))
