"""Fused MoE at every M from 1 to 16384 on one GPU: zoe's paths against the strongest PyTorch baselines.

    python3 bench/kernels/moe_large_m.py --out DIR [--shapes dsv32] [--ms 1,2,...,16384] [--budget-s 420]
    python3 bench/kernels/moe_large_m.py --crossover DIR/moe_large_m.json     # no GPU: kernels/moe/crossover.json

One run measures its own ceilings (device copy and read bandwidth, bf16 and fp8 matrix rates on random data), then
per shape and M times, for every format:
- "zoe": `fused_moe` as dispatched; the 4-bit formats also "zoe_fused" (the fused kernels, never the dequant
  path) and, from M=256, "zoe_dequant" (`path="dequant"`);
- the baselines: bf16 `torch._grouped_mm`; fp8 `torch._scaled_grouped_mm` with rowwise scales, with and without
  fast accumulation (`use_fast_accum`).
Every timed configuration is first checked against the float32 reference of its own weights (relative error of
the norm, NaN-poisoned scratch for zoe). Each time is a CUDA graph of R back-to-back calls over R routings
(R = 4 for M <= 64, 2 for M <= 512, 1 above), and the zoe and baseline rows also an isolated call after a
write of 4x the L2 (clean L2): the median replay of [flush, call] minus that of [flush] alone.
--side-by-side M,... first times variants side by side, each checked (`side_by_side`): at M=1 fp8 with stage 1 as
a programmatic dependent of x's quantization or not, with and without its L2 prefetch (the --shapes), at larger M
the 4-bit joined tiles against narrower ones (the --shapes); --no-rows then skips the per-M rows.
--vs-bf16 SHAPE:M,... times w4a16 and mxfp4 against bf16 `_grouped_mm` at those cells, --rounds interleaved rounds.
--fp8-numerics adds fp8's error and time per tile height (16..128 rows); --tolerance the errors the GPU tests see,
per format, path and tile height; --dequant-tiles times the dequantization alone; --tile-sweep the 4-bit tiles at
large M (TILE_SWEEP, or those of --tile-variants).
Writes DIR/moe_large_m.json and prints one line per (shape, M).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_bench import (  # noqa: E402
    REPO,
    SHAPES,
    bytes_per_expert,
    make_routing,
    make_weights,
    nan_alloc,
    run_meta,
    scaled_grouped_mm_moe,
    time_eager,
    time_graph,
    time_isolated,
)

MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
FORMATS = ["bf16", "fp8", "w4a16", "mxfp4"]
FOUR_BIT = ("w4a16", "mxfp4")
# Relative error of the norm a checked row must stay under: zoe's formats as the GPU tests' bf16 tolerances (fp8's
# wgmma tiles and w4a16's scaled-then-rounded weights 7e-3, else 4e-3); the baselines by their own numbers
# (`_grouped_mm` rounds the intermediate the reference keeps in float32; the fp8 rowwise baseline quantizes the
# activations per row, against an unquantized reference).
TOLERANCE = {"bf16": 4e-3, "fp8": 7e-3, "w4a16": 7e-3, "mxfp4": 4e-3, "torch_grouped_mm": 1e-2,
             "torch_scaled_grouped_mm": 6e-2}


def measure_ceilings() -> dict:
    """Copy and read bandwidth, bf16 and fp8 matrix rates, measured now on random data (not constants)."""
    import torch

    n = 1 << 31
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    copy_us = time_eager(lambda: b.copy_(a), reps=20)  # a graph's memcpy node ran at 2/3 of the copy kernel
    half = a.view(torch.bfloat16)
    read_us = time_graph([lambda: half.sum(dtype=torch.float32)])
    del a, b, half
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = time_graph([lambda: x @ y])
    xq, yq = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    fp8 = {fast: time_graph([lambda fast=fast: torch._scaled_mm(xq, yq, scale_a=one, scale_b=one,
                                                                 out_dtype=torch.bfloat16, use_fast_accum=fast)])
           for fast in (True, False)}
    props = torch.cuda.get_device_properties(0)
    c = {"copy_Bps": 2 * n / copy_us * 1e6, "read_Bps": n / read_us * 1e6, "bf16_flops": 2 * 8192**3 / mm_us * 1e6,
         "fp8_flops_fast_accum": 2 * 8192**3 / fp8[True] * 1e6, "fp8_flops": 2 * 8192**3 / fp8[False] * 1e6,
         "l2_bytes": props.L2_cache_size, "sms": props.multi_processor_count}
    print("[ceilings] " + ", ".join(f"{k} {v:.4g}" for k, v in c.items()), flush=True)
    return c


def roofline_us(shape: dict, fmt: str, m: int, unique: float, ceil: dict) -> tuple[float, float, float]:
    """(floor us, bytes, flops): the touched experts' weights + x read + out written at the measured read
    bandwidth, against the measured matrix rate (bf16 for the 4-bit formats, whose MMAs run in bf16 on Hopper)."""
    k = shape["k"] + shape["shared"]
    nbytes = unique * bytes_per_expert(shape, fmt) + m * shape["H"] * 2 * 2
    flops = 2.0 * m * k * 3 * shape["H"] * shape["I"]
    peak = ceil["fp8_flops_fast_accum"] if fmt == "fp8" else ceil["bf16_flops"]
    return max(nbytes / ceil["read_Bps"], flops / peak) * 1e6, nbytes, flops


def rowwise_reference(x, w13, w2, s13_row, s2_row, tw, ti):
    """float32 MoE over fp8 weights with rowwise scales (the `_scaled_grouped_mm` baseline's weights)."""
    import torch

    m, h = x.shape
    i = w13.shape[1] // 2
    out = torch.zeros((m, h), dtype=torch.float32, device=x.device)
    flat = ti.reshape(-1).long()
    for e in torch.unique(flat).tolist():
        edges = (flat == e).nonzero().squeeze(1)
        tokens = edges // ti.shape[1]
        gu = x[tokens].float() @ (w13[e].float() * s13_row[e, :, None]).T
        inter = torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]
        out.index_add_(0, tokens, (inter @ (w2[e].float() * s2_row[e, :, None]).T) * tw.reshape(-1)[edges, None])
    return out


class _NoDequant:
    """fused_moe with the dequant path off: the fused kernels as `config` picks them."""

    def __enter__(self):
        fm = sys.modules["zoe_kernels.moe.fused_moe"]  # the package's `fused_moe` is the function
        self.fm, self.saved = fm, fm._dequant_measured_faster
        fm._dequant_measured_faster = lambda *a: False

    def __exit__(self, *exc):
        self.fm._dequant_measured_faster = self.saved


def bench_shape(name: str, ms: list[int], deadline: float, ceil: dict, rows: list, isolated: bool, save) -> None:
    import contextlib

    import torch

    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.config import block_m_for
    from zoe_kernels.moe.fallback import grouped_mm_moe
    from zoe_kernels.moe.reference import fused_moe_reference

    fm = sys.modules["zoe_kernels.moe.fused_moe"]  # the package's `fused_moe` is the function
    shape = SHAPES[name]
    h, e_tot = shape["H"], shape["E"] + shape["shared"]
    weights = {fmt: make_weights(shape, fmt, "cuda") for fmt in FORMATS}
    s13_row = torch.rand((e_tot, 2 * shape["I"]), device="cuda") * 1e-2 + 1e-3
    s2_row = torch.rand((e_tot, h), device="cuda") * 1e-2 + 1e-3
    flush = torch.empty(4 * ceil["l2_bytes"] // 4, dtype=torch.float32, device="cuda")
    for m in ms:
        if time.time() > deadline:
            print(f"[bench] budget spent: skipping {name} M>={m}", flush=True)
            break
        reps = 4 if m <= 64 else 2 if m <= 512 else 1
        routes = [make_routing(shape, m, seed=1000 * m + r, device="cuda") for r in range(reps)]
        xs = [torch.randn((m, h), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        unique = statistics.mean(len(torch.unique(ti)) for _, ti in routes)
        line = [f"{name} M={m:5d}"]

        def record(fmt, provider, make_call, ref, tol, ctx=contextlib.nullcontext, iso=False):
            floor, nbytes, flops = roofline_us(shape, fmt, m, unique, ceil)
            bm = block_m_for(m, shape["k"] + shape["shared"], e_tot, fmt)
            row = {"shape": name, **{k: shape[k] for k in ("H", "I", "E", "k", "shared")}, "M": m, "fmt": fmt,
                   "provider": provider, "block_m": bm, "unique_experts": unique, "bytes": nbytes, "flops": flops,
                   "floor_us": round(floor, 2)}
            try:
                with ctx():
                    out = make_call(0, nan_alloc)()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    row.update(rel_err=err, ok=bool(torch.isfinite(out).all()) and err < tol)
                    del out
                    us = time_graph([make_call(r, torch.empty) for r in range(reps)])
                    row.update(median_us=round(us, 2), pct_roofline=round(100 * floor / us, 1))
                    if iso:
                        ius = time_isolated(make_call(0, torch.empty), flush)
                        row.update(isolated_us=round(ius, 2), isolated_pct_roofline=round(100 * floor / ius, 1))
            except Exception as exc:  # noqa: BLE001 - a path that fails to compile or run is a result
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            rows.append(row)
            torch.cuda.empty_cache()
            flag = "" if row.get("ok") else "!"
            line.append(f"{fmt}/{provider.replace('torch_', 't_')}:{row.get('median_us', float('nan')):.1f}{flag}")
            return row

        for fmt in FORMATS:
            w13, s13, w2, s2 = weights[fmt]
            ref = fused_moe_reference(xs[0], w13, w2, routes[0][0], routes[0][1], fmt=fmt, w13_scale=s13,
                                      w2_scale=s2)

            def zoe(path=None, fmt=fmt, w13=w13, s13=s13, w2=w2, s2=s2):
                return lambda r, alloc: (lambda: fused_moe(xs[r], w13, w2, routes[r][0], routes[r][1], fmt=fmt,
                                                           w13_scale=s13, w2_scale=s2, alloc=alloc, path=path))

            row = record(fmt, "zoe", zoe(), ref, TOLERANCE[fmt], iso=isolated)
            if fmt in FOUR_BIT:
                row["path"] = "dequant" if fm._dequant_measured_faster(m, fmt, torch.device("cuda")) else "fused"
                record(fmt, "zoe_fused", zoe(), ref, TOLERANCE[fmt], ctx=_NoDequant)
                if m >= 256:
                    record(fmt, "zoe_dequant", zoe("dequant"), ref, TOLERANCE[fmt])
            del ref
        w13, _, w2, _ = weights["bf16"]
        ref = fused_moe_reference(xs[0], w13, w2, routes[0][0], routes[0][1], emulate_kernel_rounding=False)
        record("bf16", "torch_grouped_mm", lambda r, alloc: (
            lambda: grouped_mm_moe(xs[r], w13, w2, routes[r][0], routes[r][1])), ref, TOLERANCE["torch_grouped_mm"],
            iso=isolated)
        w13, _, w2, _ = weights["fp8"]
        ref = rowwise_reference(xs[0], w13, w2, s13_row, s2_row, *routes[0])
        for fast in (False, True):
            record("fp8", "torch_scaled_grouped_mm" + ("_fast_accum" if fast else ""), lambda r, alloc, fast=fast: (
                lambda: scaled_grouped_mm_moe(xs[r], w13, w2, s13_row, s2_row, *routes[r], fast=fast)), ref,
                TOLERANCE["torch_scaled_grouped_mm"], iso=isolated)
        del ref
        print("  ".join(line), flush=True)
        save()
    del weights
    torch.cuda.empty_cache()


def fp8_numerics(rows: list, ceil: dict) -> None:
    """fp8's relative error and time per tile height on DeepSeek-V3.2 at M=2048 (every tile height forced): on
    Hopper, tiles of 64+ rows run wgmma, whose fp8 products accumulate at reduced precision within a K step."""
    import torch

    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference

    shape, m = SHAPES["dsv32"], 2048
    w13, s13, w2, s2 = make_weights(shape, "fp8", "cuda")
    tw, ti = make_routing(shape, m, seed=5, device="cuda")
    x = torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda")
    ref = fused_moe_reference(x, w13, w2, tw, ti, fmt="fp8", w13_scale=s13, w2_scale=s2)
    for bm in (16, 32, 64, 128):
        def call(bm=bm):
            return fused_moe(x, w13, w2, tw, ti, fmt="fp8", w13_scale=s13, w2_scale=s2, block_m=bm)
        err = ((call().float() - ref).norm() / ref.norm()).item()
        us = time_graph([call])
        rows.append({"block_m": bm, "rel_err": err, "median_us": round(us, 2)})
        print(f"[fp8-numerics] BLOCK_M={bm:3d}: rel err {err:.3e}, {us:9.1f} us", flush=True)
    del w13, w2


def tolerance_errors(rows: list) -> None:
    """The relative errors the GPU tests see (`tests/kernels/test_moe.py`: Gaussian weights quantized by
    `quantize_weights`, bf16 activations, H=1024, I=384, E=32, top-8, M=333), per format, path and tile height,
    over 4 seeds: what the tests' tolerances are set from."""
    import math

    import torch

    from zoe_kernels.moe import fused_moe, quantize_weights
    from zoe_kernels.moe.reference import fused_moe_reference

    m, h, i, e, k = 333, 1024, 384, 32, 8
    for fmt in FORMATS:
        for seed in range(4):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x = torch.randn((m, h), generator=g, device="cuda").to(torch.bfloat16)
            w13, s13 = quantize_weights(torch.randn((e, 2 * i, h), generator=g, device="cuda") / math.sqrt(h), fmt)
            w2, s2 = quantize_weights(torch.randn((e, h, i), generator=g, device="cuda") / math.sqrt(i), fmt)
            tw, ti = torch.topk(torch.rand((m, e), generator=g, device="cuda").softmax(-1), k)
            tw, ti = tw.float(), ti.int()
            kw = {"fmt": fmt, "w13_scale": s13, "w2_scale": s2}
            ref = fused_moe_reference(x, w13, w2, tw, ti, **kw)
            variants = [(f"dot BLOCK_M={bm}", {"block_m": bm}) for bm in (16, 32, 64, 128)]
            variants += [("gemv", {"path": "gemv"})] + ([("dequant", {"path": "dequant"})] if fmt in FOUR_BIT else [])
            for label, opt in variants:
                r = ref if opt.get("path") != "gemv" or fmt != "fp8" else fused_moe_reference(
                    x, w13, w2, tw, ti, fp8_act_quant=False, **kw)
                out = fused_moe(x, w13, w2, tw, ti, alloc=nan_alloc, **opt, **kw)
                err = ((out.float() - r).norm() / r.norm()).item()
                rows.append({"fmt": fmt, "variant": label, "seed": seed, "rel_err": err,
                             "finite": bool(torch.isfinite(out).all())})
    worst = {}
    for r in rows:
        worst[(r["fmt"], r["variant"])] = max(worst.get((r["fmt"], r["variant"]), 0.0), r["rel_err"])
    for (fmt, variant), err in worst.items():
        print(f"[tolerance] {fmt:6s} {variant:16s} worst rel err over 4 seeds {err:.3e}", flush=True)


# Tiles of the 4-bit tl.dot stages at large M: name -> {stage: (BLOCK_N, BLOCK_K, num_warps, num_stages)} for tiles
# of 64+ rows, plus "join32" (JOIN_K from 32 rows), "swap32" (32-row tiles with the operands swapped, mxfp4) and "bm16"
# (16-row tiles, mxfp4 swapped) for the 32-row regime.
TILE_SWEEP = {
    "committed": {},
    "bk64": {1: (64, 64, 8, 3), 2: (128, 64, 8, 3)},
    "bk64-w4": {1: (64, 64, 4, 3), 2: (128, 64, 4, 3)},
    "bk64-w4-s4": {1: (64, 64, 4, 4), 2: (128, 64, 4, 4)},
    "bk64-w4-n64": {1: (64, 64, 4, 3), 2: (64, 64, 4, 3)},
    "bm64-bk64-w4": {"block_m": 64, 1: (64, 64, 4, 3), 2: (128, 64, 4, 3)},
    "bm64-bk64-w4-s4": {"block_m": 64, 1: (64, 64, 4, 4), 2: (128, 64, 4, 4)},
    "bm128-bk64-w4": {"block_m": 128, 1: (64, 64, 4, 3), 2: (128, 64, 4, 3)},
    "bm256-bk64-w8": {"block_m": 256, 1: (64, 64, 8, 3), 2: (128, 64, 8, 3)},
}


def tile_sweep(rows: list, ms: list[int], names: list[str] | None = None) -> None:
    """The 4-bit formats' fused path on DeepSeek-V3.2 at large M per tile variant (TILE_SWEEP), each checked."""
    import torch

    from zoe_kernels.moe import config
    from zoe_kernels.moe.reference import fused_moe_reference

    fm = sys.modules["zoe_kernels.moe.fused_moe"]
    shape = SHAPES["dsv32"]
    original = fm.stage_config
    for fmt in FOUR_BIT:
        w13, s13, w2, s2 = make_weights(shape, fmt, "cuda")
        for m in ms:
            tw, ti = make_routing(shape, m, seed=9 + m, device="cuda")
            x = torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda")
            ref = fused_moe_reference(x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2)
            bm = config.block_m_for(m, shape["k"], shape["E"], fmt)
            variants = dict(TILE_SWEEP) if bm >= 64 else {"committed": {}, "join32": "join32", "swap32": "swap32",
                                                         "bm16": {"block_m": 16}}
            if names:
                variants = {k: v for k, v in variants.items() if k in names}
            for name, tiles in variants.items():
                block_m = tiles.get("block_m") if isinstance(tiles, dict) else None

                def patched(*a, gated, tiles=tiles, **kw):
                    cfg = original(*a, gated=gated, **kw)
                    if tiles == "join32":
                        return cfg | {"JOIN_K": True}
                    if tiles == "swap32":
                        return cfg | {"SWAP_AB": cfg["BLOCK_N"] >= 64}
                    if isinstance(tiles, dict) and 1 in tiles and cfg["BLOCK_M"] >= 64:
                        bn, bk, warps, stages = tiles[1 if gated else 2]
                        return cfg | {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}
                    return cfg

                fm.stage_config = patched
                try:
                    def call():
                        return fm.fused_moe(x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2, path="dot",
                                            block_m=block_m)
                    out = call()
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    us = time_graph([call])
                    rows.append({"fmt": fmt, "M": m, "variant": name, "tiles": tiles, "rel_err": err,
                                 "median_us": round(us, 2)})
                    print(f"[tile-sweep] {fmt} M={m:5d} {name:12s}: {us:9.1f} us, rel err {err:.2e}", flush=True)
                except Exception as exc:  # noqa: BLE001
                    rows.append({"fmt": fmt, "M": m, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                    print(f"[tile-sweep] {fmt} M={m} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                finally:
                    fm.stage_config = original
            del ref
        del w13, s13, w2, s2
        torch.cuda.empty_cache()


def dequant_tiles(rows: list, ceil: dict) -> None:
    """The dequantization of DeepSeek-V3.2's 256 gate+up weights alone, per tile, against the copy bandwidth."""
    import torch

    import zoe_kernels.moe.dequant as dq
    from zoe_kernels.moe.dequant import dequantize_4bit

    shape = SHAPES["dsv32"]
    saved = dq.DEQUANT_TILE
    for fmt in FOUR_BIT:
        w13, s13, _, _ = make_weights(shape, fmt, "cuda")
        e, n = w13.shape[:2]
        out = torch.empty((e, n, shape["H"]), dtype=torch.bfloat16, device="cuda")
        nbytes = w13.numel() + s13.numel() * s13.element_size() + out.numel() * 2
        for tile in ((16, 128, 4), (8, 128, 4), (16, 64, 2), (8, 256, 4), (16, 256, 8)):
            dq.DEQUANT_TILE = tile
            us = time_graph([lambda: dequantize_4bit(w13, s13, fmt, shape["H"], out, (0, e))])
            rows.append({"fmt": fmt, "tile": list(tile), "median_us": round(us, 2), "bytes": nbytes,
                         "pct_copy_bw": round(100 * nbytes / (us * 1e-6) / ceil["copy_Bps"], 1)})
            print(f"[dequant] {fmt} tile {tile}: {us:9.1f} us, {nbytes / us / 1e6:.2f} TB/s", flush=True)
        dq.DEQUANT_TILE = saved
        del w13, s13, out
        torch.cuda.empty_cache()


def _interleaved(variants: dict, rounds: int = 2) -> dict:
    """{name: median us over `rounds` interleaved timings (A B A B ...)} of {name: (set_up, timer)}; each
    variant's set_up() switches the code to it (and back to the default on the next variant's)."""
    times: dict[str, list] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (set_up, timer) in variants.items():
            set_up()
            times[name].append(timer())
    return {name: statistics.median(v) for name, v in times.items()}


def side_by_side(rows: list, ceil: dict, shapes: list[str], ms: list[int]) -> None:
    """With 1 in `ms`, fp8 at M=1 on `shapes`: stage 1 prefetching 0 or 16 MiB of stage 2's weights into L2
    (`config.DOT_M1_L2_PREFETCH_SHARE` of the device's L2), launched as a programmatic dependent of x's quantization
    or not (`config.DOT_M1_PDL`; `m1_mode`);
    at the larger `ms`, the 4-bit joined tiles as `config` picks them against narrower ones (stage 1's gate and up
    32 columns each, or stage 2 64: fewer registers, three programs per SM instead of two), on the `shapes`. Each variant checked on the same fresh routings with NaN-poisoned scratch (6 at M=1, else 1),
    then timed interleaved (medians of three rounds at M=1, two above) back to back (graph of R calls) and, at M=1,
    as an isolated call with a clean L2."""
    import torch

    from zoe_kernels.moe import config, fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference
    from zoe_kernels.platform import current_target

    flush = torch.empty(4 * ceil["l2_bytes"] // 4, dtype=torch.float32, device="cuda")

    def check(shape, fmt, w, m, variants, seed0):
        """{name: (worst rel err, ok)} over fresh routings (6 at M=1, else 1), every variant on the same inputs."""
        w13, s13, w2, s2 = w
        worst = {name: 0.0 for name in variants}
        for r in range(6 if m == 1 else 1):
            tw, ti = make_routing(shape, m, seed=seed0 + r, device="cuda")
            x = torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda")
            ref = fused_moe_reference(x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2)
            for name, set_up in variants.items():
                set_up()
                out = fused_moe(x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2, alloc=nan_alloc)
                err = ((out.float() - ref).norm() / ref.norm()).item()
                worst[name] = max(worst[name], err if bool(torch.isfinite(out).all()) else float("inf"))
            del ref
        return {name: {"rel_err_worst": err, "ok": err < TOLERANCE[fmt]} for name, err in worst.items()}

    def timers(shape, fmt, w, m, reps, isolated):
        w13, s13, w2, s2 = w
        routes = [make_routing(shape, m, seed=77 + r, device="cuda") for r in range(reps)]
        xs = [torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        calls = [lambda r=r: fused_moe(xs[r], w13, w2, *routes[r], fmt=fmt, w13_scale=s13, w2_scale=s2)
                 for r in range(reps)]
        graph = (lambda: time_graph(calls))
        return graph, (lambda: time_isolated(calls[0], flush)) if isolated else None

    def compare(label, shape_name, fmt, m, variants, reps, isolated):
        """variants: {name: set_up}; the committed default is set again at the end."""
        shape = SHAPES[shape_name]
        w = make_weights(shape, fmt, "cuda")
        unique = statistics.mean(len(torch.unique(make_routing(shape, m, seed=5 + r, device="cuda")[1]))
                                 for r in range(3))
        floor = roofline_us(shape, fmt, m, unique, ceil)[0]
        res = check(shape, fmt, w, m, variants, 300 + m)
        graph_t = {name: timers(shape, fmt, w, m, reps, isolated) for name in variants}
        rounds = 3 if m == 1 else 2
        b2b = _interleaved({name: (set_up, graph_t[name][0]) for name, set_up in variants.items()}, rounds)
        iso = _interleaved({name: (set_up, graph_t[name][1]) for name, set_up in variants.items()},
                           rounds) if isolated else {}
        config.DOT_M1_L2_PREFETCH_SHARE, config.DOT_M1_PDL = default_m1
        fm.stage_config = original
        for name in variants:
            row = {"step": label, "shape": shape_name, "M": m, "fmt": fmt, "variant": name, **res[name],
                   "floor_us": round(floor, 2), "median_us": round(b2b[name], 2),
                   "pct_roofline": round(100 * floor / b2b[name], 1)}
            if isolated:
                row.update(isolated_us=round(iso[name], 2), isolated_pct_roofline=round(100 * floor / iso[name], 1))
            rows.append(row)
            print(f"[side-by-side] {label} {shape_name} M={m} {fmt} {name}: {b2b[name]:.1f} us"
                  + (f" (isolated {iso[name]:.1f})" if isolated else "")
                  + f", floor {floor:.1f}, worst err {res[name]['rel_err_worst']:.2e}"
                  + ("" if res[name]["ok"] else " NOT OK"), flush=True)
        del w
        torch.cuda.empty_cache()

    default_m1 = (config.DOT_M1_L2_PREFETCH_SHARE, config.DOT_M1_PDL)
    l2_bytes = current_target().l2_bytes

    def m1_mode(prefetch_mib, pdl):
        """fp8 M=1: stage 1's L2 prefetch of stage 2's weights in MiB (config.DOT_M1_L2_PREFETCH_SHARE), stage 1 a
        programmatic dependent of x's quantization or an ordinary launch (DOT_M1_PDL)."""
        def set_up():
            config.DOT_M1_PDL = pdl
            config.DOT_M1_L2_PREFETCH_SHARE = (prefetch_mib << 20) / max(1, l2_bytes)
        return set_up

    fp8_variants = {"l2pf16": m1_mode(16, False), "l2pf16_pdl": m1_mode(16, True), "l2pf0_pdl": m1_mode(0, True)}
    fm = sys.modules["zoe_kernels.moe.fused_moe"]
    original = fm.stage_config

    def tiles(s1_bn=None, s2_bn=None):
        """stage_config with the 4-bit joined tiles' BLOCK_N of stage 1 (gate and up each) and stage 2 replaced."""
        def patched(*a, gated, **kw):
            cfg = original(*a, gated=gated, **kw)
            bn = s1_bn if gated else s2_bn
            return cfg | {"BLOCK_N": bn} if bn and cfg.get("JOIN_K") else cfg
        return lambda: setattr(fm, "stage_config", patched if s1_bn or s2_bn else original)

    tile_variants = {"committed": tiles(), "stage1_n32": tiles(s1_bn=32), "stage2_n64": tiles(s2_bn=64)}
    for name in shapes if 1 in ms else []:
        compare("fp8_m1_l2_prefetch", name, "fp8", 1, fp8_variants, 4, True)
    for m in [m for m in ms if m > 1]:
        for name in shapes:
            for fmt in FOUR_BIT:
                compare("4bit_tiles", name, fmt, m, tile_variants, 1, False)
    fm.stage_config = original


def four_bit_vs_bf16(rows: list, ceil: dict, cells: list[tuple[str, int]], rounds: int) -> None:
    """At each (shape, M) of `cells`: w4a16 and mxfp4 `fused_moe` as dispatched against bf16 `torch._grouped_mm` on
    bf16 weights, each checked first (NaN-poisoned scratch, float32 reference of its own weights), then timed
    `rounds` times interleaved (A B C A B C ...), back to back (graph of 1 call) and isolated (clean L2): every
    timing is kept, so the spread shows beside the medians."""
    import torch

    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.fallback import grouped_mm_moe
    from zoe_kernels.moe.reference import fused_moe_reference

    flush = torch.empty(4 * ceil["l2_bytes"] // 4, dtype=torch.float32, device="cuda")
    for name, m in cells:
        shape = SHAPES[name]
        tw, ti = make_routing(shape, m, seed=4242 + m, device="cuda")
        x = torch.randn((m, shape["H"]), dtype=torch.bfloat16, device="cuda")
        calls, checks = {}, {}
        for fmt in ("bf16", *FOUR_BIT):
            w13, s13, w2, s2 = make_weights(shape, fmt, "cuda")
            if fmt == "bf16":
                provider = "torch_grouped_mm"
                call = (lambda w13=w13, w2=w2: grouped_mm_moe(x, w13, w2, tw, ti))
                out = call()
                ref = fused_moe_reference(x, w13, w2, tw, ti, emulate_kernel_rounding=False)
            else:
                provider = f"zoe_{fmt}"
                call = (lambda w13=w13, s13=s13, w2=w2, s2=s2, fmt=fmt, alloc=torch.empty: fused_moe(
                    x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2, alloc=alloc))
                out = call(alloc=nan_alloc)
                ref = fused_moe_reference(x, w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            tol = TOLERANCE["torch_grouped_mm" if fmt == "bf16" else fmt]
            checks[provider] = {"rel_err": err, "ok": bool(torch.isfinite(out).all()) and err < tol}
            calls[provider] = call
            del out, ref
        b2b = {p: [] for p in calls}
        iso = {p: [] for p in calls}
        for _ in range(rounds):
            for p, call in calls.items():
                b2b[p].append(time_graph([call]))
                iso[p].append(time_isolated(call, flush))
        base_b2b, base_iso = statistics.median(b2b["torch_grouped_mm"]), statistics.median(iso["torch_grouped_mm"])
        for p in calls:
            row = {"shape": name, "M": m, "provider": p, **checks[p], "median_us": round(statistics.median(b2b[p]), 1),
                   "isolated_us": round(statistics.median(iso[p]), 1), "us": [round(t, 1) for t in b2b[p]],
                   "isolated_all_us": [round(t, 1) for t in iso[p]]}
            if p != "torch_grouped_mm":
                row.update(speedup_vs_bf16=round(base_b2b / row["median_us"], 3),
                           isolated_speedup_vs_bf16=round(base_iso / row["isolated_us"], 3))
            rows.append(row)
            print(f"[vs-bf16] {name} M={m} {p}: {row['median_us']} us {row['us']} isolated {row['isolated_us']} "
                  f"{row['isolated_all_us']} x{row.get('speedup_vs_bf16', 1.0)} / x"
                  f"{row.get('isolated_speedup_vs_bf16', 1.0)} err {checks[p]['rel_err']:.2e}"
                  + ("" if checks[p]["ok"] else " NOT OK"), flush=True)
        del calls
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- crossover
# The dequant path is taken at an M only where it beat the fused path by more than this factor: two timings of the
# same fused path in one H200 run ("zoe" and "zoe_fused" while the table had no paths) differed by up to 7 % at
# M=16384. Retune from the spread of those two columns in a new run.
DEQUANT_MARGIN = 1.05


def path_table(rows: list[dict]) -> dict:
    """Per 4-bit format: {M: "fused" | "dequant"} at each M where the dequant path was timed: "dequant" where the
    geometric mean over the shapes of fused / dequant time exceeds DEQUANT_MARGIN. The fused time is the mean of the
    "zoe_fused" row and of the "zoe" row where that ran the fused path too (no dequant path in the table yet)."""
    table = {}
    for fmt in FOUR_BIT:
        t = {(r["shape"], r["M"], r["provider"]): r for r in rows
             if r.get("fmt") == fmt and r.get("ok") and "median_us" in r}
        ratios: dict[int, list[float]] = {}
        for (shape, m, provider), r in t.items():
            if provider != "zoe_dequant" or (shape, m, "zoe_fused") not in t:
                continue
            fused = [t[(shape, m, "zoe_fused")]["median_us"]]
            if (shape, m, "zoe") in t and t[(shape, m, "zoe")].get("path") in (None, "fused"):
                fused.append(t[(shape, m, "zoe")]["median_us"])
            ratios.setdefault(m, []).append(statistics.mean(fused) / r["median_us"])
        table[fmt] = {str(m): "dequant" if statistics.geometric_mean(v) > DEQUANT_MARGIN else "fused"
                      for m, v in sorted(ratios.items())}
    return table


def dispatched_us(rows: list[dict], paths: dict) -> dict:
    """{(shape, fmt, M): us} of each format as `fused_moe` dispatches with `paths` (path_table's) in the table: the
    4-bit formats' zoe_dequant row where the path is "dequant", else their zoe_fused row; bf16 and fp8 their zoe."""
    from zoe_kernels.dispatch import moe_path_for

    t = {(r["shape"], r["fmt"], r["M"], r["provider"]): r["median_us"] for r in rows if "median_us" in r}
    out = {}
    for (shape, fmt, m, provider), us in t.items():
        if fmt in FOUR_BIT and provider in ("zoe_fused", "zoe_dequant"):
            table = {"devices": {"default": {fmt: {"path_by_m": paths.get(fmt, {})}}}}
            if provider == "zoe_" + moe_path_for(m, fmt, "default", table):
                out[(shape, fmt, m)] = us
        elif fmt not in FOUR_BIT and provider == "zoe":
            out[(shape, fmt, m)] = us
    return out


def vs_baseline(rows: list[dict], paths: dict) -> dict:
    """Per format, {M: geometric mean over the shapes of baseline time / dispatched time}: bf16 and the 4-bit
    formats against bf16 `torch._grouped_mm`, fp8 against the faster of `torch._scaled_grouped_mm` with and without
    fast accumulation."""
    t = {(r["shape"], r["fmt"], r["M"], r["provider"]): r["median_us"] for r in rows if "median_us" in r}
    zoe = dispatched_us(rows, paths)
    out: dict[str, dict] = {}
    for (shape, fmt, m), us in sorted(zoe.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if fmt == "fp8":
            base = min([t[k] for k in ((shape, "fp8", m, "torch_scaled_grouped_mm"),
                                       (shape, "fp8", m, "torch_scaled_grouped_mm_fast_accum")) if k in t] or [0])
        else:
            base = t.get((shape, "bf16", m, "torch_grouped_mm"), 0)
        if base:
            out.setdefault(fmt, {}).setdefault(m, []).append(base / us)
    return {f: {str(m): round(statistics.geometric_mean(v), 3) for m, v in sorted(by_m.items())}
            for f, by_m in out.items()}


def merge_crossover(results: Path) -> None:
    """Write the measured entry of the results' device into kernels/moe/crossover.json: per format zoe against the
    fallback (zoe_max_m: null, zoe won at every M), the 4-bit formats' path_by_m, and the speedups per M."""
    data = json.loads(results.read_text())
    path = REPO / "kernels" / "moe" / "crossover.json"
    table = json.loads(path.read_text())
    source = str(results.resolve().relative_to(REPO)) if results.resolve().is_relative_to(REPO) else str(results)
    paths = path_table(data["rows"])
    speedups = vs_baseline(data["rows"], paths)
    baseline = {"bf16": "torch_grouped_mm bf16", "fp8": "torch_scaled_grouped_mm rowwise (faster of fast/exact accum)",
                "w4a16": "torch_grouped_mm bf16", "mxfp4": "torch_grouped_mm bf16"}
    entry = {}
    for fmt in FORMATS:
        entry[fmt] = {"zoe_max_m": None, "measured_m": sorted(int(m) for m in speedups.get(fmt, {})),
                      "speedup_vs": baseline[fmt], "speedup_geomean": speedups.get(fmt, {}), "source": source}
        if fmt in FOUR_BIT:
            entry[fmt]["path_by_m"] = paths[fmt]
    table["devices"][data["device"]] = entry
    path.write_text(json.dumps(table, indent=2) + "\n")
    print(f"wrote {path}: " + "; ".join(f"{f}: {v}" for f, v in paths.items()))
    for fmt, by_m in speedups.items():
        print(f"  {fmt} vs {baseline[fmt]}: " + ", ".join(f"{m}: {v}" for m, v in by_m.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--shapes", default="dsv32")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no new M after this many seconds")
    ap.add_argument("--no-isolated", action="store_true", help="back-to-back timings only")
    ap.add_argument("--fp8-numerics", action="store_true")
    ap.add_argument("--dequant-tiles", action="store_true")
    ap.add_argument("--tile-sweep", default="", help="Ms at which to time the 4-bit tiles of TILE_SWEEP")
    ap.add_argument("--tile-variants", default="", help="names of TILE_SWEEP to time (default: all)")
    ap.add_argument("--tolerance", action="store_true", help="the GPU tests' errors per format, path, tile height")
    ap.add_argument("--crossover", type=Path, help="merge a results file's paths into kernels/moe/crossover.json")
    ap.add_argument("--side-by-side", default="", help="Ms to compare variants at (side_by_side): 1 the fp8 M=1 "
                    "L2 prefetch on --shapes, larger M the 4-bit joined tiles' widths; then the --shapes rows "
                    "unless --no-rows")
    ap.add_argument("--no-rows", action="store_true", help="skip the per-M rows of --shapes")
    ap.add_argument("--vs-bf16", default="", help="SHAPE:M,... cells at which to time w4a16 and mxfp4 against bf16 "
                    "_grouped_mm interleaved (four_bit_vs_bf16), --rounds times each")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.crossover:
        merge_crossover(args.crossover)
        return
    if args.out is None:
        ap.error("--out is required")
    t0 = time.time()
    from moe_bench import start_sweep

    if start_sweep():
        sys.exit("moe_large_m.py needs a CUDA GPU")
    from zoe_kernels.platform import device_name

    args.out.mkdir(parents=True, exist_ok=True)
    dev = device_name("cuda")
    meta = run_meta(dev) | {"ceilings": measure_ceilings()}
    rows: list[dict] = []
    result = args.out / "moe_large_m.json"
    if args.fp8_numerics:
        meta["fp8_numerics"] = []
        fp8_numerics(meta["fp8_numerics"], meta["ceilings"])
    if args.tolerance:
        meta["tolerance_errors"] = []
        tolerance_errors(meta["tolerance_errors"])
    if args.tile_sweep:
        meta["tile_sweep"] = []
        tile_sweep(meta["tile_sweep"], [int(m) for m in args.tile_sweep.split(",")],
                   [v for v in args.tile_variants.split(",") if v])
        result.write_text(json.dumps(meta | {"rows": rows}, indent=1))
    if args.dequant_tiles:
        meta["dequant_tiles"] = []
        dequant_tiles(meta["dequant_tiles"], meta["ceilings"])
    def save():
        result.write_text(json.dumps(meta | {"rows": rows}, indent=1))

    if args.side_by_side:
        meta["side_by_side"] = []
        side_by_side(meta["side_by_side"], meta["ceilings"], [n for n in args.shapes.split(",") if n],
                     [int(m) for m in args.side_by_side.split(",") if m])
        save()
    if args.vs_bf16:
        meta["four_bit_vs_bf16"] = []
        four_bit_vs_bf16(meta["four_bit_vs_bf16"], meta["ceilings"],
                         [(c.split(":")[0], int(c.split(":")[1])) for c in args.vs_bf16.split(",")], args.rounds)
        save()
    for name in [n for n in args.shapes.split(",") if n and not args.no_rows]:
        bench_shape(name, [int(m) for m in args.ms.split(",")], t0 + args.budget_s, meta["ceilings"], rows,
                    not args.no_isolated, save)
    meta["path_by_m"] = path_table(rows)
    result.write_text(json.dumps(meta | {"rows": rows}, indent=1))
    print(json.dumps(meta["path_by_m"]))
    bad = [r for r in rows if not r.get("ok")]
    print(f"[done] {len(rows)} rows, {len(bad)} not ok, {time.time() - t0:.0f}s", flush=True)
    for r in bad:
        print(f"[not ok] {r['shape']} M={r['M']} {r['fmt']} {r['provider']}: {r.get('rel_err', r.get('error'))}")


if __name__ == "__main__":
    main()
