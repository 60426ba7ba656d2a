"""Importing `zoe_kernels.aot` changes no environment; its compile path sets Triton's compiled mode only while it
runs (`aot.compile_environment`), so a process running interpreted (TRITON_INTERPRET=1) can import it, compile
a kernel for gfx950, and keep its own settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os
before = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
import zoe_kernels.aot as aot
imported = {k: os.environ.get(k) for k in before}
with aot.compile_environment():
    with aot.compile_environment():  # nests
        pass
    inside = {k: os.environ.get(k) for k in before}
after_block = {k: os.environ.get(k) for k in before}
specs, _ = aot.collect(["gfx950"], only="moe-forced gemv fp8 M=1")
rows = aot.compile_all(specs[:1], jobs=1)
print(json.dumps({"before": before, "imported": imported, "inside": inside, "after_block": after_block,
                  "after_compile": {k: os.environ.get(k) for k in before},
                  "rows": [{"ok": r["ok"], "error": r["error"], "kernel": r["kernel"]} for r in rows]}))
"""


def _run(extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600,
                          env={**env, **extra})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.kernels
def test_an_interpreted_process_imports_aot_compiles_and_keeps_its_environment():
    out = _run({"TRITON_INTERPRET": "1"})
    mine = {"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": None}
    assert out["before"] == out["imported"] == out["after_block"] == out["after_compile"] == mine
    assert out["inside"] == {"TRITON_INTERPRET": None, "TRITON_DEFAULT_FP_FUSION": "1"}
    (row,) = out["rows"]  # the kernels were first imported inside the block: compiled, not interpreted
    assert row["ok"], row


def test_an_explicit_fp_fusion_setting_wins_inside_the_block():
    from zoe_kernels.aot import compile_environment

    saved = os.environ.get("TRITON_DEFAULT_FP_FUSION")
    os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
    try:
        with compile_environment():
            assert os.environ["TRITON_DEFAULT_FP_FUSION"] == "0"
        assert os.environ["TRITON_DEFAULT_FP_FUSION"] == "0"
    finally:
        if saved is None:
            os.environ.pop("TRITON_DEFAULT_FP_FUSION")
        else:
            os.environ["TRITON_DEFAULT_FP_FUSION"] = saved


def test_a_process_that_imported_triton_interpreted_gets_a_clear_error():
    code = ("import triton, zoe_kernels.aot as aot\n"
            "try:\n    aot.collect(['gfx950'], only='moe-forced gemv fp8 M=1')\n"
            "except RuntimeError as e:\n    print(e)\n")  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "triton.language.standard was imported under TRITON_INTERPRET=1" in proc.stdout
