"""The zoe SGLang hook against the installed sglang 0.5.23 (a --no-deps install: its CUDA-only packages
are missing, so modules that import them cannot load here; what can be checked here is checked)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("_sglang_probe.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sglang


def _probe(sglang_python: str, *args: str, env: dict | None = None) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZOE_KERNELS")}
    proc = subprocess.run(
        [sglang_python, str(PROBE), *args], capture_output=True, text=True, timeout=300, env={**base, **(env or {})},
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_sglang_runs_the_hook_through_its_plugin_entry_point(sglang_python, tmp_path):
    out, log = _probe(sglang_python, "plugins", str(tmp_path))
    assert out["scheduler_loads_plugins"]  # so the hook runs in SGLang's worker processes too
    (rep,) = out["reports"]
    assert rep["engine"] == "sglang" and rep["engine_version"] == "0.5.23"
    fb = {f["kernel"]: f for f in rep["fallbacks"]}
    assert fb["csa_dual_scope"]["reason"] == "unsupported"
    assert "FALLBACK: csa_dual_scope" in log
    if "csa_topk" in fb:  # this venv lacks SGLang's CUDA packages, so the DSv4 indexer cannot be imported
        assert fb["csa_topk"]["reason"] == "missing_target", fb["csa_topk"]
        assert "cannot import sglang.srt.layers.attention.dsv4.indexer" in fb["csa_topk"]["detail"]
    else:
        assert "csa_topk" in rep["patched"]


def test_replaced_functions_have_the_expected_parameters_in_sglang_0_5_23(sglang_python):
    out, _ = _probe(sglang_python, "sources")
    assert out["version"] == "0.5.23"
    assert out["v1"] == out["expected_v1"]
    assert out["v2"] == out["expected_v2"]


@pytest.mark.kernels
def test_zoe_paged_topk_matches_sglangs_own_transform(sglang_python):
    out, _ = _probe(sglang_python, "topk", env={"TRITON_INTERPRET": "1"})
    assert out["mismatches"] == []
    assert out["selected"] == 64 + 40 + 64 + 0 + 64  # rows shorter than k keep every entry
