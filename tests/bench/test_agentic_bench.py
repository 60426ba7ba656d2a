"""bench/agentic: sweep.py reads the throughput ratio at equal p90 interactivity off two sweeps' curves; policies.py
runs the default variant with vLLM's long-prefill threshold and another image's scheduling rules, and sglang-router's
policy by its class; ttft_breakdown.py counts the requests the p90 TTFT target turns on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zoe_cluster.sim.core import LongPrefillCap, long_prefill_cap

AGENTIC = Path(__file__).resolve().parents[2] / "bench" / "agentic"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"agentic_{name}", AGENTIC / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sweep():
    return _load("sweep")


def test_policies_runs_the_default_variant_with_the_threshold_and_image_asked_for():
    policies = _load("policies")
    plain = policies.recipe_with_threshold("glm-5.3", 0)
    v = plain.variant(plain.default_variant)
    assert long_prefill_cap(v) == LongPrefillCap(0, cap_lone_request=True)  # the recipe's vLLM 0.29 image
    r = policies.recipe_with_threshold("glm-5.3", 2048, "vllm/vllm-openai-rocm:v0.32.0")
    assert long_prefill_cap(r.variant(r.default_variant)) == LongPrefillCap(2048, cap_lone_request=False)
    assert plain.variant(plain.default_variant).long_prefill_token_threshold == 0  # the registry's copy untouched


def _pts(*xy):
    return [{"live_sessions": 2 ** i, "tok_s_per_user_p90": x, "output_tok_s_per_gpu": y} for i, (x, y) in enumerate(xy)]


def test_throughput_is_interpolated_where_the_curve_crosses_the_level(sweep):
    pts = [(60.0, 1.0), (50.0, 4.0), (30.0, 8.0)]  # interactivity falls as concurrency and throughput rise
    assert sweep.throughput_at(pts, 55.0) == pytest.approx(2.5)
    assert sweep.throughput_at(pts, 40.0) == pytest.approx(6.0)
    assert sweep.throughput_at(pts, 70.0) is None  # never that interactive
    assert sweep.throughput_at(pts, 20.0) is None  # never pushed that far


def test_ratio_at_equal_interactivity_is_read_where_both_sweeps_reach(sweep):
    # prefix keeps 50 tok/s per user up to 8 tok/s per GPU, the other only up to 4
    series = {"prefix": _pts((60.0, 2.0), (50.0, 8.0), (20.0, 12.0)),
              "session_hash": _pts((60.0, 1.0), (50.0, 4.0), (40.0, 6.0))}
    rows = sweep.ratios(series, steps=2)["session_hash"]
    assert [r["tok_s_per_user_p90"] for r in rows] == [40.0, 50.0, 60.0]
    assert [r["ratio"] for r in rows] == pytest.approx([(8 + 4 * 10 / 30) / 6.0, 2.0, 2.0], abs=1e-3)


def test_policies_builds_sglang_cache_aware_by_its_class_with_its_options():
    from zoe_cluster.routing.policies import SglangCacheAwarePolicy

    policies = _load("policies")
    assert policies.policy_arguments("prefix", {"hit_weight": 2.0}) == ("prefix", {"hit_weight": 2.0})
    factory, options = policies.policy_arguments("sglang_cache_aware", {"cache_threshold": 0.5})
    built = factory()
    assert options is None and isinstance(built, SglangCacheAwarePolicy) and built.config.cache_threshold == 0.5


def _row(floor, ttft, **parts):
    comp = dict.fromkeys(("miss_s", "chunking_s", "wait_s", "with_decodes_s", "with_prefills_s"), 0.0)
    comp.update(parts)
    return {"floor_s": floor, "ttft_s": ttft, "floor_with_hits_s": floor, "alone_s": floor,
            "alone_with_decodes_s": floor, "no_wait_s": ttft - comp["wait_s"], "reason": "session", **comp}


def test_breakdown_counts_the_requests_pushed_over_1_1x_the_floor_p90():
    breakdown = _load("ttft_breakdown")
    # floors 0.1 .. 1.0 s: p90 0.91, limit 1.001; one floor (1.0) is under it, so the allowance is 10%
    rows = [_row(0.1 * k, 0.1 * k) for k in range(1, 11)]
    rows[0] = _row(0.1, 1.2, with_prefills_s=1.0, wait_s=0.1)  # pushed over, mostly by another prefill
    rows[1] = _row(0.2, 0.9, miss_s=0.7)  # slower, not over the limit
    s = breakdown.summary(rows)
    assert s["limit_s"] == pytest.approx(1.1 * 0.91) and s["share_floor_over_limit"] == 0.0
    assert s["allowance"] == pytest.approx(0.1) and s["share_pushed_over_limit"] == pytest.approx(0.1)
    assert s["pushed"]["largest_component"] == {"with_prefills_s": 1}
    without = s["pushed"]["under_limit_without"]
    assert without["with_prefills_s"] == 1 and without["wait_s"] == 0
