"""The agentic workload of bench/sim/validate_vllm.py: sessions scaled to the tiny model keep their shared prefixes,
the live side sends exactly the token ids the twin replays, and the twin side runs on a calibrated profile."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "sim" / "validate_vllm.py"
PROFILE = REPO / "bench" / "sim" / "calibration_vllm_cpu.yaml"


@pytest.fixture(scope="module")
def vv():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("validate_vllm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["validate_vllm"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _session(tmp_path: Path) -> Path:
    ids = list(range(1000, 1096))
    doc = {"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": 0, "type": "s", "in": 64 * 64 + 10, "out": 80, "hash_ids": ids[:64]},
        {"t": 5, "type": "s", "in": 64 * 96, "out": 800, "hash_ids": ids, "think_time": 40.0},
        {"type": "subagent", "agent_id": "a", "requests": [
            {"t": 6, "type": "n", "in": 64 * 40, "out": 8, "hash_ids": list(range(5000, 5040))}]},
    ]}
    d = tmp_path / "sessions"
    d.mkdir()
    (d / "s.json").write_text(json.dumps(doc))
    return d


def test_scaling_keeps_shared_prefixes_and_counts(vv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scale = vv.AgenticScale(output_scale=8.0, max_output_tokens=64, think_scale=0.05)
    (s,) = scale.sessions(_session(tmp_path))
    first, second, sub = s.items
    assert s.block_size == 32
    assert (first.input_tokens, second.input_tokens) == (64, 96)  # one token per 64-token trace block
    assert len(first.hash_ids) == 2 and len(second.hash_ids) == 3  # 32 trace ids per engine block
    assert second.hash_ids[:2] == first.hash_ids  # the second prompt still extends the first
    assert second.hash_ids[2] not in first.hash_ids
    assert (first.output_tokens, second.output_tokens) == (10, 100)
    assert second.think_time_s == pytest.approx(2.0)
    assert sub.items[0].input_tokens == 40 and len(sub.items[0].hash_ids) == 1


def test_live_prompts_are_the_twins_token_ids(vv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scale = vv.AgenticScale()
    sessions = scale.sessions(_session(tmp_path))
    drivers = [scale.driver(sessions, 1, 2048, salt, vv.TokenIdDriver) for salt in (7, 7, 8)]
    prompts = []
    for d in drivers:
        d.start(0.0)
        (call,) = d.due(0.0)
        d.finished(call, 1.0)
        (nxt,) = d.due(10.0)
        p1, p2 = call.prompt(), nxt.prompt()
        assert len(p1) == call.input_tokens == 64 and len(p2) == nxt.input_tokens == 96
        assert p2[:64] == p1  # two full engine blocks shared: what vLLM's prefix cache hits
        prompts.append(p1)
    assert prompts[0] == prompts[1] and prompts[0] != prompts[2]  # a fresh salt never hits an earlier run


def test_twin_side_runs_on_the_calibrated_profile(vv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prof = vv.load_engine_profile(PROFILE)
    cal = prof.calibration()
    scale = vv.AgenticScale()
    twin = vv.twin_agentic(prof, cal, scale.driver(scale.sessions(_session(tmp_path)), 1, 2048, 0))
    assert twin["completed"] == 3
    # 64 of the second prompt's 96 tokens were the first prompt's full blocks
    assert twin["prefix_hit_rate"] == pytest.approx(64 / (64 + 96 + 40))
    assert 0 < twin["engine_ttft_mean_s"] < twin["ttft_p90_s"]
