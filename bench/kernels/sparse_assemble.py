"""Builds bench/kernels/results/sparse_results.json from the H200 runs whose code is what the repository runs now.

Each op's rows come from the last run that measured its current code (every row keeps its run and commit):
- CSA top-K: run 5 (commit 6c9d14e, one-bit search, 2048-entry split programs);
- dual-scope decode and DSA indexer logits: run 4 (commit 8cef3bc; the decode kernel is unchanged since, only
  its default configuration moved to run 4's fastest, "BH=32 DV=512 BKV=32"), plus run 3's rows of the
  previous decode kernel (one loop, a branch around the loads) at run 1's configuration;
- CSA top-K of run 1 (commit de0a532, sparse_results_run1.json: radix select over 32 programs per row and a
  merge), the method the current one replaced;
- DSA indexer top-2048: run 3 (commit 16cdafd, one-bit search). Run 4 timed the 16-way search (reverted);
  the current code does less work than run 3's on rows of <= 16384 keys (the exact threshold is reused).

Usage: python bench/kernels/sparse_assemble.py  (then python bench/kernels/sparse_plot.py)
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = {1: ("sparse_results_run1.json", "de0a532"), 3: ("sparse_results_run3.json", "16cdafd"), 4: ("sparse_results_run4.json", "8cef3bc"),
        5: ("sparse_results_run5.json", "6c9d14e")}
SOURCE = {"csa_topk": 5, "csa_dual_scope_decode": 4, "dsa_indexer": 4, "dsa_indexer_topk2048": 3}
RENAME = {"zoe BH=32 DV=512 BKV=32": "zoe BH=32 DV=512 BKV=32 (default from B=8)",  # run 4's labels
          "zoe default BH=64 DV=256 BKV=64": "zoe BH=64 DV=256 BKV=64",
          "zoe run 1 defaults": "zoe run 1 config, current kernel (default below B=8)",
          "zoe radix (run 1)": "zoe radix fallback, one program per row",
          "zoe sample (default)": "zoe sample tile=2048 warps=4"}  # the default is "auto" since run 5
# the decode kernel before run 4 (one loop with a branch around the loads), measured in run 3 with run 1's config
PREVIOUS_DECODE = (3, "zoe run 1 defaults", "zoe previous kernel (run 3), run 1 config")


def main() -> None:
    loaded = {run: json.loads((RESULTS / name).read_text()) for run, (name, _) in RUNS.items()}
    rows = []
    for op, run in SOURCE.items():
        for row in loaded[run]["rows"]:
            if row.get("op") == op:
                row = dict(row, run=run, commit=RUNS[run][1])
                row["provider"] = RENAME.get(row["provider"], row["provider"])
                rows.append(row)
    run, old_name, new_name = PREVIOUS_DECODE
    for row in loaded[run]["rows"]:
        if row.get("op") == "csa_dual_scope_decode" and row["provider"] == old_name:
            rows.append(dict(row, provider=new_name, run=run, commit=RUNS[run][1]))
    # run 1's top-K (radix select, 32 programs per row + merge), the method this session replaced
    for row in loaded[1]["rows"]:
        if row.get("op") == "csa_topk" and "radix_bits" in row.get("config", ""):
            rows.append(dict(row, provider="zoe run 1 radix split + merge", run=1, commit=RUNS[1][1]))
    meta = dict(loaded[4]["meta"])
    meta.update(command="python bench/kernels/sparse_bench.py --out $OUT --skip-tests (runs 1, 3, 4; run 5: "
                        "--sections topk), assembled by python bench/kernels/sparse_assemble.py",
                runs={run: {"file": name, "commit": commit, "started": loaded[run]["meta"].get("started"),
                            "copy_tbps": loaded[run]["meta"].get("copy_tbps"),
                            "fp8_tflops": loaded[run]["meta"].get("fp8_tflops")}
                      for run, (name, commit) in RUNS.items()},
                sources={op: run for op, run in SOURCE.items()})
    (RESULTS / "sparse_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(RESULTS / "sparse_results.json", len(rows), "rows")


if __name__ == "__main__":
    main()
