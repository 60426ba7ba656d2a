"""Builds bench/kernels/results/sparse_results.json (plotted by sparse_plot.py) from the H200 runs that timed the
code as it is now, one source file per op (each row keeps its source and commit):

- CSA top-K: `raw/sparse_results_topk_h200.json` (sparse_sweep.py --sections topk): torch.topk and the default
  (its first timing where the sweep timed it more than once);
- DSA indexer logits: `sparse_results_run4.json` (sparse_bench.py --sections indexer);
- DSA indexer top-2048: `sparse_results_run3.json` (the code since does less work on rows of <= 16384 keys);
- CSA dual-scope decode: `sparse_decode_h200.json`, run decode-b (sparse_bench.py --sections decode,limits).

Usage: python bench/kernels/sparse_assemble.py  (then python bench/kernels/sparse_plot.py)
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TOPK = ("raw/sparse_results_topk_h200.json", "608b498")
INDEXER = ("sparse_results_run4.json", "8cef3bc")
INDEXER_TOPK = ("sparse_results_run3.json", "16cdafd")
DECODE = ("sparse_decode_h200.json", "3951081")
TOPK_ORDER = ("B=1 N=4096", "B=1 N=65536", "B=1 N=262144", "B=1 N=1048576", "B=1 N=1048576 recent", "B=8 N=262144",
              "B=32 N=1048576")


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _topk_rows() -> list[dict]:
    """torch.topk and the default at every shape, the first timing of each."""
    rows, taken = [], set()
    for row in _load(TOPK[0])["rows"]:
        if row.get("op") != "csa_topk" or row["shape"] not in TOPK_ORDER:
            continue
        provider = row["provider"]
        if provider in ("torch.topk", "zoe default") and (row["shape"], provider) not in taken:
            taken.add((row["shape"], provider))
            rows.append(dict(row, source=TOPK[0], commit=TOPK[1]))
    return sorted(rows, key=lambda r: TOPK_ORDER.index(r["shape"]))


def main() -> None:
    rows = _topk_rows()
    for (name, commit), op in ((INDEXER, "dsa_indexer"), (INDEXER_TOPK, "dsa_indexer_topk2048")):
        rows += [dict(r, source=name, commit=commit) for r in _load(name)["rows"] if r.get("op") == op]
    decode = _load(DECODE[0])
    rows += [dict(r, source=DECODE[0], commit=DECODE[1]) for r in decode["rows"]
             if r.get("op") == "csa_dual_scope_decode" and r.get("run") == decode["meta"]["decode_run"]]
    meta = dict(decode["meta"])
    meta.update(command="python bench/kernels/sparse_assemble.py (sources: each row's `source`)",
                sources={op: {"file": name, "commit": commit} for op, (name, commit) in
                         (("csa_topk", TOPK), ("dsa_indexer", INDEXER), ("dsa_indexer_topk2048", INDEXER_TOPK),
                          ("csa_dual_scope_decode", DECODE))})
    (RESULTS / "sparse_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(RESULTS / "sparse_results.json", len(rows), "rows")


if __name__ == "__main__":
    main()
