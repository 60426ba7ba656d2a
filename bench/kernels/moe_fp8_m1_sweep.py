"""FP8 fused MoE at M=1 on the tl.dot path (issue 7's 80 % target): where the time goes, tiles, end to end.

    python3 bench/kernels/moe_fp8_m1_sweep.py --out DIR [--sweep-shapes dsv32,dsv32-tp8,glm5]
        [--bench-shapes dsv32,glm5,dsv32-tp8] [--bench-ms 1,8,16,64,256] [--budget-s 150]
        [--steps breakdown,sweep,e2e | candidates]

`--steps breakdown,sweep,e2e` (the default) runs steps 1-3 below; `--steps candidates` checks every whole tile
set of CANDIDATES end to end on every sweep shape (NaN-poisoned scratch, float32 reference) and times it at M=1
against the committed one, interleaved twice; the best geometric mean is reported with whether it was faster on
every shape.

1. Launch by launch, the current M=1 path, each timed alone in a CUDA graph of 4 calls with different routings
   (`moe_bench.time_graph`).
2. The M=1 mode (`config.DOT_M1_TILES`: one tile per edge, no align, stage 1 zeroing the accumulator, split-K in
   stage 2): every stage-1 tile of STAGE1 (with stage 2 at STAGE2[0]) and every stage-2 tile of STAGE2 (with
   stage 1 at STAGE1[0]) first runs fused_moe on the first sweep shape with a NaN-poisoned scratch against the
   float32 reference (w8a8 rounding emulated); then each stage is timed alone on every sweep shape. The best
   geometric mean per stage becomes the candidate `DOT_M1_TILES["fp8"]`, checked once more end to end.
3. fused_moe end to end, the align-based tiles (DOT_M1_TILES empty) against the candidate, interleaved A B A B at
   M=1, at the bench shapes and Ms, with bf16 and the torch baselines as dispatched.
Writes DIR/fp8_m1_sweep.json after every step (partial results survive a timeout).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_bench as mb  # noqa: E402

# (BLOCK_N, num_warps, num_stages[, SPLIT_K]) of each stage tried alone; the first of each is the committed tile.
STAGE1 = [(32, 4, 4), (32, 4, 3), (64, 4, 3), (64, 4, 4), (32, 4, 5)]
STAGE2 = [(128, 4, 4, 2), (128, 4, 4, 1), (128, 4, 3, 1), (64, 4, 4, 1), (64, 4, 4, 2), (128, 4, 3, 4)]
# whole `DOT_M1_TILES["fp8"]` candidates timed end to end; the first is the committed one
CANDIDATES = [
    {1: (32, 4, 4), 2: (128, 4, 4, 2)},
    {1: (64, 4, 4), 2: (128, 4, 4, 2)},
    {1: (32, 4, 4), 2: (128, 4, 3, 4)},
]
REPS = 4


def _inputs(shape, seed0):
    import torch

    routes = [mb.make_routing(shape, 1, seed=seed0 + r, device="cuda") for r in range(REPS)]
    xs = [torch.randn((1, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(REPS)]
    return routes, xs


def _check(shape, w, routes, xs, label, checks, **kw):
    """fused_moe at M=1 with NaN-poisoned scratch against the float32 reference; True when it passes."""
    import torch

    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference

    w13, s13, w2, s2 = w
    tw, ti = routes[0]

    def nan_alloc(shape_, dtype, device):
        return torch.full(shape_, float("nan"), dtype=dtype, device=device)

    out = fused_moe(xs[0], w13, w2, tw, ti, fmt="fp8", w13_scale=s13, w2_scale=s2, alloc=nan_alloc, **kw)
    ref = fused_moe_reference(xs[0], w13, w2, tw, ti, fmt="fp8", w13_scale=s13, w2_scale=s2,
                              fp8_act_quant=kw.get("fp8_act_quant", True) is not False)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    # the GPU tests' bf16 tolerance: M=1 runs 16-row tiles (mma.sync), measured at most 2.8e-3 on these shapes
    ok = bool(torch.isfinite(out).all()) and err < 4e-3
    checks.append({"variant": label, "rel_err": err, "ok": ok})
    print(f"[check] {label}: rel err {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def stage_breakdown(name, shape, w, dev, rows):
    """Each launch of the current M=1 path and of the M=1 mode timed alone."""
    import torch

    from zoe_kernels.moe.act_quant import quantize_act_fp8
    from zoe_kernels.moe.align import moe_align
    from zoe_kernels.moe.config import block_m_for, stage_config
    from zoe_kernels.moe.grouped_gemm import down_combine, gate_up_swiglu

    w13, s13, w2, s2 = w
    routes, xs = _inputs(shape, 500)
    k = routes[0][1].shape[1]
    h, i, e = shape["H"], shape["I"], w13.shape[0]
    bm = block_m_for(1, k, e)
    cfg1 = stage_config(1, k, e, i, h, "fp8", gated=True, block_m=bm)
    cfg2 = stage_config(1, k, e, h, i, "fp8", gated=False, block_m=bm)
    aligns = [moe_align(ti, e, bm) for _, ti in routes]
    xq = [quantize_act_fp8(x) for x in xs]
    inter = [torch.randn((k, i), dtype=torch.bfloat16, device="cuda") for _ in range(REPS)]
    iq = [quantize_act_fp8(t) for t in inter]
    acc = torch.zeros((1, h), dtype=torch.float32, device="cuda")
    st1_bytes = k * 2 * mb.bytes_per_expert(shape, "fp8") / 3
    launches = {
        "align": [lambda r=r: moe_align(routes[r][1], e, bm) for r in range(REPS)],
        "quant_x": [lambda r=r: quantize_act_fp8(xs[r]) for r in range(REPS)],
        "stage1": [lambda r=r: gate_up_swiglu(xq[r][0], xq[r][1], w13, s13, inter[r], aligns[r], top_k=k, kfmt=1,
                                              cfg=cfg1) for r in range(REPS)],
        "quant_inter": [lambda r=r: quantize_act_fp8(inter[r]) for r in range(REPS)],
        "memset": [lambda: torch.zeros((1, h), dtype=torch.float32, device="cuda") for _ in range(REPS)],
        "stage2": [lambda r=r: down_combine(iq[r][0], iq[r][1], w2, s2, acc, routes[r][0], aligns[r], top_k=k,
                                            kfmt=1, cfg=cfg2) for r in range(REPS)],
        "cast": [lambda: acc.to(torch.bfloat16) for _ in range(REPS)],
    }
    for launch, calls in launches.items():
        us = mb.time_graph(calls)
        nbytes = st1_bytes if launch == "stage1" else st1_bytes / 2 if launch == "stage2" else 0
        rows.append({"shape": name, "path": "current", "launch": launch, "median_us": round(us, 2),
                     "pct_read_bw": round(100 * nbytes / mb.READ_BW / (us * 1e-6), 1), "device": dev})
        print(f"[stages] {name} current {launch:12s} {us:7.1f}us", flush=True)


def sweep(names, dev, checks, timings, deadline):
    """Stage tiles of the M=1 mode: check, time alone per shape, pick the best geometric mean per stage."""
    import torch

    from zoe_kernels.moe import config
    from zoe_kernels.moe.grouped_gemm import down_combine, gate_up_swiglu

    per = {1: {}, 2: {}}
    passed = {1: set(), 2: set()}
    for n_i, name in enumerate(names):
        shape = mb.SHAPES[name]
        w = mb.make_weights(shape, "fp8", "cuda")
        w13, s13, w2, s2 = w
        routes, xs = _inputs(shape, 700)
        k = routes[0][1].shape[1]
        h, i = shape["H"], shape["I"]
        inter = [torch.randn((k, i), dtype=torch.bfloat16, device="cuda") for _ in range(REPS)]
        acc = torch.zeros((1, h), dtype=torch.float32, device="cuda")
        aligns = [(ti.reshape(-1), None, None) for _, ti in routes]
        st1_bytes = k * 2 * mb.bytes_per_expert(shape, "fp8") / 3
        for stage, tiles in ((1, STAGE1), (2, STAGE2)):
            for tile in tiles:
                if time.time() > deadline:
                    print(f"[sweep] budget spent: {name} stage{stage} {tile} not timed", flush=True)
                    continue
                t1 = tile if stage == 1 else STAGE1[0]
                t2 = tile if stage == 2 else STAGE2[0]
                config.DOT_M1_TILES["fp8"] = {1: t1, 2: t2}
                label = f"{name} stage{stage} tile={tile}"
                try:
                    if n_i == 0 and not _check(shape, w, routes, xs, f"fp8 m1 {label}", checks):
                        continue
                    if n_i > 0 and tile not in passed[stage]:
                        continue
                    passed[stage].add(tile)
                    cfg1, cfg2 = config.dot_m1_configs(1, "fp8", k, i)
                    if stage == 1:
                        calls = [lambda r=r: gate_up_swiglu(xs[r], None, w13, s13, inter[r], aligns[r], top_k=k,
                                                            kfmt=1, cfg=cfg1, zero=acc) for r in range(REPS)]
                        nbytes = st1_bytes
                    else:
                        calls = [lambda r=r: down_combine(inter[r], None, w2, s2, acc, routes[r][0], aligns[r],
                                                          top_k=k, kfmt=1, cfg=cfg2) for r in range(REPS)]
                        nbytes = st1_bytes / 2
                    us = mb.time_graph(calls)
                except Exception as exc:
                    print(f"[sweep] {label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                    checks.append({"variant": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                    continue
                pct = 100 * nbytes / mb.READ_BW / (us * 1e-6)
                timings.append({"shape": name, "stage": stage, "tile": list(tile), "median_us": round(us, 2),
                                "pct_read_bw": round(pct, 1), "device": dev})
                per[stage].setdefault(tile, {})[name] = us
                print(f"[sweep] {label}: {us:7.1f}us {pct:5.1f}%", flush=True)
        del w, w13, s13, w2, s2
        torch.cuda.empty_cache()
    best = {}
    for stage in (1, 2):
        done = [n for n in names if any(n in v for v in per[stage].values())]
        cands = {t: v for t, v in per[stage].items() if all(n in v for n in done)}
        if not cands:
            return None
        best_of = {n: min(v[n] for v in cands.values()) for n in done}
        score = {t: statistics.geometric_mean([v[n] / best_of[n] for n in done]) for t, v in cands.items()}
        tile, ratio = min(score.items(), key=lambda kv: kv[1])
        best[stage] = {"tile": list(tile), "geomean_vs_best": round(ratio, 3), "shapes": done}
        print(f"[sweep] best stage{stage}: {tile} (geomean {ratio:.3f} of the per-shape best over {done})", flush=True)
    return best


def end_to_end(names, ms, candidate, dev, rows, checks, deadline, save):
    """fused_moe as dispatched: current default (no M=1 mode) vs the candidate, plus w8a16, bf16, baselines."""
    import torch

    from zoe_kernels.moe import config, fused_moe
    from zoe_kernels.moe.fallback import grouped_mm_moe

    weights = {}
    for name in names:
        shape = mb.SHAPES[name]
        e_tot = shape["E"] + shape["shared"]
        weights[name] = (mb.make_weights(shape, "fp8", "cuda"), mb.make_weights(shape, "bf16", "cuda"),
                         torch.rand((e_tot, 2 * shape["I"]), device="cuda") * 1e-2 + 1e-3,
                         torch.rand((e_tot, shape["H"]), device="cuda") * 1e-2 + 1e-3)
    for m in ms:  # every shape at M=1 first: the target
        for name in names:
            shape = mb.SHAPES[name]
            fp8w, bfw, s13_row, s2_row = weights[name]
            if time.time() > deadline:
                print(f"[e2e] budget spent: {name} M={m} not timed", flush=True)
                continue
            reps = 4 if m <= 64 else 2
            routes = [mb.make_routing(shape, m, seed=1000 * m + r, device="cuda") for r in range(reps)]
            xs = [torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            unique = statistics.mean(len(torch.unique(ti)) for _, ti in routes)

            def timed(fmt, w, tiles, **kw):
                config.DOT_M1_TILES.clear()
                config.DOT_M1_TILES.update(tiles)
                w13, s13, w2, s2 = w
                calls = [lambda r=r: fused_moe(xs[r], w13, w2, routes[r][0], routes[r][1], fmt=fmt, w13_scale=s13,
                                               w2_scale=s2, **kw) for r in range(reps)]
                return mb.time_graph(calls)

            variants = [("fp8 current", "fp8", fp8w, {}, {})]
            if candidate:
                variants.append(("fp8 candidate", "fp8", fp8w, candidate, {}))
            if m == 1:
                variants.append(("fp8-w8a16 m1-mode" if candidate else "fp8-w8a16", "fp8", fp8w, candidate,
                                 {"fp8_act_quant": False}))
                if candidate:
                    config.DOT_M1_TILES.clear()
                    config.DOT_M1_TILES.update(candidate)
                    _check(shape, fp8w, routes, xs, f"e2e {name} M=1 fp8 candidate", checks)
            variants.append(("bf16", "bf16", bfw, {}, {}))
            times = {}
            for _ in range(2 if m == 1 else 1):  # A B A B at M=1: drift shows as a spread
                for label, fmt, w, tiles, kw in variants:
                    try:
                        times.setdefault(label, []).append(timed(fmt, w, tiles, **kw))
                    except Exception as exc:
                        print(f"[e2e] {name} M={m} {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            config.DOT_M1_TILES.clear()
            base = {"torch_scaled_grouped_mm_rowwise": lambda r: mb.scaled_grouped_mm_moe(
                        xs[r], fp8w[0], fp8w[2], s13_row, s2_row, routes[r][0], routes[r][1]),
                    "torch_grouped_mm": lambda r: grouped_mm_moe(xs[r], bfw[0], bfw[2], routes[r][0], routes[r][1])}
            for label, fn in base.items():
                try:
                    times[label] = [mb.time_graph([lambda r=r, fn=fn: fn(r) for r in range(reps)])]
                except Exception as exc:
                    print(f"[e2e] {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            line = [f"[e2e] {name:9s} M={m:4d}"]
            for label, ts in times.items():
                fmt = "bf16" if label in ("bf16", "torch_grouped_mm") else "fp8"
                floor, nbytes, _ = mb.roofline_us(shape, fmt, m, unique)
                us = statistics.median(ts)
                rows.append({"shape": name, "M": m, "variant": label, "fmt": fmt, "median_us": round(us, 2),
                             "all_us": [round(t, 2) for t in ts], "floor_us": round(floor, 2), "bytes": nbytes,
                             "unique_experts": unique, "pct_roofline": round(100 * floor / us, 1), "device": dev})
                line.append(f"{label}: {us:.1f}us ({100 * floor / us:.0f}%)")
            print("  ".join(line), flush=True)
            save()


def candidates_e2e(names, dev, rows, checks, save):
    """fused_moe at M=1: the current default and every CANDIDATES entry, each checked (poisoned scratch,
    float32 reference) on every shape, then timed interleaved (current, c0, c1, ..., twice). Returns the
    candidate with the best geometric mean over the shapes, or None."""
    import torch

    from zoe_kernels.moe import config, fused_moe

    per = {}
    for name in names:
        shape = mb.SHAPES[name]
        w = mb.make_weights(shape, "fp8", "cuda")
        w13, s13, w2, s2 = w
        routes, xs = _inputs(shape, 1000)
        unique = statistics.mean(len(torch.unique(ti)) for _, ti in routes)
        floor, nbytes, _ = mb.roofline_us(shape, "fp8", 1, unique)
        variants = [("current", {})]
        for c_i, cand in enumerate(CANDIDATES):
            config.DOT_M1_TILES.clear()
            config.DOT_M1_TILES["fp8"] = cand
            try:
                if _check(shape, w, routes, xs, f"e2e {name} M=1 candidate{c_i} {cand}", checks):
                    variants.append((f"candidate{c_i}", cand))
            except Exception as exc:
                print(f"[cand] {name} candidate{c_i}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        times = {}
        for _ in range(2):
            for label, cand in variants:
                config.DOT_M1_TILES.clear()
                if cand:
                    config.DOT_M1_TILES["fp8"] = cand
                calls = [lambda r=r: fused_moe(xs[r], w13, w2, routes[r][0], routes[r][1], fmt="fp8", w13_scale=s13,
                                               w2_scale=s2) for r in range(REPS)]
                times.setdefault(label, []).append(mb.time_graph(calls))
        config.DOT_M1_TILES.clear()
        for label, cand in variants:
            us = statistics.median(times[label])
            per.setdefault(label, {})[name] = us
            rows.append({"shape": name, "M": 1, "variant": label, "tiles": {str(k): list(v) for k, v in cand.items()},
                         "fmt": "fp8", "median_us": round(us, 2), "all_us": [round(t, 2) for t in times[label]],
                         "floor_us": round(floor, 2), "bytes": nbytes, "unique_experts": unique,
                         "pct_roofline": round(100 * floor / us, 1), "device": dev})
            print(f"[cand] {name:9s} {label:10s} {us:7.1f}us {100 * floor / us:5.1f}%  "
                  f"({', '.join(f'{t:.1f}' for t in times[label])})", flush=True)
        save()
        del w, w13, s13, w2, s2
        torch.cuda.empty_cache()
    full = {lab: v for lab, v in per.items() if len(v) == len(names)}
    if "current" not in full or len(full) < 2:
        return None
    score = {lab: statistics.geometric_mean([v[n] / full["current"][n] for n in names]) for lab, v in full.items()
             if lab != "current"}
    label, ratio = min(score.items(), key=lambda kv: kv[1])
    faster_everywhere = all(full[label][n] < full["current"][n] for n in names)
    print(f"[cand] best {label} {CANDIDATES[int(label[9:])]}: geomean {ratio:.3f} of the current time; faster on "
          f"every shape: {faster_everywhere}", flush=True)
    return {"label": label, "tiles": {str(k): list(v) for k, v in CANDIDATES[int(label[9:])].items()},
            "geomean_vs_current": round(ratio, 4), "faster_on_every_shape": faster_everywhere,
            "scores": {k: round(v, 4) for k, v in score.items()}}


def main() -> None:
    ap = mb.sweep_parser(__doc__, "dsv32,dsv32-tp8,glm5", 150.0)
    ap.add_argument("--steps", default="breakdown,sweep,e2e", help="of candidates,breakdown,sweep,e2e (run11: "
                    "candidates)")
    args = ap.parse_args()
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    mb._import_zoe_kernels()
    import torch

    from zoe_kernels.moe import config
    from zoe_kernels.platform import device_name

    dev = device_name("cuda")
    meta = mb.run_meta(dev) | {"stage1_tiles": STAGE1, "stage2_tiles": STAGE2}
    result = {"stages": [], "checks": [], "sweep": [], "best": None, "candidate": None, "rows": []}
    out = args.out / "fp8_m1_sweep.json"

    def save():
        out.write_text(json.dumps({**meta, **result}, indent=1))

    sweep_names = [s for s in args.sweep_shapes.split(",") if s]
    steps = args.steps.split(",")
    if "candidates" in steps:
        result["candidates"] = CANDIDATES
        result["best_candidate"] = candidates_e2e(sweep_names, dev, result["rows"], result["checks"], save)
        save()
    if "breakdown" in steps:
        shape = mb.SHAPES[sweep_names[0]]
        w = mb.make_weights(shape, "fp8", "cuda")
        stage_breakdown(sweep_names[0], shape, w, dev, result["stages"])
        del w
        torch.cuda.empty_cache()
        save()
    candidate = {}
    if "sweep" in steps:
        best = sweep(sweep_names, dev, result["checks"], result["sweep"], t0 + 0.45 * args.budget_s)
        result["best"] = best
        if best:
            result["candidate"] = {"fp8": {1: best[1]["tile"], 2: best[2]["tile"]}}
            candidate = {"fp8": {1: tuple(best[1]["tile"]), 2: tuple(best[2]["tile"])}}
        save()
    if "e2e" in steps:
        end_to_end([s for s in args.bench_shapes.split(",") if s], [int(m) for m in args.bench_ms.split(",")],
                   candidate, dev, result["rows"], result["checks"], t0 + args.budget_s, save)
    config.DOT_M1_TILES.clear()
    save()
    print(f"[done] {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
