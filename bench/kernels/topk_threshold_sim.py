"""How often the CSA top-K threshold falls back to the exact radix select, by sample size (CPU, no GPU).

The split top-K (`zoe_kernels.csa.topk`) picks its candidate threshold from S sampled entries of a row: the
search of `_sample_threshold` / `_rank_bound` (bit by bit over order-preserving keys, from the top, stopped as soon
as r to r + slack sampled entries reach the bound; r = ceil(MARGIN k S / n), slack = r // 2). The row falls back to
the exact radix select (~3.3 ms on the H200, run 8) when fewer than k entries reach the threshold or more than the
candidate slots (4096 at k = 512) do. This replays that search on i.i.d. randn rows: the S sampled entries are
drawn, the search runs exactly as the kernel's, and the count of the row's n - S unsampled entries over the
threshold is drawn binomially (i.i.d. entries: the sample's block layout does not matter).

    python bench/kernels/topk_threshold_sim.py                       # 200,000 rows of 1M at S = 16384 and 8192
    python bench/kernels/topk_threshold_sim.py --samples 8192 --slack-div 4

Writes bench/kernels/results/topk_threshold_sim.json (the command inside).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from rich.progress import Progress

RESULTS = Path(__file__).resolve().parent / "results"


def unsigned_keys(x: np.ndarray) -> np.ndarray:
    """float32 -> int64 in [0, 2^32) in the float order (`_signed_key` then `_unsigned` of topk_search.py)."""
    b = x.astype(np.float32).view(np.int32).astype(np.int64)
    return (b ^ ((b >> 31) & 0x7FFFFFFF)) + 2**31


def key_to_float(u: np.ndarray) -> np.ndarray:
    """The inverse of `unsigned_keys` (the float whose key is u)."""
    k = (u - 2**31).astype(np.int64)
    b = (k ^ ((k >> 31) & 0x7FFFFFFF)).astype(np.int32)
    return b.view(np.float32)


def rank_bound(sorted_u: np.ndarray, r: int, slack: int) -> tuple[np.ndarray, np.ndarray]:
    """`_rank_bound` from lo_u = 0 (every key reaches it) for a batch of rows (sorted keys, ascending): per row the
    bound c and how many sampled keys reach it."""
    rows, s = sorted_u.shape
    hi_u = sorted_u[:, -1]
    flat = (sorted_u + (np.arange(rows, dtype=np.int64) << 33)[:, None]).ravel()  # rows apart: one searchsorted
    c = np.zeros(rows, np.int64)
    cnt_c = np.full(rows, s, np.int64)
    active = cnt_c > r + slack
    for i in range(32):
        cand = c | (1 << (31 - i))
        pos = np.searchsorted(flat, cand + (np.arange(rows, dtype=np.int64) << 33), side="left")
        cnt = s - (pos - np.arange(rows, dtype=np.int64) * s)  # sampled keys >= cand
        take = active & (cand <= hi_u) & (cnt >= r)
        c = np.where(take, cand, c)
        cnt_c = np.where(take, cnt, cnt_c)
        active &= cnt_c > r + slack
    return c, cnt_c


def simulate(n: int, k: int, sample: int, margin: int, slots: int, slack_div: int, rows: int, batch: int,
             seed: int, progress: Progress) -> dict:
    rng = np.random.default_rng(seed)
    r = min(-(-margin * k * sample // n), sample)
    slack = r // slack_div
    under = over = 0
    counts = []
    task = progress.add_task(f"S={sample} slack=r/{slack_div}", total=rows)
    done = 0
    while done < rows:
        b = min(batch, rows - done)
        keys = np.sort(unsigned_keys(rng.standard_normal((b, sample), dtype=np.float32)), axis=1)
        c, sampled_over = rank_bound(keys, r, slack)
        t = key_to_float(c).astype(np.float64)
        p_over = np.array([0.5 * math.erfc(v / math.sqrt(2.0)) for v in t])  # P(X >= t), X ~ N(0, 1)
        total = sampled_over + rng.binomial(n - sample, p_over)
        under += int((total < k).sum())
        over += int((total > slots).sum())
        counts.append(total)
        done += b
        progress.update(task, advance=b)
    total = np.concatenate(counts)
    return {"sample": sample, "r": r, "slack": slack, "rows": rows, "under_k": under, "over_slots": over,
            "fallback_rate": (under + over) / rows,
            "candidates_p50_p99_max": [int(np.percentile(total, 50)), int(np.percentile(total, 99)), int(total.max())]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 20, help="row length")
    ap.add_argument("--k", type=int, default=512)
    ap.add_argument("--samples", default="16384,8192", help="sample sizes S to compare")
    ap.add_argument("--margin", type=int, default=3, help="topk.MARGIN")
    ap.add_argument("--slots", type=int, default=4096, help="candidate slots per row (k = 512: 4096)")
    ap.add_argument("--slack-div", type=int, default=2, help="slack = r // this (the kernel: 2)")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "topk_threshold_sim.json")
    args = ap.parse_args()
    results = []
    with Progress() as progress:
        for s in (int(v) for v in args.samples.split(",")):
            results.append(simulate(args.n, args.k, s, args.margin, args.slots, args.slack_div, args.rows,
                                    args.batch, args.seed, progress))
    for res in results:
        print(f"S={res['sample']:6d} r={res['r']} slack={res['slack']}: {res['under_k']} under k, "
              f"{res['over_slots']} over {args.slots} slots of {res['rows']} rows "
              f"(rate {res['fallback_rate']:.2e}); candidates p50/p99/max {res['candidates_p50_p99_max']}")
    args.out.write_text(json.dumps({"command": "python " + " ".join(["bench/kernels/topk_threshold_sim.py",
                                                                    *sys.argv[1:]]),
                                    "n": args.n, "k": args.k, "margin": args.margin, "slots": args.slots,
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
