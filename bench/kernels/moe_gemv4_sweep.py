"""Tiles of the word-wise 4-bit GEMV (`kernels/moe/gemv_4bit.py`) on a GPU: check, time, pick, then bench.

    python3 bench/kernels/moe_gemv4_sweep.py --out DIR [--sweep-shapes dsv32,dsv32-tp8] [--formats w4a16,mxfp4]
        [--bench-shapes dsv32,glm5,...] [--bench-ms 1,8,16,64,256] [--budget-s 300]

1. Every (format, stage, tile, packed halves on/off: H2_MODES) of TILES runs once on fresh random weights and
   activations at M=1 with a NaN-poisoned output and is compared with a float64 reference of that stage (the
   dequantized experts); a variant whose relative error passes 1e-3 (stage 1: 1e-2, the bf16 output's rounding;
   stage 2 in packed halves: 2e-3, float16 products and slice sums) or that leaves a NaN is reported and dropped.
2. Each stage alone is timed at M=1 (CUDA graph of 4 calls with different routings, `moe_bench.time_graph`):
   microseconds and the percentage of the 4.19 TB/s read bandwidth for the bytes of the touched experts.
3. The tile (and H2 mode) with the best geometric-mean time over the sweep shapes goes into
   `config.GEMV_4BIT_TILES` (`GEMV_4BIT_H2`) for the rest of the run (print it; config.py should hold it),
   and `moe_bench.bench_shape` times fused_moe
   end to end with those tiles (zoe_gemv) at the bench shapes and Ms, plus fp8 (zoe_dot, its dispatched path)
   at M=1 for the same-run comparison of the issue's target.
Writes DIR/gemv4_sweep.json (the command, the checks, the stage timings, the chosen tiles, the bench rows).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import moe_bench as mb  # noqa: E402

# (BLOCK_N, NS slices of 32 k per K step, num_warps, PREFETCH[, num_stages]); run 1 (results/raw/run8_*) swept
# 9 tiles without prefetch: (8, 8, 1) and (16, 8, 2) led stage 1, (16, 4, 1), (32, 8, 2), (16, 8, 1) stage 2.
TILES = [(8, 8, 1, False), (8, 8, 1, True), (16, 8, 2, False), (16, 8, 2, True), (16, 4, 1, False),
         (16, 4, 1, True), (8, 16, 1, False), (8, 16, 1, True), (8, 4, 1, True), (16, 8, 1, False),
         (16, 8, 1, True), (32, 4, 1, True), (32, 8, 2, False)]  # num_stages 3: no cp.async for these loads (sm_90 PTX)
PORTABLE = [(8, 8, 1, True)]  # also timed with the portable decode, to measure what the PTX decode buys
H2_MODES = [True, False]
KEEP_TILES = False  # --keep-tiles: the bench runs config.py's tiles, not the sweep's best
MIN_PROGRAMS = []  # --min-programs: stage 2 also timed with config.GEMV_MIN_PROGRAMS at these (fewer slot chunks)  # the PTX tiles with packed-half products (gemv_4bit._slice_dot_h2) and with float32 ones


def _stage_reference(stage, x_or_inter, w, s, ids, tw, fmt, n_rows):
    """float64 reference of one stage on the experts the routing touches."""
    import torch

    from zoe_kernels.moe.formats import dequantize_weights

    k_len = x_or_inter.shape[1]
    flat = ids.reshape(-1).tolist()
    if stage == 1:
        rows = []
        for e in flat:
            we = dequantize_weights(w[e:e + 1], s[e:e + 1], fmt, k_len)[0].double()
            gu = we @ x_or_inter[0].double()
            rows.append(torch.nn.functional.silu(gu[:n_rows]) * gu[n_rows:])
        return torch.stack(rows)
    out = torch.zeros((1, w.shape[1]), dtype=torch.float64, device=w.device)
    for slot, e in enumerate(flat):
        we = dequantize_weights(w[e:e + 1], s[e:e + 1], fmt, k_len)[0].double()
        out[0] += tw.reshape(-1)[slot].double() * (we @ x_or_inter[slot].double())
    return out


def sweep(formats, shapes, device_name, checks, timings, deadline):
    import torch

    from zoe_kernels.moe import config
    from zoe_kernels.moe import gemv_4bit
    from zoe_kernels.moe.gemv import gemv_down_combine, gemv_gate_up

    gemv_4bit.RECORD_LAUNCHES = True  # grid and registers of each timed variant

    reps = 4
    best = {}
    for fmt in formats:
        per = {}
        for name in shapes:
            shape = mb.SHAPES[name]
            w13, s13, w2, s2 = mb.make_weights(shape, fmt, "cuda")
            routes = [mb.make_routing(shape, 1, seed=900 + r, device="cuda") for r in range(reps)]
            k = routes[0][1].shape[1]
            xs = [torch.randn((1, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            inter = [torch.randn((k, shape["I"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            out32 = torch.zeros((1, shape["H"]), dtype=torch.float32, device="cuda")
            for stage in (1, 2):
                ref = None
                variants = [(t, True, h2, None) for t in TILES for h2 in H2_MODES] + [(t, False, False, None)
                                                                                      for t in PORTABLE]
                if stage == 2:
                    variants += [(t, True, h2, mp) for mp in MIN_PROGRAMS for t in TILES for h2 in H2_MODES]
                for tile, ptx, h2, mp in variants:
                    if time.time() > deadline:
                        print(f"[gemv4] budget spent: {name} {fmt} stage{stage} {tile} not timed", flush=True)
                        continue
                    rows, n = (k, shape["I"]) if stage == 1 else (1, shape["H"])
                    committed_min = config.GEMV_MIN_PROGRAMS
                    config.GEMV_MIN_PROGRAMS = mp or committed_min
                    cfg = config.gemv_config(rows, n, fmt, gated=stage == 1, top_k=k, words_tile=tile)
                    config.GEMV_MIN_PROGRAMS = committed_min
                    cfg["WORDS"] = cfg["WORDS"] | {"PTX": ptx, "H2": h2}
                    if stage == 1:
                        dst = torch.full((k, shape["I"]), float("nan"), dtype=torch.bfloat16, device="cuda")
                        calls = [lambda i=i, dst=dst: gemv_gate_up(xs[i], w13, s13, dst, routes[i][1], fmt=fmt, cfg=cfg)
                                 for i in range(reps)]
                        nbytes = k * 2 * mb.bytes_per_expert(shape, fmt) / 3
                    else:
                        dst = out32
                        calls = [lambda i=i: gemv_down_combine(inter[i], w2, s2, out32, routes[i][0], routes[i][1],
                                                               fmt=fmt, cfg=cfg) for i in range(reps)]
                        nbytes = k * mb.bytes_per_expert(shape, fmt) / 3
                    label = f"{name} {fmt} stage{stage} tile={tile} ptx={ptx} h2={h2}" + (f" min_programs={mp}" if mp else "")
                    try:  # correctness of this variant on the first routing, poisoned output
                        if stage == 1:
                            calls[0]()
                            if ref is None:
                                ref = _stage_reference(1, xs[0], w13, s13, routes[0][1], None, fmt, shape["I"])
                        else:
                            # slot chunks add atomically into a zeroed buffer (fused_moe's stage 1 zeroes it); one
                            # chunk stores every element: poison
                            out32.fill_(0.0 if cfg["CHUNKS"] > 1 else float("nan"))
                            calls[0]()
                            if ref is None:
                                ref = _stage_reference(2, inter[0], w2, s2, routes[0][1], routes[0][0], fmt, None)
                        got = dst.double()
                        err = ((got - ref).norm() / ref.norm()).item()
                        # stage 1: the bf16 output's rounding; h2: float16 products and slice sums
                        ok = bool(torch.isfinite(got).all()) and err < 1e-3 * (10 if stage == 1 else 2 if h2 else 1)
                        checks.append({"variant": label, "rel_err": err, "ok": ok})
                        if not ok:
                            print(f"[gemv4] FAIL {label}: rel err {err:.2e}", flush=True)
                            continue
                        us = mb.time_graph(calls)
                        launch = dict(gemv_4bit.LAST_LAUNCH)
                    except Exception as exc:
                        print(f"[gemv4] {label}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                        checks.append({"variant": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
                        continue
                    pct = 100 * nbytes / mb.READ_BW / (us * 1e-6)
                    timings.append({"shape": name, "fmt": fmt, "stage": stage, "tile": list(tile), "ptx": ptx, "h2": h2,
                                    "min_programs": mp or config.GEMV_MIN_PROGRAMS,
                                    "chunks": cfg["CHUNKS"], "median_us": round(us, 2), "pct_read_bw": round(pct, 1),
                                    "rel_err": err, "device": device_name, "grid": launch.get("grid"),
                                    "n_regs": launch.get("n_regs")})
                    print(f"[gemv4] {label} chunks={cfg['CHUNKS']} grid={launch.get('grid')} regs={launch.get('n_regs')}: "
                          f"{us:7.1f}us {pct:5.1f}% (err {err:.1e})",
                          flush=True)
                    if ptx and mp is None:  # the pick keeps the committed GEMV_MIN_PROGRAMS
                        per.setdefault((stage, tile, h2), {})[name] = us
            del w13, s13, w2, s2
            torch.cuda.empty_cache()
        for stage in (1, 2):
            cands = {(t, h2): v for (st, t, h2), v in per.items() if st == stage and len(v) == len(shapes)}
            if not cands:
                continue
            best_of = {n: min(v[n] for v in cands.values()) for n in shapes}
            score = {t: statistics.geometric_mean([v[n] / best_of[n] for n in shapes]) for t, v in cands.items()}
            (tile, h2), ratio = min(score.items(), key=lambda kv: kv[1])
            if not KEEP_TILES:
                config.GEMV_4BIT_TILES[fmt][stage] = [tile]
                config.GEMV_4BIT_H2[fmt][stage] = h2
            best[f"{fmt}/{stage}"] = {"tile": list(tile), "h2": h2, "geomean_vs_best": round(ratio, 3)}
            print(f"[gemv4] best {fmt} stage{stage}: {tile} h2={h2} (geomean {ratio:.3f} of the per-shape best)",
                  flush=True)
    return best


def main() -> None:
    ap = mb.sweep_parser(__doc__, "dsv32,dsv32-tp8", 300.0)
    ap.add_argument("--formats", default="w4a16,mxfp4")
    ap.add_argument("--tiles", default="", help="tiles to sweep instead of TILES: BLOCK_N,NS,warps,prefetch(0/1)"
                    "[,num_stages] separated by ';' (num_stages > 1 without prefetch: the pipelined K loop)")
    ap.add_argument("--no-portable", action="store_true", help="skip the portable-decode variants (PORTABLE)")
    ap.add_argument("--h2", default="1,0", help="packed-half modes to sweep per PTX tile (1: on, 0: off)")
    ap.add_argument("--keep-tiles", action="store_true", help="bench config.py's tiles (the sweep only reports)")
    ap.add_argument("--min-programs", default="", help="stage 2 also with GEMV_MIN_PROGRAMS at these values")
    ap.add_argument("--bench-tiles", default="", help='tile lists the bench runs instead of config.py\'s, JSON: '
                    '{"mxfp4": {"1": [[8, 16, 1, 1], [16, 32, 4, 0]]}} (implies --keep-tiles)')
    ap.add_argument("--pdl-compare", action="store_true",
                    help="also time M=1 end to end with config.GEMV_4BIT_PDL off and on")
    args = ap.parse_args()
    if args.tiles:
        TILES[:] = [tuple(int(v) if i != 3 else bool(int(v)) for i, v in enumerate(t.split(",")))
                    for t in args.tiles.split(";")]
    if args.no_portable:
        PORTABLE.clear()
    H2_MODES[:] = [bool(int(v)) for v in args.h2.split(",")]
    global KEEP_TILES
    KEEP_TILES = args.keep_tiles or bool(args.bench_tiles)
    MIN_PROGRAMS[:] = [int(v) for v in args.min_programs.split(",") if v]
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    mb._import_zoe_kernels()
    from zoe_kernels.platform import device_name

    dev = device_name("cuda")
    meta = mb.run_meta(dev)
    checks, timings, rows = [], [], []
    formats = args.formats.split(",")
    deadline = t0 + args.budget_s
    best = sweep(formats, [s for s in args.sweep_shapes.split(",") if s], dev, checks, timings,
                 t0 + 0.6 * args.budget_s)
    from zoe_kernels.moe import config

    for fmt, stages in (json.loads(args.bench_tiles) if args.bench_tiles else {}).items():
        for st, tiles in stages.items():
            config.GEMV_4BIT_TILES[fmt][int(st)] = [tuple(bool(v) if i == 3 else v for i, v in enumerate(t))
                                                    for t in tiles]
    meta["tiles_used"] = {f: {str(st): [list(t) for t in ts] for st, ts in config.GEMV_4BIT_TILES[f].items()}
                          for f in formats}
    meta["h2_used"] = {f: {str(st): h for st, h in config.GEMV_4BIT_H2[f].items()} for f in formats}
    out = args.out / "gemv4_sweep.json"

    def save():
        out.write_text(json.dumps({**meta, "best": best, "checks": checks, "stage_timings": timings, "rows": rows},
                                  indent=1))

    save()
    ms = [int(m) for m in args.bench_ms.split(",")]
    for name in [s for s in args.bench_shapes.split(",") if s]:
        # the issue's reference at every bench shape: fp8 at M=1 in this run, and w4a16's tl.dot path there
        mb.bench_shape(name, mb.SHAPES[name], [1], deadline, dev, rows,
                       ["fp8"] + [f for f in formats if f == "w4a16"], {"zoe_dot"})
        mb.bench_shape(name, mb.SHAPES[name], ms, deadline, dev, rows, formats, {"zoe_gemv"})
        save()
        if args.pdl_compare:  # M=1 again with stage 2 not a dependent launch, then with it (interleaved)
            for pdl in (False, True):
                config.GEMV_4BIT_PDL = pdl
                before = len(rows)
                mb.bench_shape(name, mb.SHAPES[name], [1], deadline, dev, rows, formats, {"zoe_gemv"})
                for r in rows[before:]:
                    r["gemv_4bit_pdl"] = pdl
            config.GEMV_4BIT_PDL = True
            save()
    for r in rows:
        if r["M"] == 1 and "median_us" in r:
            print(f"[m1] {r['shape']:10s} {r['fmt']:6s} {r['provider']:9s} {r['median_us']:8.1f}us "
                  f"{r['pct_roofline']:5.1f}% {'pdl=' + str(r['gemv_4bit_pdl']) if 'gemv_4bit_pdl' in r else ''}",
                  flush=True)
    print(f"[done] {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
