"""`zoe sim replay --profile`: a trace and agentic sessions replayed on the engine a `zoe sim calibrate --url` profile
measured (its step model, KV capacity, scheduler limits), exactly as `sim.replay.replay` runs it in-process; a bad
profile exits naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from zoe_cluster.cli.main import app
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.engine_calibration import (
    MEASURED_VARIANT,
    EngineProfile,
    MeasuredScheduler,
    load_engine_profile,
    write_engine_profile,
)
from zoe_cluster.sim.replay import RowSource, SimReplayConfig, load_mooncake, replay

runner = CliRunner()
SESSIONS = Path(__file__).parents[1] / "agentic" / "data"
BLOCK = 64
KV_TOKENS = 4096


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory) -> Path:
    """A complete profile file: the measurements are glm-5.3 fp8-tp8's seed profile, the scheduler a small engine
    (64-token blocks, 4096 tokens of KV) so that the measured capacity visibly changes what gets served."""
    measured = RecipeRegistry.default().get("glm-5.3").variant("fp8-tp8").profile
    prof = EngineProfile(
        complete=True, engine="vllm", engine_version="test", url="http://127.0.0.1:1", model="glm",
        measured_at="2026-12-02T00:00:00+00:00", wall_s=1.0, routed_experts=256, experts_per_token=8, profile=measured,
        scheduler=MeasuredScheduler(block_tokens=BLOCK, kv_tokens=KV_TOKENS, max_num_batched_tokens=2048,
                                    max_num_seqs=16, max_model_len=2048),
    )
    return write_engine_profile(prof, tmp_path_factory.mktemp("profile") / "engine.yaml")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """Mooncake-format rows whose hash ids are 64-token blocks; the last prompt cannot fit 4096 tokens of KV."""
    rows = [{"timestamp": 100 * i, "input_length": 1000 + 64 * (i % 4), "output_length": 40,
             "hash_ids": [1, 2, 3, *range(100 + 20 * i, 100 + 20 * i + 13)]} for i in range(12)]
    rows.append({"timestamp": 1300, "input_length": 5000, "output_length": 8, "hash_ids": list(range(900, 979))})
    p = tmp_path_factory.mktemp("trace") / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_trace_replay_on_a_profile_is_the_in_process_replay_of_it(profile_path, trace) -> None:
    res = runner.invoke(app, ["sim", "replay", str(trace), "--profile", str(profile_path), "--replicas", "2",
                              "--block-tokens", str(BLOCK), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    prof = load_engine_profile(profile_path)
    config = SimReplayConfig(prof.recipe(), MEASURED_VARIANT, 2, "prefix", calibration=prof.calibration(),
                             kv_tokens=prof.scheduler.kv_tokens)
    want = replay(config, RowSource(load_mooncake(trace), BLOCK)).to_dict()
    got.pop("wall_s"), want.pop("wall_s")
    assert got == json.loads(json.dumps(want))
    assert got["variant"] == MEASURED_VARIANT and got["completed"] == 12
    assert got["dropped"] == 1  # 5000 prompt tokens never fit the measured 4096 tokens of KV
    # the same trace on the recipe the measurements came from serves every request
    res = runner.invoke(app, ["sim", "replay", str(trace), "--model", "glm-5.3", "--variant", "fp8-tp8",
                              "--replicas", "2", "--block-tokens", str(BLOCK), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["dropped"] == 0


def test_sessions_replay_on_a_profile(profile_path) -> None:
    res = runner.invoke(app, ["sim", "replay", str(SESSIONS), "--sessions", "2", "--profile", str(profile_path),
                              "--block-tokens", str(BLOCK), "--max-output-tokens", "256", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["variant"] == MEASURED_VARIANT and rep["model"] == "measured-engine"
    assert rep["clock"] == "virtual" and rep["dropped"] == 0 and rep["completed"] == rep["requests"] > 0


def test_a_bad_profile_names_the_file_and_field(profile_path, trace, tmp_path) -> None:
    def run(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, ["sim", "replay", str(trace), *args])

    missing = tmp_path / "nope.yaml"
    res = run("--profile", str(missing))
    assert res.exit_code == 2 and "nope.yaml: cannot read" in res.output
    data = yaml.safe_load(profile_path.read_text())
    data["scheduler"]["kv_tokens"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    res = run("--profile", str(bad))
    assert res.exit_code == 2 and "bad.yaml: field scheduler.kv_tokens" in res.output
    data = yaml.safe_load(profile_path.read_text())
    data.update(complete=False, error="decode sweep failed")
    bad.write_text(yaml.safe_dump(data))
    res = run("--profile", str(bad))
    assert res.exit_code == 2 and "an incomplete calibration (decode sweep failed)" in res.output
    res = run("--profile", str(profile_path), "--model", "glm-5.3")
    assert res.exit_code == 2 and "leave out --model" in res.output
    res = run()
    assert res.exit_code == 2 and "--profile" in res.output
