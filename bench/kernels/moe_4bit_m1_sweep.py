"""The 4-bit formats at M=1 in the tl.dot path's M=1 mode: each stage alone beside fp8's, and end to end.

    python3 bench/kernels/moe_4bit_m1_sweep.py --out DIR [--shapes dsv32,glm5] [--budget-s 95] [--wait-file PATH]

1. Each stage alone (the M=1 mode's launches, a CUDA graph of REPS calls with different routings,
   `moe_bench.time_graph`) on the first shape: fp8's committed tiles (the diagnostic: how far each stage is from
   the bandwidth) and every stage tile of W4A16_STAGE1 / W4A16_STAGE2 (the first of each is the committed one).
2. fused_moe end to end at M=1, interleaved twice per shape: fp8 (committed), w4a16 committed, w4a16 with every
   tile set of W4A16_SETS plus "best-stages" (the fastest stage-1 and stage-2 tiles of step 1), mxfp4 committed
   (the GEMV) and the mxfp4 M=1 mode (MXFP4_SETS).
run17-m1 ran this script on the tree of commit 9a73951, whose kernel took K steps of two int4 scale groups
(BLOCK_K 256 as a sixth tile element) and ran the M=1 mode's 64-wide mxfp4 tiles swapped; its lists held those
variants (stage 1 (32,4,4|3,256), (64,4,4|3,256); stage 2 (128,4,4|3,2,256), (64,4,4,2,256); mxfp4 swapped
(64,4,4) / (128,4,4,2) and at 256), all slower and removed since (bench/kernels/moe_README.md).
Every tile set (for a stage alone: that stage's tile with the committed other one) first runs fused_moe once with
NaN-poisoned scratch against the float32 reference (`fused_moe_reference`, relative error < 1.5e-2, fp8 2e-2);
only those that pass are timed. `--wait-file` waits (at most --wait-max-s) for that file to exist (written when a
GPU pytest started beside this run ends) after the checks and before the first timing, so the timings run alone.
Writes DIR/4bit_m1_sweep.json after every timing. Without a GPU it runs a smoke test of itself (tiny shape,
the CPU interpreter, host-clock timing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_bench as mb  # noqa: E402

# config.DOT_M1_TILES entries: {1: (BLOCK_N, num_warps, num_stages, QUANT), 2: (BLOCK_N, num_warps, num_stages,
# SPLIT_K, QUANT)}; the first of each list is the committed tile.
W4A16_STAGE1 = [(32, 4, 4, False)]
W4A16_STAGE2 = [(128, 4, 4, 2, False), (128, 4, 4, 4, False)]
W4A16_SETS: dict = {}
MXFP4_SETS: dict = {}
REPS = 4
SMOKE_SHAPES = {"tiny": {"H": 256, "I": 256, "E": 16, "k": 8, "shared": 0}}


def _label(tile) -> str:
    return "x".join(str(v) for v in tile if not isinstance(v, bool))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="dsv32,glm5")
    ap.add_argument("--budget-s", type=float, default=95.0, help="stop starting new timings after this long")
    ap.add_argument("--wait-file", type=Path, default=None, help="wait for this file to exist before timing")
    ap.add_argument("--wait-max-s", type=float, default=120.0)
    args = ap.parse_args()
    t_start = time.time()
    smoke = mb.start_sweep()
    import torch

    from zoe_kernels.moe import config, fused_moe
    from zoe_kernels.moe.act_quant import quantize_act_fp8
    from zoe_kernels.moe.grouped_gemm import down_combine, gate_up_swiglu
    from zoe_kernels.platform import device_name

    device = "cpu" if smoke else "cuda"
    dev = device_name(device)
    shapes = SMOKE_SHAPES if smoke else mb.SHAPES
    if smoke:  # the tiny I would keep w4a16 off the M=1 mode
        config.DOT_M1_MIN_I.clear()
    names = ["tiny"] if smoke else args.shapes.split(",")
    deadline = t_start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"meta": mb.run_meta(dev), "w4a16_stage1": W4A16_STAGE1, "w4a16_stage2": W4A16_STAGE2,
           "w4a16_sets": W4A16_SETS, "mxfp4_sets": MXFP4_SETS, "checks": [], "stages": [], "rows": []}
    saved = {f: dict(t) for f, t in config.DOT_M1_TILES.items()}

    def save():
        (args.out / "4bit_m1_sweep.json").write_text(json.dumps(res, indent=1))

    def setup(fmt, tiles):
        """The committed M=1 tiles, with `tiles` for fmt where given."""
        config.DOT_M1_TILES.clear()
        config.DOT_M1_TILES.update({f: dict(t) for f, t in saved.items()})
        if tiles is not None:
            config.DOT_M1_TILES[fmt] = tiles


    def check(label, fmt, w, routes, xs, tiles):
        setup(fmt, tiles)
        return mb.check_fused_moe(res, label, fmt, w, routes, xs)

    waited = [False]

    def wait_for_file():
        if waited[0] or args.wait_file is None:
            return
        t0 = time.time()
        while not args.wait_file.exists() and time.time() - t0 < args.wait_max_s:
            time.sleep(0.5)
        waited[0] = True
        res["waited_s"] = round(time.time() - t0, 1)
        print(f"[wait] {args.wait_file} {'exists' if args.wait_file.exists() else 'MISSING'} after "
              f"{time.time() - t0:.1f}s of waiting", flush=True)

    def stage_rows(name, shape, fmt, w, routes, xs, tiles_by_stage):
        """Each stage of the M=1 mode alone, per tile: {stage: [(label, tiles)]} already checked."""
        w13, s13, w2, s2 = w
        k, h, i = routes[0][1].shape[1], shape["H"], shape["I"]
        kfmt = 1 if fmt == "fp8" else 2
        aligns = [(ti.reshape(-1).contiguous(), None, None) for _, ti in routes]
        inters = [torch.randn((k, i), dtype=xs[0].dtype, device=device) for _ in routes]
        if fmt == "fp8":
            xin = [quantize_act_fp8(x) for x in xs]
            iin = [quantize_act_fp8(t) for t in inters]
        else:
            xin = [(x, None) for x in xs]
            iin = [(t, None) for t in inters]
        acc = torch.zeros((1, h), dtype=torch.float32, device=device)
        outs = [torch.empty((k, i), dtype=xs[0].dtype, device=device) for _ in routes]
        st1_bytes = k * 2 * mb.bytes_per_expert(shape, fmt) / 3
        for stage, variants in tiles_by_stage.items():
            for label, tiles in variants:
                if time.time() > deadline:
                    return
                setup(fmt, tiles)
                cfg1, cfg2 = config.dot_m1_configs(1, fmt, k, i)
                if stage == 1:
                    calls = [lambda r=r: gate_up_swiglu(xin[r][0], xin[r][1], w13, s13, outs[r], aligns[r], top_k=k,
                                                        kfmt=kfmt, cfg=cfg1, zero=acc) for r in range(len(routes))]
                else:
                    calls = [lambda r=r: down_combine(iin[r][0], iin[r][1], w2, s2, acc, routes[r][0], aligns[r],
                                                      top_k=k, kfmt=kfmt, cfg=cfg2) for r in range(len(routes))]
                us = mb.time_calls(calls, smoke)
                nbytes = st1_bytes if stage == 1 else st1_bytes / 2
                row = {"shape": name, "fmt": fmt, "stage": stage, "variant": label, "median_us": round(us, 2),
                       "pct_read_bw": round(100 * nbytes / mb.READ_BW / (us * 1e-6), 1), "device": dev}
                res["stages"].append(row)
                save()
                print(f"[stage] {name} {fmt} stage{stage} {label:24s} {us:8.1f}us {row['pct_read_bw']:5.1f}%",
                      flush=True)

    best_stages = None
    for si, name in enumerate(names):
        shape = shapes[name]
        routes = [mb.make_routing(shape, 1, seed=700 + r, device=device) for r in range(REPS)]
        # the interpreter's bf16 arithmetic is wrong (tests/kernels/test_moe.py): fp16 in the smoke test
        xs = [torch.randn((1, shape["H"]), dtype=torch.float16 if smoke else torch.bfloat16, device=device)
              for _ in range(REPS)]
        unique = sum(len(torch.unique(ti)) for _, ti in routes) / REPS
        weights = {fmt: mb.make_weights(shape, fmt, device) for fmt in ("fp8", "w4a16", "mxfp4")}
        # end-to-end sets per format: label -> DOT_M1_TILES entry (None: committed)
        sets = {"fp8": {"committed": None}, "w4a16": {"committed": None}, "mxfp4": {"committed": None}}
        if si == 0:
            sets["w4a16"].update(W4A16_SETS)
            sets["mxfp4"].update(MXFP4_SETS)
        elif best_stages:
            sets["w4a16"]["best-stages"] = best_stages
        ok_sets = {f: {lab: t for lab, t in s.items() if check(f"{name} {f} {lab}", f, weights[f], routes, xs, t)}
                   for f, s in sets.items()}
        if si == 0:  # stage tiles: each with the committed other stage, checked end to end first
            st = {"fp8": {1: [("committed", None)], 2: [("committed", None)]}, "w4a16": {1: [], 2: []}}
            for tile in W4A16_STAGE1:
                t = {1: tile, 2: W4A16_STAGE2[0]}
                if check(f"{name} w4a16 stage1 {_label(tile)}", "w4a16", weights["w4a16"], routes, xs, t):
                    st["w4a16"][1].append((_label(tile), t))
            for tile in W4A16_STAGE2:
                t = {1: W4A16_STAGE1[0], 2: tile}
                if check(f"{name} w4a16 stage2 {_label(tile)}", "w4a16", weights["w4a16"], routes, xs, t):
                    st["w4a16"][2].append((_label(tile), t))
            wait_for_file()
            for fmt in ("fp8", "w4a16"):
                stage_rows(name, shape, fmt, weights[fmt], routes, xs, st[fmt])
            fastest = {}
            for stage in (1, 2):
                rows = [r for r in res["stages"] if r["fmt"] == "w4a16" and r["stage"] == stage]
                if rows:
                    lab = min(rows, key=lambda r: r["median_us"])["variant"]
                    fastest[stage] = next(t[stage] for l_, t in st["w4a16"][stage] if l_ == lab)
            if len(fastest) == 2:
                best_stages = fastest
                res["best_stages"] = {s: list(t) for s, t in fastest.items()}
                if check(f"{name} w4a16 best-stages", "w4a16", weights["w4a16"], routes, xs, fastest):
                    ok_sets["w4a16"]["best-stages"] = fastest
        wait_for_file()
        for rep in range(2):  # every variant twice, interleaved
            for fmt, variants in ok_sets.items():
                w13, s13, w2, s2 = weights[fmt]
                for label, tiles in variants.items():
                    if time.time() > deadline:
                        continue
                    setup(fmt, tiles)
                    calls = [lambda r=r: fused_moe(xs[r], w13, w2, routes[r][0], routes[r][1], fmt=fmt,
                                                   w13_scale=s13, w2_scale=s2) for r in range(REPS)]
                    us = mb.time_calls(calls, smoke)
                    floor, _, _ = mb.roofline_us(shape, fmt, 1, unique)
                    row = {"shape": name, "M": 1, "fmt": fmt, "variant": label,
                           "tiles": None if tiles is None else {s: list(t) for s, t in tiles.items()}, "rep": rep,
                           "median_us": round(us, 2), "floor_us": round(floor, 2),
                           "pct_roofline": round(100 * floor / us, 1), "device": dev}
                    res["rows"].append(row)
                    save()
                    print(f"[time] {name} M=1 {fmt} {label:18s} {us:8.1f}us {row['pct_roofline']:5.1f}%", flush=True)
        del weights
        if not smoke:
            torch.cuda.empty_cache()
    setup("w4a16", None)
    res["seconds"] = round(time.time() - t_start, 1)
    save()
    mb.print_best_m1(res["rows"])


if __name__ == "__main__":
    main()
