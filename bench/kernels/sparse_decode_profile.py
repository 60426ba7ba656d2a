"""Where a dual-scope decode call spends its time: each launch of the call timed apart (torch.profiler), per
variant, at one batch; optionally one call per variant for Nsight Compute (`--ncu`) to read stall reasons.

Usage: python bench/kernels/sparse_decode_profile.py [--batch 64] [--variants NAME,...] [--out DIR]
       ncu --clock-control none --section ... python bench/kernels/sparse_decode_profile.py --ncu
Variants are names from sparse_decode_sweep.py's list (all of them by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sparse_decode_sweep as sweep  # noqa: E402  (the variant list)


def per_kernel_us(fn, calls: int = 50) -> dict[str, float]:
    """Mean device time per call of each kernel `fn` launches (torch.profiler over `calls` calls)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for evt in prof.events():
        if evt.device_type.name == "CUDA":
            total[evt.name] += evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
    return {name: round(t / calls, 2) for name, t in sorted(total.items(), key=lambda kv: -kv[1])}


def main() -> None:
    import sparse_bench as sb
    import torch

    from zoe_kernels.csa import dual_scope_decode

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--variants", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--batches", default=None, help="comma-separated batches (overrides --batch)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", action="store_true", help="one call per variant after a warm-up (for ncu)")
    args = ap.parse_args()
    rows = {}
    for batch in [int(b) for b in (args.batches or str(args.batch)).split(",")]:
        q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = sb._decode_inputs(batch)
        call_args = (q, win_k, win_v, win_len, comp_k, comp_v, idx)
        kw = dict(win_k_scale=win_ks, comp_k_scale=comp_ks)
        listed = dict(sweep.variants(batch))
        for name in args.variants.split(",") if args.variants else listed:
            cfg = listed[name]
            fn = lambda: dual_scope_decode(*call_args, **kw, **cfg)  # noqa: E731
            if args.ncu:
                fn()
                torch.cuda.synchronize()
                fn()
                torch.cuda.synchronize()
                continue
            times = per_kernel_us(fn)
            rows[f"B={batch} {name}"] = times
            print(f"B={batch} {name}: {times} sum {sum(times.values()):.1f} us", flush=True)
    if args.out and rows:
        Path(args.out, "decode_profile.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
