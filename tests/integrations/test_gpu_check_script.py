"""The GPU check script runs (its stand-in driver, on the CPU through Triton's interpreter), so the GPU run
does not fail on plumbing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.kernels
def test_integration_gpu_check_smoke_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench/kernels/integration_gpu_check.py"), "--device", "cpu", "--ms", "1,300",
         "--shapes", "tiny", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["failures"] == 0
    assert len(result["rows"]) == 4  # bf16 and fp8 at M=1 and M=300
    # each row took the path the crossover table names for the CPU (a failure otherwise)
    assert all(r["path"] == r["expected_path"] for r in result["rows"])
