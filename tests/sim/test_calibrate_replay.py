"""Calibration from recipe profiles, and replay behind the router's policies on the virtual clock."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.calibrate import CalibrationError, calibrate
from tests.conftest import TRACES
from zoe_cluster.sim.replay import SimReplayConfig, TraceError, load_mooncake, replay, rows_from

MOONCAKE = TRACES / "mooncake_conversation_trace.jsonl"


@pytest.fixture(scope="module")
def reg():
    return RecipeRegistry.default()


def test_every_recipe_variant_calibrates(reg):
    for r in reg.all():
        for v in r.variants:
            cal = calibrate(r, v)
            m = cal.model
            assert m.decode_step_s(1) > 0.005 and m.prefill_per_token_s > 0, (r.name, v)
            assert "decode" in cal.sources and "prefill" in cal.sources


def test_estimates_are_marked(reg):
    # DeepSeek-V4-Pro has no TTFT table and no batch decode: prefill and batch growth are estimates
    cal = calibrate(reg.get("deepseek-v4-pro"), "fp8-tp8")
    assert "prefill_per_token_s" in cal.estimates and "decode_per_expert_s" in cal.estimates
    # its context fit: the baseline top-K slows decode with context more than zoe's kernel (seed table A3)
    zoe = calibrate(reg.get("deepseek-v4-pro"), "fp8-tp8-zoe")
    assert cal.model.context_per_token_s > 3 * zoe.model.context_per_token_s
    assert calibrate(reg.get("glm-5.3"), "fp8-tp8").estimates == []


def test_fit_error_on_own_points_is_small(reg):
    cal = calibrate(reg.get("glm-5.3"), "fp8-tp8-mtp")
    assert cal.fit_error_pct["decode_max"] < 8
    assert 2.5 < cal.model.spec_accepted_tokens < 3.2  # fitted next to the MTP-off points


def test_no_measurements_is_an_error(reg):
    r = reg.get("glm-5.3")
    with pytest.raises(CalibrationError):
        calibrate(r, "fp8-tp8-nightly", decode_keep=lambda name, p: False)


def _conversation_rows(n_sessions=41, turns=4, gap_s=2.0):
    rows, nid = [], 10_000
    for s in range(n_sessions):
        ids = [0]
        for t in range(turns):
            ids = ids + list(range(nid, nid + 6))
            nid += 6
            rows.append((s * 0.3 + t * gap_s * 10, len(ids) * 512, 64, tuple(ids)))
    return rows_from(rows)


def test_replay_is_deterministic_and_prefix_policy_finds_more_hits(reg):
    r = reg.get("glm-5.3")
    rows = _conversation_rows()
    a = replay(SimReplayConfig(r, "fp8-tp8-zoe", 4, "prefix"), rows)
    b = replay(SimReplayConfig(r, "fp8-tp8-zoe", 4, "prefix"), rows)
    rr = replay(SimReplayConfig(r, "fp8-tp8-zoe", 4, "round_robin"), rows)
    da, db = a.to_dict(), b.to_dict()
    da.pop("wall_s"), db.pop("wall_s")
    assert da == db
    assert a.completed == a.requests == len(rows) and a.dropped == 0
    assert a.prefix_hit_rate > rr.prefix_hit_rate + 0.2
    assert a.ttft_p50_s < rr.ttft_p50_s


def test_replay_drops_requests_that_never_fit(reg):
    r = reg.get("glm-5.3")
    rows = rows_from([(0.0, 4096, 8, tuple(range(8))), (0.1, 200_000, 8, tuple(range(100, 500)))])
    res = replay(SimReplayConfig(r, "fp8-tp8", 1, "round_robin", kv_tokens=65536), rows)
    assert res.completed == 1 and res.dropped == 1


def test_bad_trace_names_the_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match=r"t.jsonl:2"):
        load_mooncake(p)


@pytest.mark.slow
def test_full_mooncake_trace_with_8_replicas_under_a_minute(reg):
    r = reg.get("glm-5.3")
    t0 = time.perf_counter()
    rows = load_mooncake(MOONCAKE)
    res = replay(SimReplayConfig(r, "fp8-tp8-zoe", 8, "prefix"), rows)
    wall = time.perf_counter() - t0
    assert res.requests == 12031 and res.completed + res.dropped == 12031
    assert wall < 60
    assert 0.2 < res.prefix_hit_rate < 0.366  # the trace's reusable share is 36.6% (traces/README.md)
    json.dumps(res.to_dict())
