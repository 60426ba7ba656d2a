"""Builds bench/kernels/results/sparse_results.json from the H200 runs whose code is what the repository runs now.

Each op's rows come from the last run that measured its current code (every row keeps its run and commit):
- CSA top-K: every shape from run24-topk (round 7: FINISH_PTX_STORE, PACKED_HIST_START, FINISH_EARLY_THRESH and the
  dependent threshold launch at one row; the first timing at the 1M shapes), with run 23's default (those off) timed
  beside it. The exact default was timed at B=1 x 1M only ("no reset first" there: the run's "default" also had
  RESET_FIRST, removed since as slower); the other shapes' rows are that "default" (at B=32 "no pdl threshold", as
  the dependent threshold launch is one row only now), so with RESET_FIRST, which their provider names say. From
  run23-topk run 22's default (PAIR_BITS = 1, two gathers, the finish launched); from run22-topk (commit e26660f:
  PAIR_SEARCH, FINISH_EARLY_LOADS and SPECULATIVE_SAMPLE) run 20's default (those three off) and, at the 1M shapes, the pair search alone; what HALF_SCAN and pdl from 32 rows replaced as timed in run19-topk;
  run 17-topk's "int keys" (run 16's default) at B=8 and B=32; run 14's default (16-byte loads, the search from
  the threshold, placement through L2) as timed in run15-topk beside run 16's default's first version; run
  14-topk's 4-byte loads (run 12's default) and run 12-topk's 2048-entry tiles at 8 and 32 rows; run 9's rows of
  run 8's default without pdl at B=1, plus run 8's radix fallback (unchanged); runs 10-23-topk's other variants
  stay in their raw JSON;
- dual-scope decode: per batch, the run that timed today's default (run16-decode for B = 1, run42-decode
  for B = 8, 16, 32 and run43-decode for B = 64, 128, where the default was not the first timing of its batch:
  the one-pass Gluon kernel on the H200; sparse_decode_sweep.py, raw files in results/raw/), with the defaults
  it replaced (run 16: runs 11-13's defaults; runs 42-43: the Gluon two passes of run 25, and the one-pass Triton
  kernel of runs 15-16, the default off Hopper below B=32, timed beside it; run 33's one pass on 32-entry tiles,
  from that run);
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
        9: ("sparse_results_run9.json", "8d92c90"), 11: ("raw/sparse_run11-decode_sparse_results.json", "c8b2916"),
        13: ("raw/sparse_run13-decode_sparse_results.json", "5c77fb3"),
        16: ("raw/sparse_run16-decode_sparse_results.json", "ef71511 + 7681136's synchronize"),
        21: ("raw/sparse_run21-decode_sparse_results.json", "d371f3a"),
        33: ("raw/sparse_run33-decode_sparse_results.json", "eb55551"),
        42: ("raw/sparse_run42-decode_sparse_results.json", "c083f5e"),
        43: ("raw/sparse_run43-decode_sparse_results.json", "c083f5e + the run43 list")}
SOURCE = {"dsa_indexer": 4, "dsa_indexer_topk2048": 3}  # top-K: TOPK_RUNS, decode: DECODE
# dual-scope decode per batch: (run, provider there that is today's default, provider there of the default it
# replaced)
DECODE = {1: (16, "zoe fp16", "zoe default"), **{b: (42, "zoe default", "zoe two passes") for b in (8, 16, 32)},
          **{b: (43, "zoe default", "zoe two passes") for b in (64, 128)}}  # 43: the default not first in its batch
PREVIOUS_DECODE = {16: "zoe previous default (runs 11-13: no fp16 score dots, lazy rescale or deferred sums)",
                   **{run: "zoe Gluon two passes (run 25's default), replaced by the one pass" for run in (42, 43)}}
# run 33's default (the one pass on 32-entry tiles, keys and values in one ring), which runs 34-42 replaced
RUN33_ONE_PASS = "zoe previous one pass (run 33: 32-entry tiles, keys and values in one ring)"
# the one-pass Triton kernel (runs 15-16's default), timed beside them in run 33: the default off Hopper below B=32
TRITON_ONE_PASS = "zoe one-pass Triton (the default where Gluon cannot run, below B=32)"
# CSA top-K rows of the sweeps (bench-format rows in results/raw/): (run, file, commit, shapes taken, provider
# there -> provider here; rows of other providers are variants no longer in the code)
ALL_TOPK = ("B=1 N=4096", "B=1 N=65536", "B=1 N=262144", "B=1 N=1048576", "B=1 N=1048576 recent", "B=8 N=262144",
            "B=32 N=1048576")
RUN14 = ("B=1 N=1048576", "B=8 N=262144", "B=32 N=1048576")
RUN24_NEAR_DEFAULT = "zoe auto (default, timed with RESET_FIRST: removed since, 0.3 us slower at B=1 x 1M)"
TOPK_RUNS = [("12-topk", "raw/sparse_results_run12-topk.json", "ccd2ed4", RUN14[1:],
              {"zoe default": "zoe run 9 default (2048-entry tiles)"}),
             ("14-topk", "raw/sparse_results_run14-topk.json", "63e0627", RUN14,
              {"zoe default": "zoe run 12 default (4-byte loads)"}),
             ("15-topk", "raw/sparse_results_run15-topk.json", "cec9c4c + uncommitted top-K edits", ALL_TOPK[1:],
              {"zoe run14 default": "zoe run 14 default (16-byte loads)"}),
             ("17-topk", "raw/sparse_results_run17-topk.json", "788785e (timed uncommitted)", ALL_TOPK[5:],
              {"zoe int keys": "zoe run 16 default (integer keys)"}),
             ("19-topk", "raw/sparse_results_run19-topk.json", "13289eb", ALL_TOPK,
              {"zoe one cumsum": "zoe one cumsum per tile (HALF_SCAN off)",
               "zoe no pdl": "zoe half scan, no pdl",
               "zoe one cumsum, no pdl": "zoe run 17 default (one cumsum per tile, no pdl)"}),
             ("22-topk", "raw/sparse_results_run22-topk.json", "e26660f", ALL_TOPK[1:],
              {"zoe run 20 default": "zoe run 20 default (one-key threshold search, late finish loads)",
               "zoe pairs only": "zoe pair search alone (run 20 default + PAIR_SEARCH)"}),
             ("23-topk", "raw/sparse_results_run23-topk.json", "33d33e0 (its options on, as committed there)",
              ALL_TOPK[1:],
              {"zoe default": "zoe run 22 default (one bit per pair count, two gathers, finish launched)"}),
             ("24-topk", "raw/sparse_results_run24-topk.json", "b4c8f01 + round-7 top-K edits (with RESET_FIRST; "
              "committed as 861bc00 without it)", ALL_TOPK,
              {"torch.topk": "torch.topk", "zoe default": RUN24_NEAR_DEFAULT,
               "zoe run 23 default": "zoe run 23 default (finish stores through shared memory, int64 histogram start, "
                                     "late threshold load, threshold launch not a dependent)"})]
# run 24's exact default (B=1 x 1M) and nearest (B=32: the dependent threshold launch is one row only now)
RUN24_SHAPE_PROVIDERS = {"B=1 N=1048576": {"zoe no reset first": "zoe auto (default)", "zoe default": None},
                         "B=32 N=1048576": {"zoe no pdl threshold": RUN24_NEAR_DEFAULT, "zoe default": None}}
RENAME = {"zoe BH=32 DV=512 BKV=32": "zoe BH=32 DV=512 BKV=32 (default from B=8)",  # run 4's labels
          "zoe default BH=64 DV=256 BKV=64": "zoe BH=64 DV=256 BKV=64",
          "zoe run 1 defaults": "zoe run 1 config, current kernel (default below B=8)",
          "zoe radix (run 1)": "zoe radix fallback, one program per row",
          "zoe sample (default)": "zoe sample tile=2048 warps=4"}  # the default is "auto" since run 5
# earlier code, for comparison: (run, op, provider there, provider here)
PREVIOUS = [(9, "csa_topk", "zoe default", "zoe run 8 default (no pdl)"),
            (3, "csa_dual_scope_decode", "zoe run 1 defaults", "zoe previous kernel (run 3), run 1 config"),
            (4, "csa_dual_scope_decode", "zoe BH=32 DV=512 BKV=32", "zoe run 4 default (32-entry tiles)"),
            (5, "csa_topk", "zoe sample (default)", "zoe run 5 default (every search step paid)"),
            (8, "csa_topk", "zoe radix fallback, one program per row", "zoe radix fallback, one program per row")]


def _topk_rows() -> list[dict]:
    """The top-K rows of TOPK_RUNS that the code runs now, renamed (one row over 4096 entries: pdl); of a
    variant timed twice in one run, the first timing."""
    rows = []
    taken = set()
    for run, name, commit, shapes, providers in TOPK_RUNS:
        for row in json.loads((RESULTS / name).read_text())["rows"]:
            names = {**providers, **RUN24_SHAPE_PROVIDERS.get(row.get("shape"), {})} if run == "24-topk" else providers
            if row.get("op") == "csa_topk" and row["shape"] in shapes and names.get(row["provider"]):
                provider = names[row["provider"]]
                if row["shape"] == "B=1 N=4096" and provider != "torch.topk":
                    provider = "zoe auto (default: radix)"
                if (run, row["shape"], provider) not in taken:
                    taken.add((run, row["shape"], provider))
                    rows.append(dict(row, provider=provider, run=run, commit=commit))
    order = ("B=1 N=4096", "B=1 N=65536", "B=1 N=262144", "B=1 N=1048576", "B=1 N=1048576 recent", "B=8 N=262144",
             "B=32 N=1048576")
    return sorted(rows, key=lambda r: order.index(r["shape"]))


def main() -> None:
    loaded = {run: json.loads((RESULTS / name).read_text()) for run, (name, _) in RUNS.items()}
    rows = _topk_rows()
    for op, run in SOURCE.items():
        for row in loaded[run]["rows"]:
            if row.get("op") == op:
                row = dict(row, run=run, commit=RUNS[run][1])
                row["provider"] = RENAME.get(row["provider"], row["provider"])
                rows.append(row)
    for b, (run, default, previous) in DECODE.items():
        for row in loaded[run]["rows"]:
            if row.get("op") != "csa_dual_scope_decode" or not row["shape"].startswith(f"B={b} "):
                continue
            names = {"torch gather+SDPA": "torch gather+SDPA", default: "zoe default",
                     previous: PREVIOUS_DECODE.get(run)}
            if run in (42, 43):
                names["zoe one-pass triton"] = TRITON_ONE_PASS
            taken = {(r["shape"], r["provider"]) for r in rows}
            if row["provider"] in names and (row["shape"], names[row["provider"]]) not in taken:
                rows.append(dict(row, provider=names[row["provider"]], run=run, commit=RUNS[run][1]))  # run 43 timed
                # B=64 twice: its first pass is kept, the second is in the raw file
    for run, op, old_name, new_name in PREVIOUS:
        for row in loaded[run]["rows"]:
            if row.get("op") == op and row["provider"] == old_name:
                if run == 9 and (not row["shape"].startswith("B=1 ") or "N=4096" in row["shape"]):
                    continue  # run 9's plain launches are run 8's default only where pdl is the default now
                rows.append(dict(row, provider=new_name, run=run, commit=RUNS[run][1]))
    for row in loaded[33]["rows"]:
        if (row.get("op") == "csa_dual_scope_decode" and row["provider"] == "zoe default"
                and not row["shape"].startswith("B=1 ")):
            rows.append(dict(row, provider=RUN33_ONE_PASS, run=33, commit=RUNS[33][1]))
    # run 1's top-K (radix select, 32 programs per row + merge), the method this session replaced
    for row in loaded[1]["rows"]:
        if row.get("op") == "csa_topk" and "radix_bits" in row.get("config", ""):
            rows.append(dict(row, provider="zoe run 1 radix split + merge", run=1, commit=RUNS[1][1]))
    meta = dict(loaded[4]["meta"])
    meta.update(command="python bench/kernels/sparse_bench.py --out $OUT --skip-tests (runs 1, 3, 4; run 5: "
                        "--sections topk; run 8: --sections topk,decode; runs 9, 12- and 14- to 24-topk: "
                        "python bench/kernels/sparse_sweep.py --sections topk; runs 11-, 16- and 33-decode: "
                        "python bench/kernels/sparse_decode_sweep.py --set run11 / --set run15 --batches 128,1,64 / "
                        "--set run33 --batches 64,1,8,16,32,128 / --set run42 --batches 64,1,8,16,32,128 / "
                        "--set run43 --batches 64,128,64), "
                        "assembled by "
                        "python bench/kernels/sparse_assemble.py",
                runs={run: {"file": name, "commit": commit, "started": loaded[run]["meta"].get("started"),
                            "copy_tbps": loaded[run]["meta"].get("copy_tbps"),
                            "fp8_tflops": loaded[run]["meta"].get("fp8_tflops")}
                      for run, (name, commit) in RUNS.items()},
                sources={**{op: run for op, run in SOURCE.items()}, "csa_topk": [r[0] for r in TOPK_RUNS],
                         "csa_dual_scope_decode": {f"B={b}": run for b, (run, _, _) in DECODE.items()}})
    for run, name, commit, _, _ in TOPK_RUNS:
        run_meta = json.loads((RESULTS / name).read_text())["meta"]
        meta["runs"][run] = {"file": name, "commit": commit, "started": run_meta.get("started"),
                             "copy_tbps": run_meta.get("copy_tbps"), "fp8_tflops": run_meta.get("fp8_tflops")}
    (RESULTS / "sparse_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(RESULTS / "sparse_results.json", len(rows), "rows")


if __name__ == "__main__":
    main()
