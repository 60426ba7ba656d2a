"""Where a dual-scope decode kernel's warps wait, from Nsight Compute's per-instruction stall sampling: the stall
reasons over the whole kernel, and the kernel's SASS cut into segments at its waits (warpgroup MMA waits, block
barriers, mbarrier waits, cp.async waits), each with its share of the samples, the instructions its warps
executed per tile and its main stall reasons.

The input is the source page of an ncu report as CSV (`--print-source sass`); bench/kernels/sparse_README.md has
the commands that made the committed ones (results/raw/sparse_decode_ncu_source_b64_*.csv.gz).

Usage: python bench/kernels/sparse_decode_stalls.py SOURCE.csv[.gz] [--tiles 5120] [--min-share 1.0]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from pathlib import Path

WAITS = ("WARPGROUP.DEPBAR", "BAR.SYNC", "SYNCS.PHASECHK", "DEPBAR.LE")


def read_rows(path: Path) -> list[dict]:
    """The CSV's instruction rows (address, SASS, samples, executions, stall reasons)."""
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    lines = list(csv.reader(io.StringIO(text)))
    header = lines[1]
    rows = []
    for line in lines[2:]:
        if len(line) < len(header):
            continue
        row = dict(zip(header, line))
        rows.append({"address": row["Address"], "sass": row["Source"].strip(),
                     "samples": int(row["Warp Stall Sampling (All Samples)"] or 0),
                     "executed": int(row["Instructions Executed"] or 0),
                     "stalls": {h[6:]: int(row[h] or 0) for h in header
                                if h.startswith("stall_") and "Not Issued" not in h}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("source", type=Path)
    ap.add_argument("--tiles", type=int, default=5120, help="warp-tiles (programs x warps x tiles) a loop runs")
    ap.add_argument("--min-share", type=float, default=1.0, help="segments below this %% of samples are not listed")
    args = ap.parse_args()
    rows = read_rows(args.source)
    total = sum(r["samples"] for r in rows)
    reasons: dict[str, int] = {}
    for r in rows:
        for k, v in r["stalls"].items():
            reasons[k] = reasons.get(k, 0) + v
    print(f"{total} samples; stall reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in
                                                         sorted(reasons.items(), key=lambda kv: -kv[1]) if v))
    segment: list[dict] = []
    print(f"{'share':>6} {'instr/tile':>10}  segment ending at (main stalls)")
    for r in rows:
        segment.append(r)
        if any(r["sass"].startswith(w) or f" {w}" in r["sass"] for w in WAITS) or r is rows[-1]:
            samples = sum(x["samples"] for x in segment)
            if 100 * samples / total >= args.min_share:
                stalls: dict[str, int] = {}
                for x in segment:
                    for k, v in x["stalls"].items():
                        stalls[k] = stalls.get(k, 0) + v
                top = ", ".join(f"{k} {v}" for k, v in sorted(stalls.items(), key=lambda kv: -kv[1])[:3] if v)
                executed = sum(x["executed"] for x in segment) / args.tiles
                print(f"{100 * samples / total:5.1f}% {executed:10.1f}  {segment[0]['address'][-5:]}.."
                      f"{r['address'][-5:]} {r['sass'][:48]} ({top})")
            segment = []


if __name__ == "__main__":
    main()
