"""Every engine release in the plugin's support table, checked against that release's real modules: each patch
target exists with exactly the parameters its wrapper was written for, and where the table says a kernel is not
supported, the target really is missing or different there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.integrations.engine_envs import RELEASES, SGLANG_RELEASES, VLLM_RELEASES, engine_env
from zoe_kernels.integrations.support import GAPS, SUPPORT, in_range

PROBE = Path(__file__).with_name("_targets_probe.py")
REPO = Path(__file__).resolve().parents[2]


def _targets(engine: str, release: str) -> dict:
    python, env = engine_env(engine, release)
    proc = subprocess.run([python, str(PROBE), engine], capture_output=True, text=True, timeout=300, env=env,
                          cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_verified_release_has_a_test_environment():
    for entry in SUPPORT:
        assert (entry.engine, entry.versions[0]) in RELEASES, f"{entry}: no test environment runs that release"


def _check(out: dict, engine: str, release: str) -> None:
    assert out["version"].split("+")[0] == release
    rows = out["rows"]
    verified = {(e.kernel, p) for e in SUPPORT if e.engine == engine and in_range(release, e.versions)
                for p in e.platforms}  # fmt: skip
    assert {(r["kernel"], r["platform"]) for r in rows if r["verified_here"]} == verified
    for r in rows:
        if r["verified_here"]:  # the wrapper's parameters are the target's, exactly
            assert r["found"] == r["expected"], r
    for gap in GAPS:  # where the table says "not supported", the other releases' targets do not fit this one
        if gap.engine != engine or not in_range(release, gap.versions):
            continue
        for platform in gap.platforms:
            others = [r for r in rows if (r["kernel"], r["platform"]) == (gap.kernel, platform)]
            assert others and all(not r["verified_here"] for r in others), gap
            assert any(r["found"] != r["expected"] for r in others), f"{gap}: every target fits {release}: verify it"


@pytest.mark.vllm
@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_vllm_patch_targets_match_the_release(release):
    _check(_targets("vllm", release), "vllm", release)


@pytest.mark.sglang
@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_sglang_patch_targets_match_the_release(release):
    _check(_targets("sglang", release), "sglang", release)
