"""The plugin's support table: its own consistency, and the command that writes and checks zoe_cluster's copy."""

from __future__ import annotations

import json
import subprocess
import sys

from zoe_kernels.integrations import support
from zoe_kernels.integrations.support import GAPS, SUPPORT, in_range, main, ranges


def test_verified_ranges_and_gaps_never_overlap():
    for gap in GAPS:
        for p in gap.platforms:
            for r in ranges(gap.kernel, gap.engine, p):
                assert not in_range(r[0], gap.versions) and not in_range(gap.versions[0], r), (gap, r)


def test_every_entry_names_known_kernels_engines_and_platforms():
    for e in (*SUPPORT, *GAPS):
        assert e.kernel in support.KERNELS and e.engine in support.ENGINES
        assert set(e.platforms) <= set(support.PLATFORMS)
        assert support.release(e.versions[0]) < support.release(e.versions[1])


def test_write_then_check_and_a_stale_copy_names_its_file(tmp_path, capsys):
    copy = tmp_path / "kernel_support.json"
    assert main(["--write", str(copy)]) == 0
    topk_rocm = json.loads(copy.read_text())["kernels"]["csa_topk"]["sglang"]["rocm"]
    assert topk_rocm == [["0.5.19", "0.5.20"], ["0.5.23", "0.5.24"]]
    assert main(["--check", str(copy)]) == 0
    copy.write_text(copy.read_text().replace("0.5.19", "0.5.18"))
    assert main(["--check", str(copy)]) == 1
    assert f"{copy} is out of date" in capsys.readouterr().err


def test_the_table_imports_without_torch():
    code = "import sys, zoe_kernels.integrations.support; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
