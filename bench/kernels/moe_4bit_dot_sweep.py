"""The 4-bit formats (w4a16, mxfp4) in the tl.dot path with the cheap decode (run12): M=1 and M = 64..256.

    python3 bench/kernels/moe_4bit_dot_sweep.py --out DIR [--sweep-shapes dsv32,glm5,dsv32-tp8]
        [--large-shape dsv32] [--large-ms 8,16,64,256] [--large-shapes glm5,... --more-ms 1,8,16,64,256]
        [--unswapped] [--no-gemv] [--budget-s 200]

Every variant first runs fused_moe once with NaN-poisoned scratch and is compared with the float32 reference
(`fused_moe_reference`, relative error < 1.5e-2, the tests' bf16 tolerance); only variants that pass are timed
(fused_moe end to end, a CUDA graph of REPS calls with different routings, `moe_bench.time_graph`).
1. M=1 on each sweep shape: the current default (the word-wise GEMV), the tl.dot path's M=1 mode
   (`config.DOT_M1_TILES`, one tile per edge, no align) with each tile set of M1_TILES, and fp8's committed
   M=1 mode as the reference, interleaved twice.
2. M in --large-ms on --large-shape: the tl.dot path (and the GEMV at M <= 64), `torch._grouped_mm` (bf16,
   the baseline to beat) and, with --with-bf16-dot, bf16 in the dot path.
`--large-shapes` adds shapes at every M of --more-ms, timed only as fused_moe dispatches them, beside
`torch._grouped_mm`; `--unswapped` adds mxfp4 with its 16-row tiles unswapped (`config.SWAP_AB_TILES16` empty).
run15/run16 ran an earlier tree of this script, with the swapped variants that did not pay (their commands are
in bench/kernels/moe_README.md).
`--split-a both` also times the 4-bit dot variants with the activations loaded as two strided halves
(`config.SPLIT_A_4BIT` False, the loads the loop waits on) at M=1 on the first shape and the largest M.
run12 (an earlier tree: no activation split, no scale prefetch) ran with `--split-a off --with-bf16-dot` and
two more variants since removed: mxfp4 with one dot per 32-k scale group (slower at every point) and the
M=1 tile set (32, 2, 4) / (64, 2, 4, 2) (slower everywhere).
Writes DIR/4bit_dot_sweep.json after every point (partial results survive a timeout). Without a GPU it runs a
smoke test of itself (tiny shapes, the CPU interpreter, host-clock timing).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_bench as mb  # noqa: E402

# {stage: tile} as in config.DOT_M1_TILES: 1: (BLOCK_N, num_warps, num_stages, QUANT),
# 2: (BLOCK_N, num_warps, num_stages, SPLIT_K, QUANT); QUANT is fp8-only. The first is fp8's committed set.
M1_TILES = {
    "fp8set": {1: (32, 4, 4, False), 2: (128, 4, 4, 2, False)},
}
# The M=1 tile sets timed per format (mxfp4 keeps the GEMV at M=1; its M=1 mode: 193.1 us in run13, 147.0 swapped
# in run16, against the GEMV's 105.4). run15 also timed for w4a16, at M=1: 6 stages (96.4 us), BLOCK_N 16 (134.7),
# the swapped operands (107.6) and both (162.4), all slower than "fp8set" (88.9).
M1_SETS = {"w4a16": ["fp8set"], "mxfp4": []}
REPS = 4
SMOKE_SHAPES = {"tiny": {"H": 256, "I": 128, "E": 8, "k": 2, "shared": 0},
                "tiny-shared": {"H": 128, "I": 256, "E": 8, "k": 2, "shared": 1}}


def main() -> None:
    ap = mb.sweep_parser(__doc__, "dsv32,glm5,dsv32-tp8", 200.0)
    ap.add_argument("--large-shape", default="dsv32")
    ap.add_argument("--large-ms", default="8,16,64,256")
    ap.add_argument("--split-a", choices=("on", "off", "both"), default="both")
    ap.add_argument("--with-bf16-dot", action="store_true")
    ap.add_argument("--large-shapes", default="", help="more shapes, at every M of --more-ms, timed as dispatched "
                    "only (fused_moe's own path and tiles, M=1 included) against torch._grouped_mm")
    ap.add_argument("--more-ms", default="1,8,16,64,256")
    ap.add_argument("--unswapped", action="store_true", help="also time the formats of config.SWAP_AB_TILES16 "
                    "with their 16-row tiles unswapped")
    ap.add_argument("--no-gemv", action="store_true", help="leave the GEMV out above M=1")
    args = ap.parse_args()

    smoke = mb.start_sweep()
    import torch

    from zoe_kernels.moe import config, fused_moe
    from zoe_kernels.moe.fallback import grouped_mm_moe
    from zoe_kernels.platform import device_name

    device = "cpu" if smoke else "cuda"
    dev = device_name(device)
    shapes = SMOKE_SHAPES if smoke else mb.SHAPES
    if smoke:
        args.sweep_shapes, args.large_shape, args.large_ms = "tiny,tiny-shared", "tiny", "8"
        args.large_shapes, args.more_ms = ("tiny-shared" if args.large_shapes else ""), "1"

    deadline = time.time() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"meta": mb.run_meta(dev), "m1_tiles": {k: {s: list(t) for s, t in v.items()} for k, v in M1_TILES.items()},
           "checks": [], "rows": []}
    saved_tiles = dict(config.DOT_M1_TILES)
    saved_min_i = dict(config.DOT_M1_MIN_I)
    saved_split = config.SPLIT_A_4BIT
    saved_swap16 = set(config.SWAP_AB_TILES16)

    def save():
        (args.out / "4bit_dot_sweep.json").write_text(json.dumps(res, indent=1))

    def setup(variant):
        """Apply a variant's configuration: (path, DOT_M1 tile set name or None, activations split); path None is
        fused_moe's own dispatch with the committed configuration."""
        path, tiles, split_a = variant
        config.DOT_M1_TILES.clear()
        config.DOT_M1_TILES.update(saved_tiles)
        for fmt in ("w4a16", "mxfp4"):
            if tiles in M1_TILES:
                config.DOT_M1_TILES[fmt] = M1_TILES[tiles]
        if tiles in M1_TILES:
            config.DOT_M1_MIN_I.clear()  # the M=1 mode wherever a tile set asks for it
        else:
            config.DOT_M1_MIN_I.update(saved_min_i)
        config.SPLIT_A_4BIT = split_a
        config.SWAP_AB_TILES16.clear()
        config.SWAP_AB_TILES16.update(set() if tiles == "unswapped" else saved_swap16)
        return path

    def check(label, fmt, w, routes, xs, variant):
        return mb.check_fused_moe(res, label, fmt, w, routes, xs, path=setup(variant))

    def timed(label, shape_name, shape, fmt, m, w, routes, xs, variant, unique, rep):
        w13, s13, w2, s2 = w
        path = setup(variant)
        calls = [lambda r=r: fused_moe(xs[r], w13, w2, routes[r][0], routes[r][1], fmt=fmt, w13_scale=s13,
                                       w2_scale=s2, path=path) for r in range(len(routes))]
        us = mb.time_calls(calls, smoke)
        floor, nbytes, _ = mb.roofline_us(shape, fmt, m, unique)
        row = {"shape": shape_name, "M": m, "fmt": fmt, "variant": label, "path": variant[0],
               "m1_tiles": variant[1], "split_a": variant[2], "rep": rep, "median_us": round(us, 2),
               "floor_us": round(floor, 2), "pct_roofline": round(100 * floor / us, 1), "device": dev}
        res["rows"].append(row)
        save()
        print(f"[time] {shape_name} M={m} {fmt} {label}: {us:9.1f}us {row['pct_roofline']:5.1f}%", flush=True)

    def variants(fmt, m, first):
        """The variants of one point; `first`: the first M=1 shape or the largest M (where --split-a both
        adds the unsplit activations)."""
        if fmt == "fp8":
            return {"dot_m1": ("dot", None, saved_split)}
        out = {"gemv": ("gemv", None, saved_split)} if m <= 64 and not (args.no_gemv and m > 1) else {}
        splits = {"on": [True], "off": [False], "both": [True, False] if first else [True]}[args.split_a]
        for split_a in splits:
            suffix = "" if split_a else "/unsplit"
            if m == 1:
                for tiles in M1_SETS[fmt]:
                    out[f"dot_m1:{tiles}{suffix}"] = ("dot", tiles, split_a)
            else:
                out[f"dot{suffix}"] = ("dot", None, split_a)
                if split_a and args.unswapped and fmt in saved_swap16:  # and as before the swap
                    out["dot/unswapped"] = ("dot", "unswapped", split_a)
        return out

    # order: the first sweep shape at M=1, the large Ms from the largest (M=256 is the missed target), then the
    # other shapes at M=1, so that a budget cut loses the least
    m1 = [(n, 1) for n in args.sweep_shapes.split(",") if n]
    large = [(args.large_shape, int(m)) for m in sorted(args.large_ms.split(","), key=int, reverse=True)]
    plan = m1[:1] + large[:2] + m1[1:] + large[2:]
    more = [(n, int(m)) for n in args.large_shapes.split(",") if n for m in args.more_ms.split(",")]
    plan += [(n, m) for n, m in more if (n, m) not in plan]
    dispatched_only = {p for p in more if p not in m1 + large}
    for shape_name, m in plan:
        shape = shapes[shape_name]
        reps = REPS if m <= 64 else 2
        routes = [mb.make_routing(shape, m, seed=900 + 1000 * m + r, device=device) for r in range(reps)]
        # the CPU smoke runs fp16: the interpreter's tl.dot on bf16 operands returns garbage (Triton 3.9, a 16x16
        # bf16 dot: relative error 4e9), which is why the CPU tests take fp16 and fp32; on the GPU bf16, as served
        act = torch.float16 if smoke else torch.bfloat16
        xs = [torch.randn((m, shape["H"]), dtype=act, device=device) for _ in range(reps)]
        unique = sum(len(torch.unique(ti)) for _, ti in routes) / reps
        fmts = ["fp8", "w4a16", "mxfp4"] if m == 1 and (shape_name, m) not in dispatched_only else ["w4a16", "mxfp4"]
        todo = []
        for fmt in fmts:
            w = mb.make_weights(shape, fmt, device)
            first = (shape_name, m) in (plan[0], large[0] if large else None)
            if (shape_name, m) in dispatched_only:
                todo_variants = {"dispatched": (None, None, saved_split)}
                if args.unswapped and fmt in saved_swap16 and m > 1:
                    todo_variants["dispatched/unswapped"] = (None, "unswapped", saved_split)
            else:
                todo_variants = variants(fmt, m, first)
            for label, variant in todo_variants.items():
                if time.time() > deadline:
                    break
                if check(f"{shape_name} M={m} {fmt} {label}", fmt, w, routes, xs, variant):
                    todo.append((fmt, label, variant))
            for rep in range(2 if m == 1 else 1):  # M=1: every variant twice, interleaved
                for fmt_, label, variant in todo:
                    if fmt_ != fmt or time.time() > deadline:
                        continue
                    try:
                        timed(label, shape_name, shape, fmt, m, w, routes, xs, variant, unique, rep)
                    except Exception as exc:
                        print(f"[time] {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            del w
            torch.cuda.empty_cache()
        if (m > 1 or (shape_name, m) in dispatched_only) and time.time() < deadline:  # the baseline to beat
            wb = [t.to(act) if t is not None and t.is_floating_point() else t for t in mb.make_weights(shape, "bf16", device)]
            if args.with_bf16_dot:
                timed("bf16 dot", shape_name, shape, "bf16", m, wb, routes, xs, ("dot", None, False), unique, 0)
            calls = [lambda r=r: grouped_mm_moe(xs[r], wb[0], wb[2], routes[r][0], routes[r][1]) for r in range(reps)]
            us = mb.time_calls(calls, smoke)
            floor, _, _ = mb.roofline_us(shape, "bf16", m, unique)
            res["rows"].append({"shape": shape_name, "M": m, "fmt": "bf16", "variant": "torch_grouped_mm",
                                "median_us": round(us, 2), "floor_us": round(floor, 2),
                                "pct_roofline": round(100 * floor / us, 1), "device": dev})
            print(f"[time] {shape_name} M={m} torch_grouped_mm: {us:9.1f}us", flush=True)
            del wb
            torch.cuda.empty_cache()
        save()
    setup(("dot", None, saved_split))
    save()
    mb.print_best_m1(res["rows"])


if __name__ == "__main__":
    main()
