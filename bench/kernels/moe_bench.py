"""Fused MoE on a GPU: run the kernel tests, then time zoe's kernel, the PyTorch baselines and the roofline.

    python3 bench/kernels/moe_bench.py --out DIR [--shapes dsv32,dsv32-tp8,...] [--ms 1,8,...] [--budget-s 420]

Writes DIR/moe_results.json (one row per shape, M, format and provider: median microseconds, the roofline
floor and the percentage of it reached) and DIR/pytest.log, and prints a compact table. Every point is a
CUDA graph of R back-to-back MoE calls with R different random routings (so small-M points read different
experts and are not served from L2), timed over many replays with CUDA events; the median over replays
divided by R is the time per call. kernels/moe/crossover.json is written from `moe_large_m.py`'s results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Roofline ceilings measured on the H200 (ENVIRONMENT.md, issue 7): read bandwidth and matmul rates.
READ_BW = 4.19e12
PEAK_FLOPS = {"bf16": 684e12, "fp8": 1265e12, "w4a16": 684e12, "mxfp4": 684e12}  # 4-bit runs bf16 MMAs on Hopper
# Model shapes (seed, Fig. 10 / table A1); `shared` experts are always routed, with weight 1.
SHAPES = {
    "dsv32": {"H": 7168, "I": 2048, "E": 256, "k": 8, "shared": 0, "note": "DeepSeek-V3.2, full expert width"},
    "dsv32-tp8": {"H": 7168, "I": 256, "E": 256, "k": 8, "shared": 0, "note": "DeepSeek-V3.2, TP8 slice (I/8)"},
    "kimi-k2": {"H": 7168, "I": 2048, "E": 384, "k": 8, "shared": 0, "note": "Kimi-K2.x"},
    "glm5": {"H": 6144, "I": 2048, "E": 256, "k": 8, "shared": 1, "note": "GLM-5.x, 256 routed + 1 shared"},
    "zaya1": {"H": 2048, "I": 2048, "E": 24, "k": 1, "shared": 0,
              "note": "ZAYA1 (E=24 top-1 per the seed; H=2048 from the model card, I=2048 assumed)"},
}
MS = [1, 8, 16, 64, 256, 512, 1024, 4096]
FORMATS = ["bf16", "fp8", "w4a16", "mxfp4"]
# "zoe": fused_moe as dispatched; "zoe_gemv" / "zoe_dot": one path forced (the small-M GEMV kernels of
# gemv.py, or the tl.dot tiles of grouped_gemm.py), for the side-by-side comparison that sets the dispatch.
PROVIDERS = ["zoe_gemv", "zoe_dot", "fallback_loop", "torch_grouped_mm", "torch_scaled_grouped_mm_rowwise"]
ZOE_PATHS = {"zoe": None, "zoe_gemv": "gemv", "zoe_dot": "dot"}


def _import_zoe_kernels() -> None:
    """Make `zoe_kernels` importable from a plain checkout (it lives in ./kernels)."""
    try:
        import zoe_kernels  # noqa: F401
        return
    except ImportError:
        pass
    shim = Path(tempfile.mkdtemp(prefix="zoe_shim_"))
    (shim / "zoe_kernels").symlink_to(REPO / "kernels")
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"


def run_tests(out: Path, k: str = "") -> dict:
    t0 = time.time()
    cmd = [sys.executable, "-m", "pytest", "tests/kernels/test_moe.py", "-q", "-p", "no:cacheprovider", "-rf"]
    cmd += ["-k", k] if k else []
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"[tests] rc={proc.returncode} {summary} ({time.time() - t0:.0f}s)", flush=True)
    if proc.returncode:
        print("\n".join(proc.stdout.splitlines()[-40:]), flush=True)
    return {"rc": proc.returncode, "summary": summary, "seconds": round(time.time() - t0, 1)}


# ---------------------------------------------------------------------------------------------- inputs
def make_weights(shape: dict, fmt: str, device: str):
    """Random weights of one shape in `fmt` (random bits of the right kind: timing needs no quantizer)."""
    import torch

    from zoe_kernels.platform import fp8_dtype

    e = shape["E"] + shape["shared"]
    h, i = shape["H"], shape["I"]
    dims = [(e, 2 * i, h), (e, h, i)]
    out = []
    for n_rows, k in [(d[1], d[2]) for d in dims]:
        if fmt == "bf16":
            w = torch.randn((e, n_rows, k), dtype=torch.bfloat16, device=device) * 0.02
            s = None
        elif fmt == "fp8":
            bits = torch.randint(0, 256, (e, n_rows, k), dtype=torch.uint8, device=device) & 0xBF  # |v| < 2, no NaN
            w = bits.view(fp8_dtype(device))
            s = torch.rand((e, -(-n_rows // 128), -(-k // 128)), device=device) * 1e-2 + 1e-3
        elif fmt == "w4a16":
            w = torch.randint(0, 256, (e, n_rows, -(-k // 2)), dtype=torch.uint8, device=device)
            s = torch.rand((e, n_rows, -(-k // 128)), device=device) * 1e-2 + 1e-3
        else:
            w = torch.randint(0, 256, (e, n_rows, -(-k // 2)), dtype=torch.uint8, device=device)
            s = torch.randint(118, 126, (e, n_rows, -(-k // 32)), dtype=torch.uint8, device=device)
        out += [w, s]
    return out  # w13, s13, w2, s2


def make_routing(shape: dict, m: int, seed: int, device: str):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    scores = torch.rand((m, shape["E"]), generator=g, device=device)
    tw, ti = torch.topk(scores, shape["k"], dim=1)
    tw = tw / tw.sum(1, keepdim=True)
    if shape["shared"]:
        ti = torch.cat([ti, torch.full((m, 1), shape["E"], device=device, dtype=ti.dtype)], 1)
        tw = torch.cat([tw, torch.ones((m, 1), device=device)], 1)
    return tw.float().contiguous(), ti.int().contiguous()


def bytes_per_expert(shape: dict, fmt: str) -> float:
    p = 3 * shape["H"] * shape["I"]
    return {"bf16": 2 * p, "fp8": p + 4 * p / 128**2, "w4a16": p / 2 + 4 * p / 128, "mxfp4": p / 2 + p / 32}[fmt]


def roofline_us(shape: dict, fmt: str, m: int, unique_experts: float) -> tuple[float, float, float]:
    """(floor in us, bytes, flops): weights of the touched experts + x read + out written, vs MMA rate."""
    k = shape["k"] + shape["shared"]
    nbytes = unique_experts * bytes_per_expert(shape, fmt) + m * shape["H"] * 2 * 2
    flops = 2.0 * m * k * 3 * shape["H"] * shape["I"]
    return max(nbytes / READ_BW, flops / PEAK_FLOPS[fmt]) * 1e6, nbytes, flops


# ---------------------------------------------------------------------------------------------- timing
def start_sweep() -> bool:
    """A sweep script's start: without a GPU (a smoke test of the script) turn Triton's interpreter on before
    the first @triton.jit import, then make `zoe_kernels` importable. Returns whether this is the smoke run."""
    import torch

    smoke = not torch.cuda.is_available()
    if smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    _import_zoe_kernels()
    return smoke


def nan_alloc(shape, dtype, device):
    """fused_moe's scratch allocator for checks: what the kernels do not write stays NaN (integer buffers, counters
    the kernels must zero first, hold a large count)."""
    import torch

    return torch.full(shape, float("nan") if dtype.is_floating_point else 12345, dtype=dtype, device=device)


def check_fused_moe(res: dict, label: str, fmt: str, w, routes, xs, *, path: str | None = None) -> bool:
    """One variant's check before it is timed: fused_moe on the first routing over NaN-poisoned scratch against
    the float32 reference (relative error < 1.5e-2, fp8 2e-2). Appends {"variant", "rel_err", "ok"} to
    res["checks"] and prints it; a variant that fails to compile or run is a result (not ok)."""
    import torch

    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference

    w13, s13, w2, s2 = w
    tw, ti = routes[0]
    try:
        out = fused_moe(xs[0], w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2, alloc=nan_alloc, path=path)
        ref = fused_moe_reference(xs[0], w13, w2, tw, ti, fmt=fmt, w13_scale=s13, w2_scale=s2)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        ok = bool(torch.isfinite(out).all()) and err < (2e-2 if fmt == "fp8" else 1.5e-2)
    except Exception as exc:  # noqa: BLE001 - a variant that fails to compile or run is a result
        err, ok = f"{type(exc).__name__}: {str(exc)[:300]}", False
    res["checks"].append({"variant": label, "rel_err": err, "ok": ok})
    print(f"[check] {label}: {err if isinstance(err, str) else f'{err:.2e}'} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def time_calls(calls, smoke: bool) -> float:
    """Microseconds per call: `time_graph` on the GPU, the host clock over one pass in the smoke run."""
    if not smoke:
        return time_graph(calls)
    t0 = time.perf_counter()
    for fn in calls:
        fn()
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def print_best_m1(rows: list[dict]) -> None:
    """One line per (shape, format): the fastest M=1 row of a sweep."""
    best = {}
    for r in rows:
        if r["M"] == 1:
            key = (r["shape"], r["fmt"])
            if key not in best or r["median_us"] < best[key]["median_us"]:
                best[key] = r
    for (s, f), r in sorted(best.items()):
        print(f"[best] {s} M=1 {f}: {r['variant']} {r['median_us']:.1f}us", flush=True)


def time_graph(calls, *, min_replays: int = 5, target_ms: float = 150.0) -> float:
    """Median microseconds per call of `calls` (a list of closures) captured back to back in one graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    est_ms = (time.perf_counter() - t0) * 1e3
    n = int(max(min_replays, min(200, target_ms / max(est_ms, 1e-3))))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    del graph
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3 / len(calls)


def time_isolated(fn, flush, *, target_ms: float = 100.0) -> float:
    """Microseconds of one call of `fn` with a clean L2: the median replay of a CUDA graph of [write `flush`
    (a buffer several times the L2), fn] minus that of [write `flush`] alone, interleaved."""
    import torch

    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graphs = []
    for body in ((lambda: flush.fill_(1.0)), (lambda: (flush.fill_(1.0), fn()))):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        g.replay()
        graphs.append(g)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graphs[1].replay()
    torch.cuda.synchronize()
    n = int(max(5, min(200, target_ms / max((time.perf_counter() - t0) * 1e3, 1e-3))))
    times = ([], [])
    for _ in range(n):
        for which, g in enumerate(graphs):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            times[which].append(s.elapsed_time(e))
    del graphs
    return (statistics.median(times[1]) - statistics.median(times[0])) * 1e3


def time_eager(fn, reps: int = 5) -> float:
    """Median microseconds of `fn` launched eagerly, each call between two events (for calls of a millisecond or
    more, where launch gaps do not count)."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def scaled_grouped_mm_moe(x, w13, w2, s13_row, s2_row, tw, ti, fast: bool = False):
    """FP8 rowwise baseline: per-row quantized activations, `torch._scaled_grouped_mm` for both GEMMs (`fast`:
    its fast accumulation)."""
    import torch

    m, h = x.shape
    e, two_i = w13.shape[:2]
    i = two_i // 2
    k = ti.shape[1]
    flat = ti.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(e, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    fmax = torch.finfo(w13.dtype).max

    def quant_rows(a):
        s = a.float().abs().amax(1).clamp_min(1e-10) / fmax
        return (a.float() / s[:, None]).to(w13.dtype), s

    xq, xs = quant_rows(x[order // k])
    gu = torch._scaled_grouped_mm(xq, w13.transpose(1, 2), xs, s13_row, offs=offs, out_dtype=torch.bfloat16,
                                  use_fast_accum=fast)
    inter = torch.nn.functional.silu(gu[:, :i]) * gu[:, i:]
    iq, is_ = quant_rows(inter)
    y = torch._scaled_grouped_mm(iq, w2.transpose(1, 2), is_, s2_row, offs=offs, out_dtype=torch.bfloat16,
                                 use_fast_accum=fast)
    out = torch.zeros((m, h), dtype=torch.float32, device=x.device)
    out.index_add_(0, order // k, y.float() * tw.reshape(-1)[order, None])
    return out.to(torch.bfloat16)


# ---------------------------------------------------------------------------------------------- bench
def bench_shape(name: str, shape: dict, ms: list[int], deadline: float, device_name: str, rows: list,
                formats: list[str], providers: set[str]) -> None:
    import torch

    from zoe_kernels.moe import fallback_moe, fused_moe
    from zoe_kernels.moe.fallback import grouped_mm_moe

    h = shape["H"]
    needed = set(formats) | ({"bf16"} if "torch_grouped_mm" in providers else set()) | (
        {"fp8"} if "torch_scaled_grouped_mm_rowwise" in providers else set())
    weights = {fmt: make_weights(shape, fmt, "cuda") for fmt in FORMATS if fmt in needed}
    e_tot = shape["E"] + shape["shared"]
    s13_row = torch.rand((e_tot, 2 * shape["I"]), device="cuda") * 1e-2 + 1e-3
    s2_row = torch.rand((e_tot, h), device="cuda") * 1e-2 + 1e-3
    for m in ms:
        if time.time() > deadline:
            print(f"[bench] budget spent: skipping {name} M>={m}", flush=True)
            return
        reps = 4 if m <= 64 else 2 if m <= 512 else 1
        routes = [make_routing(shape, m, seed=1000 * m + r, device="cuda") for r in range(reps)]
        xs = [torch.randn((m, h), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
        unique = statistics.mean(len(torch.unique(ti)) for _, ti in routes)

        def record(fmt, provider, fn_factory, eager=False):
            floor, nbytes, flops = roofline_us(shape, fmt, m, unique)
            row = {"shape": name, **{k: shape[k] for k in ("H", "I", "E", "k", "shared")}, "M": m, "fmt": fmt,
                   "provider": provider, "unique_experts": unique, "bytes": nbytes, "flops": flops,
                   "floor_us": round(floor, 2), "device": device_name}
            try:
                if eager:
                    us = time_eager(fn_factory(0), reps=3)
                else:
                    us = time_graph([fn_factory(r) for r in range(reps)])
                row.update(median_us=round(us, 2), pct_roofline=round(100 * floor / us, 1))
            except Exception as exc:  # a baseline missing in this torch build is a result, not a crash
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            torch.cuda.empty_cache()
            return row

        line = [f"{name:10s} M={m:5d}"]
        for fmt in formats:
            w13, s13, w2, s2 = weights[fmt]
            for provider, path in ZOE_PATHS.items():
                if provider not in providers:
                    continue
                r = record(fmt, provider, lambda i, w13=w13, s13=s13, w2=w2, s2=s2, fmt=fmt, path=path: (
                    lambda: fused_moe(xs[i], w13, w2, routes[i][0], routes[i][1], fmt=fmt, w13_scale=s13,
                                      w2_scale=s2, path=path)))
                line.append(f"{fmt}/{provider[4:] or 'auto'}:{r.get('median_us', float('nan')):8.1f}us "
                            f"{r.get('pct_roofline', 0):5.1f}%")
            if fmt != "bf16" and m == 1 and "fallback_loop" in providers:
                record(fmt, "fallback_loop", lambda i, w13=w13, s13=s13, w2=w2, s2=s2, fmt=fmt: (
                    lambda: fallback_moe(xs[i], w13, w2, routes[i][0], routes[i][1], fmt=fmt, w13_scale=s13,
                                         w2_scale=s2)), eager=True)
        if "torch_grouped_mm" in providers:
            w13, _, w2, _ = weights["bf16"]
            r = record("bf16", "torch_grouped_mm", lambda i: (
                lambda: grouped_mm_moe(xs[i], w13, w2, routes[i][0], routes[i][1])))
            line.append(f"grouped_mm:{r.get('median_us', float('nan')):9.1f}us")
        if "torch_scaled_grouped_mm_rowwise" in providers:
            w13, _, w2, _ = weights["fp8"]
            r = record("fp8", "torch_scaled_grouped_mm_rowwise", lambda i: (
                lambda: scaled_grouped_mm_moe(xs[i], w13, w2, s13_row, s2_row, routes[i][0], routes[i][1])))
            line.append(f"scaled_gmm:{r.get('median_us', float('nan')):9.1f}us" if "error" not in r
                        else f"scaled_gmm: {r['error'][:60]}")
        print("  ".join(line), flush=True)
    del weights
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- crossover
BASELINE_OF = {"bf16": "torch_grouped_mm", "fp8": "fallback_loop", "w4a16": "fallback_loop",
               "mxfp4": "fallback_loop"}


def dispatched_rows(rows: list[dict]) -> list[dict]:
    """The "zoe" rows (fused_moe as dispatched by `config.use_gemv`) from the timed zoe_gemv / zoe_dot rows,
    for the points where no "zoe" row was timed. Dispatch is a pure function of (M, k, E, format, I), so this
    is the time the default call takes."""
    from zoe_kernels.moe.config import use_gemv

    timed = {(r["shape"], r["M"], r["fmt"], r["provider"]): r for r in rows}
    out = []
    for (shape, m, fmt, provider), r in timed.items():
        if provider not in ("zoe_gemv", "zoe_dot") or (shape, m, fmt, "zoe") in timed:
            continue
        path = "gemv" if use_gemv(m, r["k"] + r["shared"], r["E"] + r["shared"], fmt, r["I"]) else "dot"
        if provider == f"zoe_{path}":
            out.append(r | {"provider": "zoe", "path": path})
    return out


def crossover(rows: list[dict]) -> dict:
    """Per format: the largest measured M up to which zoe beats the fallback at every smaller M (geometric mean
    of the speedups over the shapes); null when zoe wins at every measured M."""
    table = {}
    for fmt in FORMATS:
        zoe = {(r["shape"], r["M"]): r["median_us"] for r in rows
               if r["fmt"] == fmt and r["provider"] == "zoe" and "median_us" in r}
        base = {(r["shape"], r["M"]): r["median_us"] for r in rows
                if r["fmt"] == fmt and r["provider"] == BASELINE_OF[fmt] and "median_us" in r}
        speedups = {}
        for (shape, m), t in zoe.items():
            if (shape, m) in base:
                speedups.setdefault(m, []).append(base[(shape, m)] / t)
        entry = {"baseline": BASELINE_OF[fmt], "measured_m": sorted(speedups),
                 "speedup_geomean": {str(m): round(statistics.geometric_mean(v), 3) for m, v in sorted(speedups.items())}}
        limit = None
        for m in sorted(speedups):
            if statistics.geometric_mean(speedups[m]) < 1.0:
                smaller = [x for x in sorted(speedups) if x < m]
                limit = smaller[-1] if smaller else 0
                break
        if not speedups:  # the fallback loop is only timed at M=1; zoe wins where it was not slower there
            entry["note"] = "no baseline timed"
        entry["zoe_max_m"] = limit
        table[fmt] = entry
    # Informational: where the fp8 rowwise grouped GEMM (a different quantization) would overtake zoe's fp8.
    zoe = {(r["shape"], r["M"]): r["median_us"] for r in rows if r["fmt"] == "fp8" and r["provider"] == "zoe"
           and "median_us" in r}
    rw = {(r["shape"], r["M"]): r["median_us"] for r in rows
          if r["provider"] == "torch_scaled_grouped_mm_rowwise" and "median_us" in r}
    table["fp8"]["vs_scaled_grouped_mm_rowwise"] = {
        str(m): round(statistics.geometric_mean([rw[k] / zoe[k] for k in zoe if k[1] == m and k in rw]), 3)
        for m in sorted({k[1] for k in zoe}) if any(k[1] == m and k in rw for k in zoe)}
    return table


SWEEP = [  # (stage-1 BLOCK_N, stage-2 BLOCK_N, num_stages, num_warps) tried at M=1 on DeepSeek-V3.2
    (32, 128, 4, 4), (16, 64, 4, 4), (64, 128, 4, 4), (32, 64, 4, 4), (32, 128, 3, 4), (32, 128, 5, 4),
    (32, 128, 4, 8), (16, 128, 6, 4),
]


def sweep_m1(out_rows: list, formats: list[str], device_name: str) -> None:
    """Time block-size variants at M=1 (the memory-bound target) by overriding the stage configs."""
    import torch

    import zoe_kernels.moe.fused_moe as _pkg  # noqa: F401
    fm = sys.modules["zoe_kernels.moe.fused_moe"]
    original = fm.stage_config
    shape = SHAPES["dsv32"]
    routes = [make_routing(shape, 1, seed=77 + r, device="cuda") for r in range(4)]
    xs = [torch.randn((1, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(4)]
    unique = statistics.mean(len(torch.unique(ti)) for _, ti in routes)
    for fmt in formats:
        w13, s13, w2, s2 = make_weights(shape, fmt, "cuda")
        for bn1, bn2, stages, warps in SWEEP:
            def patched(*a, gated, **kw):
                cfg = original(*a, gated=gated, **kw)
                return cfg | {"BLOCK_N": bn1 if gated else bn2, "num_stages": stages, "num_warps": warps}
            fm.stage_config = patched
            try:
                us = time_graph([lambda i=i: fm.fused_moe(xs[i], w13, w2, routes[i][0], routes[i][1], fmt=fmt,
                                                          w13_scale=s13, w2_scale=s2) for i in range(4)])
                floor, _, _ = roofline_us(shape, fmt, 1, unique)
                out_rows.append({"fmt": fmt, "bn1": bn1, "bn2": bn2, "stages": stages, "warps": warps,
                                 "median_us": round(us, 2), "pct_roofline": round(100 * floor / us, 1),
                                 "device": device_name})
                print(f"[sweep] {fmt} bn1={bn1} bn2={bn2} stages={stages} warps={warps}: {us:8.1f}us "
                      f"{100 * floor / us:5.1f}%", flush=True)
            except Exception as exc:
                print(f"[sweep] {fmt} {bn1, bn2, stages, warps}: {type(exc).__name__}: {exc}", flush=True)
            finally:
                fm.stage_config = original
        del w13, s13, w2, s2
        torch.cuda.empty_cache()


GEMV_SWEEP = {  # stage -> format -> (BLOCK_N, groups per K step) tried; warps follow config.gemv_warps
    1: {"bf16": [(8, 1), (8, 2), (16, 1), (16, 2)], "fp8": [(16, 1), (16, 2), (16, 4), (32, 2)],
        "w4a16": [(16, 4), (32, 2), (32, 4), (64, 2)], "mxfp4": [(32, 4), (32, 8), (64, 4), (128, 2)]},
    2: {"bf16": [(16, 2), (8, 2)], "fp8": [(32, 2), (16, 4)], "w4a16": [(16, 4), (32, 2)],
        "mxfp4": [(32, 4), (64, 4)]},
}
CHUNK_SWEEP = [1, 2, 8]  # stage 2: top-k slot chunks per token tried at M=1 (run5; run4 had 1 only)


def gemv_sweep(out_rows: list, formats: list[str], shapes: list[str], device_name: str, apply: bool,
               stages: tuple[int, ...] = (1, 2), chunk_sweep: tuple[int, ...] = tuple(CHUNK_SWEEP),
               num_stages: tuple[int, ...] = ()) -> None:
    """Time each GEMV stage alone at M=1 for every tile of GEMV_SWEEP (stage 2 also per number of slot chunks;
    with several, stage 2 adds into float32). With `apply`, put the tile with the best geometric-mean time
    ratio over `shapes` into config.GEMV_TILES for the rest of the run (the printed choice is what config.py
    should hold). With `num_stages`, time instead the configured tiles at each software-pipelining depth."""
    import torch

    from zoe_kernels.moe import config
    from zoe_kernels.moe.gemv import gemv_down_combine, gemv_gate_up

    reps = 4
    for fmt in formats:
        per_shape = {}
        for name in shapes:
            shape = SHAPES[name]
            w13, s13, w2, s2 = make_weights(shape, fmt, "cuda")
            routes = [make_routing(shape, 1, seed=500 + r, device="cuda") for r in range(reps)]
            k = routes[0][1].shape[1]
            xs = [torch.randn((1, shape["H"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            inter = [torch.randn((k, shape["I"]), dtype=torch.bfloat16, device="cuda") for _ in range(reps)]
            outs = {dt: torch.zeros((1, shape["H"]), dtype=dt, device="cuda")
                    for dt in (torch.bfloat16, torch.float32)}
            for stage in stages:
                if num_stages:  # the configured tile only, software-pipelined num_stages deep
                    variants = [(config.GEMV_TILES[fmt][stage], 0, ns) for ns in num_stages]
                else:
                    variants = [(t, c, 1) for t in GEMV_SWEEP[stage][fmt]
                                for c in (chunk_sweep if stage == 2 else (1,))]
                for tile, chunks, ns in variants:
                    chunks = chunks or config.gemv_config(1, shape["H"], fmt, gated=False, top_k=k)["CHUNKS"]
                    rows = k if stage == 1 else 1
                    n = shape["I"] if stage == 1 else shape["H"]
                    cfg = config.gemv_config(rows, n, fmt, gated=stage == 1, tile=tile) | {
                        "CHUNKS": chunks, "num_stages": ns}
                    if stage == 1:
                        calls = [lambda i=i: gemv_gate_up(xs[i], w13, s13, inter[i], routes[i][1], fmt=fmt, cfg=cfg)
                                 for i in range(reps)]
                        nbytes = k * 2 * shape["I"] * bytes_per_expert(shape, fmt) / (3 * shape["I"])
                    else:
                        out = outs[torch.float32 if chunks > 1 else torch.bfloat16]
                        calls = [lambda i=i: gemv_down_combine(inter[i], w2, s2, out, routes[i][0], routes[i][1],
                                                               fmt=fmt, cfg=cfg) for i in range(reps)]
                        nbytes = k * bytes_per_expert(shape, fmt) / 3
                    try:
                        us = time_graph(calls)
                    except Exception as exc:
                        print(f"[gemv-sweep] {name} {fmt} stage{stage} {tile}: {type(exc).__name__}: {exc}")
                        continue
                    row = {"shape": name, "fmt": fmt, "stage": stage, "BLOCK_N": tile[0], "GPI": tile[1],
                           "num_warps": cfg["num_warps"], "chunks": chunks, "num_stages": ns,
                           "median_us": round(us, 2), "pct_read_bw": round(100 * nbytes / READ_BW / (us * 1e-6), 1),
                           "device": device_name}
                    out_rows.append(row)
                    per_shape.setdefault((stage, tile, chunks, ns), {})[name] = us
                    print(f"[gemv-sweep] {name:9s} {fmt:5s} stage{stage} BN={tile[0]:3d} GPI={tile[1]} "
                          f"warps={cfg['num_warps']} chunks={chunks} stages={ns}: {us:7.1f}us "
                          f"{row['pct_read_bw']:5.1f}%",
                          flush=True)
            torch.cuda.empty_cache()
        for stage in stages:
            cands = {key: v for key, v in per_shape.items() if key[0] == stage and len(v) == len(shapes)}
            if not cands:
                continue
            best_of = {name: min(v[name] for v in cands.values()) for name in shapes}
            score = {key: statistics.geometric_mean([v[n] / best_of[n] for n in shapes]) for key, v in cands.items()}
            (_, tile, chunks, ns), ratio = min(score.items(), key=lambda kv: kv[1])
            print(f"[gemv-sweep] best {fmt} stage{stage}: tile {tile} chunks={chunks} stages={ns} (geomean "
                  f"{ratio:.3f} of the per-shape best)", flush=True)
            out_rows.append({"best": True, "fmt": fmt, "stage": stage, "BLOCK_N": tile[0], "GPI": tile[1],
                             "chunks": chunks, "num_stages": ns, "geomean_vs_best": round(ratio, 3)})
            if apply and not num_stages:
                config.GEMV_TILES[fmt][stage] = tile


def merge_results(paths: list[Path], out: Path) -> None:
    """One results file from several runs: a row of a later file replaces the same (shape, M, fmt, provider)."""
    merged: dict[tuple, dict] = {}
    runs = []
    for path in paths:
        data = json.loads(path.read_text())
        runs.append({k: v for k, v in data.items() if k not in ("rows", "crossover")} | {"file": path.name})
        for row in data["rows"]:
            merged[(row["shape"], row["M"], row["fmt"], row["provider"])] = row | {"run": path.name}
    rows = list(merged.values())
    result = {"device": runs[-1]["device"], "runs": runs, "ceilings": runs[-1]["ceilings"],
              "shapes": runs[-1]["shapes"], "crossover": crossover(rows), "rows": rows}
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}: {len(rows)} rows from {len(paths)} runs")


def sweep_parser(doc: str, sweep_shapes: str, budget_s: float) -> argparse.ArgumentParser:
    """The options the tile-sweep scripts share (moe_gemv4_sweep.py, moe_fp8_m1_sweep.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sweep-shapes", default=sweep_shapes)
    ap.add_argument("--bench-shapes", default="dsv32,glm5,dsv32-tp8")
    ap.add_argument("--bench-ms", default="1,8,16,64,256")
    ap.add_argument("--budget-s", type=float, default=budget_s, help="stop starting new points after this long")
    return ap


def run_meta(dev: str) -> dict:
    """What every result JSON records about its run: the command, the device and the versions, the time."""
    import torch
    import triton

    return {"command": "python3 " + " ".join(sys.argv), "device": dev, "torch": torch.__version__,
            "triton": triton.__version__, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="folder for moe_results.json and pytest.log")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--formats", default=",".join(FORMATS), help="formats of zoe's kernel to time")
    ap.add_argument("--providers", default=",".join(PROVIDERS), help=f"subset of {','.join(PROVIDERS)}")
    ap.add_argument("--merge", type=Path, nargs="+", help="merge results files (later ones win) into --out")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this long")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--sweep", default="", help="formats whose M=1 block sizes to sweep first (e.g. fp8,w4a16)")
    ap.add_argument("--gemv-sweep", default="", help="shapes on which to sweep the GEMV tiles at M=1 first")
    ap.add_argument("--apply-sweep", action="store_true", help="use the sweep's best GEMV tiles for this run")
    ap.add_argument("--gemv-sweep-stages", default="1,2", help="which GEMV stages to sweep")
    ap.add_argument("--gemv-num-stages", default="", help="sweep num_stages (e.g. 1,3) of the configured tiles")
    ap.add_argument("--tests-k", default="", help="pytest -k expression selecting the GPU tests to run")
    args = ap.parse_args()
    if args.merge:
        merge_results(args.merge, args.out)
        return
    if args.out is None:
        ap.error("--out is required")
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    _import_zoe_kernels()
    import torch

    if not torch.cuda.is_available():
        sys.exit("moe_bench.py needs a CUDA or ROCm GPU")
    from zoe_kernels.platform import device_name

    dev = device_name("cuda")
    tests = {"skipped": True} if args.skip_tests else run_tests(args.out, args.tests_k)
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    ms = [int(m) for m in args.ms.split(",")]
    rows: list[dict] = []
    meta = run_meta(dev) | {
            "python": platform.python_version(), "tests": tests,
            "ceilings": {"read_bw_Bps": READ_BW, "peak_flops": PEAK_FLOPS}, "shapes": {s: SHAPES[s] for s in shapes}}
    deadline = t_start + args.budget_s
    if args.sweep:
        meta["sweep_m1"] = []
        sweep_m1(meta["sweep_m1"], args.sweep.split(","), dev)
    if args.gemv_sweep:
        meta["gemv_sweep"] = []
        gemv_sweep(meta["gemv_sweep"], args.formats.split(","), args.gemv_sweep.split(","), dev, args.apply_sweep,
                   stages=tuple(int(x) for x in args.gemv_sweep_stages.split(",")),
                   num_stages=tuple(int(x) for x in args.gemv_num_stages.split(",") if x))
        from zoe_kernels.moe import config as _cfg

        meta["gemv_tiles_used"] = {f: {str(st): list(t) for st, t in v.items()} for f, v in _cfg.GEMV_TILES.items()}
        (args.out / "moe_results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    for name in shapes:
        bench_shape(name, SHAPES[name], ms, deadline, dev, rows, args.formats.split(","),
                    set(args.providers.split(",")))
        (args.out / "moe_results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    rows += dispatched_rows(rows)
    meta["crossover"] = crossover(rows)
    (args.out / "moe_results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print(json.dumps({f: e["zoe_max_m"] for f, e in meta["crossover"].items()}))
    print_summary(rows)
    print(f"[done] {time.time() - t_start:.0f}s", flush=True)


def print_summary(rows: list[dict]) -> None:
    """Compact table: per shape and M, gemv / dot microseconds per format (and the ratio dot / gemv)."""
    t = {(r["shape"], r["M"], r["fmt"], r["provider"]): r.get("median_us") for r in rows}
    keys = sorted({(r["shape"], r["M"]) for r in rows}, key=lambda k: (list(SHAPES).index(k[0]), k[1]))
    print("shape      M     " + "  ".join(f"{f:>19s}" for f in FORMATS) + "   (gemv/dot us)")
    for shape, m in keys:
        cells = []
        for f in FORMATS:
            g, d = t.get((shape, m, f, "zoe_gemv")), t.get((shape, m, f, "zoe_dot"))
            cells.append(f"{g or float('nan'):8.1f}/{d or float('nan'):8.1f}  ")
        print(f"{shape:10s} {m:5d} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
