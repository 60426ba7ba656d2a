"""Builds bench/kernels/results/sparse_results.json from the H200 runs whose code is what the repository runs now.

Each op's rows come from the last run that measured its current code (every row keeps its run and commit):
- CSA top-K: run 9 (commit 8d92c90, sparse_sweep.py: run 8's default, the finish's band search and
  programmatic dependent launches side by side; the default since then takes pdl at B=1, so run 9's "pdl"
  rows are the default there and its "default" rows run 8's), plus run 8's radix fallback (unchanged);
- dual-scope decode: run 8 (commit d955c1f: 64-entry decode tiles);
  earlier kernels for comparison: run 5's top-K default (commit 6c9d14e, every search step paid), run 4's
  decode default (commit 8cef3bc, 32-entry tiles, 3 splits at B=64), run 3's decode kernel (one loop, a
  branch around the loads) at run 1's configuration, and run 1's top-K (commit de0a532, radix select over
  32 programs per row and a merge);
- DSA indexer logits: run 4 (commit 8cef3bc);
- DSA indexer top-2048: run 3 (commit 16cdafd, one-bit search). Run 4 timed the 16-way search (reverted);
  the current code does less work than run 3's on rows of <= 16384 keys (the exact threshold is reused,
  and since run 8 the searches stop at the first bound exactly k entries reach).
Runs 6 and 7 were sweeps (sparse_sweep.py, sparse_sweep_run6/7.json), not assembled here.

Usage: python bench/kernels/sparse_assemble.py  (then python bench/kernels/sparse_plot.py)
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = {1: ("sparse_results_run1.json", "de0a532"), 3: ("sparse_results_run3.json", "16cdafd"), 4: ("sparse_results_run4.json", "8cef3bc"),
        5: ("sparse_results_run5.json", "6c9d14e"), 8: ("sparse_results_run8.json", "d955c1f"),
        9: ("sparse_results_run9.json", "8d92c90")}
SOURCE = {"csa_topk": 9, "csa_dual_scope_decode": 8, "dsa_indexer": 4, "dsa_indexer_topk2048": 3}
RENAME = {"zoe BH=32 DV=512 BKV=32": "zoe BH=32 DV=512 BKV=32 (default from B=8)",  # run 4's labels
          "zoe default BH=64 DV=256 BKV=64": "zoe BH=64 DV=256 BKV=64",
          "zoe run 1 defaults": "zoe run 1 config, current kernel (default below B=8)",
          "zoe radix (run 1)": "zoe radix fallback, one program per row",
          "zoe sample (default)": "zoe sample tile=2048 warps=4"}  # the default is "auto" since run 5
# earlier code, for comparison: (run, op, provider there, provider here)
PREVIOUS = [(3, "csa_dual_scope_decode", "zoe run 1 defaults", "zoe previous kernel (run 3), run 1 config"),
            (4, "csa_dual_scope_decode", "zoe BH=32 DV=512 BKV=32", "zoe run 4 default (32-entry tiles)"),
            (5, "csa_topk", "zoe sample (default)", "zoe run 5 default (every search step paid)"),
            (8, "csa_topk", "zoe radix fallback, one program per row", "zoe radix fallback, one program per row")]


def _run9_topk_provider(provider: str, shape: str) -> str:
    """Run 9's variant names as the code runs them now: pdl is the default for one row of > 4096 entries."""
    pdl_default = shape.startswith("B=1 ") and not shape.startswith("B=1 N=4096")
    if provider == "zoe default":
        return "zoe run 8 default (no pdl)" if pdl_default else "zoe auto (default)"
    if provider == "zoe pdl" and pdl_default:
        return "zoe auto (default: pdl)"
    return provider


def main() -> None:
    loaded = {run: json.loads((RESULTS / name).read_text()) for run, (name, _) in RUNS.items()}
    rows = []
    for op, run in SOURCE.items():
        for row in loaded[run]["rows"]:
            if row.get("op") == op:
                row = dict(row, run=run, commit=RUNS[run][1])
                row["provider"] = RENAME.get(row["provider"], row["provider"])
                if run == 9 and op == "csa_topk":
                    row["provider"] = _run9_topk_provider(row["provider"], row["shape"])
                rows.append(row)
    for run, op, old_name, new_name in PREVIOUS:
        for row in loaded[run]["rows"]:
            if row.get("op") == op and row["provider"] == old_name:
                rows.append(dict(row, provider=new_name, run=run, commit=RUNS[run][1]))
    # run 1's top-K (radix select, 32 programs per row + merge), the method this session replaced
    for row in loaded[1]["rows"]:
        if row.get("op") == "csa_topk" and "radix_bits" in row.get("config", ""):
            rows.append(dict(row, provider="zoe run 1 radix split + merge", run=1, commit=RUNS[1][1]))
    meta = dict(loaded[4]["meta"])
    meta.update(command="python bench/kernels/sparse_bench.py --out $OUT --skip-tests (runs 1, 3, 4; run 5: "
                        "--sections topk; run 8: --sections topk,decode; run 9: "
                        "python bench/kernels/sparse_sweep.py --sections topk), assembled by "
                        "python bench/kernels/sparse_assemble.py",
                runs={run: {"file": name, "commit": commit, "started": loaded[run]["meta"].get("started"),
                            "copy_tbps": loaded[run]["meta"].get("copy_tbps"),
                            "fp8_tflops": loaded[run]["meta"].get("fp8_tflops")}
                      for run, (name, commit) in RUNS.items()},
                sources={op: run for op, run in SOURCE.items()})
    (RESULTS / "sparse_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(RESULTS / "sparse_results.json", len(rows), "rows")


if __name__ == "__main__":
    main()
