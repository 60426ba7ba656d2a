"""Benchmark of zoe's sparse-attention kernels on one GPU: DSA indexer (+ top-2048), CSA top-512, dual-scope decode.

One run does everything a device lease allows (see bench/kernels/sparse_README.md):
  1. runs the kernel tests of these ops on the GPU (pytest), log to $OUT/sparse_pytest.log;
  2. measures the two ceilings (device copy bandwidth, fp8 `torch._scaled_mm` rate);
  3. times each op and its PyTorch baseline at the issue's shapes (median of CUDA-graph replays for
     small calls, `triton.testing.do_bench` median for large ones), checking each result first; dual-scope
     decode also as an isolated call (clean L2), against a float32 reference with NaN-poisoned outputs;
  4. `limits`: where the B=64 dual-scope call's time goes (`sparse_decode_limits.py`);
  5. writes rows (op, shape, provider, config, median_us, TFLOP/s or GB/s, % of roofline, device) to
     $OUT/sparse_results.json and prints a compact table.

Usage: python bench/kernels/sparse_bench.py [--out DIR] [--quick] [--skip-tests] [--sections topk,decode,limits,indexer]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _import_kernels():
    """Makes `zoe_kernels` importable from a plain checkout (the device machine has no editable install)."""
    try:
        import zoe_kernels  # noqa: F401
    except ImportError:
        shim = Path("/tmp/zoe_kernels_shim")
        shim.mkdir(exist_ok=True)
        link = shim / "zoe_kernels"
        if not link.exists():
            link.symlink_to(REPO / "kernels")
        sys.path.insert(0, str(shim))
    sys.path.insert(0, str(REPO))


_import_kernels()

import torch  # noqa: E402
import triton  # noqa: E402

from zoe_kernels.csa import dual_scope_decode, topk  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sparse_decode_limits as limits  # noqa: E402
from moe_bench import time_isolated  # noqa: E402
from zoe_kernels.dsa import indexer_topk, lightning_indexer  # noqa: E402

ROWS: list[dict] = []
META: dict = {}


def log(msg: str) -> None:
    print(msg, flush=True)


def median_us(fn, graph: bool, rep_ms: int = 60) -> float:
    """Median time of fn in microseconds: CUDA-graph replays when `graph` (falls back to plain launches
    if the call cannot be captured), else do_bench's event timing."""
    # do_bench_cudagraph captures and replays fn on a side stream that does not wait for the default stream, so
    # inputs drawn just before (e.g. the decode indices argsort writes) could still be in flight: finish them
    # first (run 15-decode's device-side index assert in the gather+SDPA baseline at B=128; likely run 12's too)
    torch.cuda.synchronize()
    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3
        except Exception as exc:  # noqa: BLE001 - e.g. a baseline that syncs inside
            log(f"  (graph capture failed, timing plain launches: {exc!r:.80})")
            torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def add_row(**row) -> None:
    row["device"] = META.get("device", "?")
    ROWS.append(row)


# ----------------------------------------------------------------------------------------------------- ceilings
def measure_ceilings() -> None:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = median_us(lambda: b.copy_(a), graph=False)
    META["copy_tbps"] = 2 * n / us / 1e6
    x = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    y = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    us = median_us(lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), graph=False)
    META["fp8_tflops"] = 2 * 8192**3 / us / 1e6
    log(f"ceilings: copy {META['copy_tbps']:.2f} TB/s, fp8 mm {META['fp8_tflops']:.0f} TFLOP/s")
    del a, b, x, y


# --------------------------------------------------------------------------------------------------------- top-k
TOPK_CONFIGS = [("auto (default)", dict()), ("sample tile=2048 warps=4", dict(method="sample")),
                ("sample tile=1024 warps=2", dict(method="sample", tile=1024, num_warps=2)),
                ("radix fallback, one program per row", dict(method="radix", tile=4096, num_warps=8))]


def _topk_scores(b: int, n: int, kind: str, gen) -> torch.Tensor:
    scores = torch.randn(b, n, device="cuda", generator=gen)
    if kind == "recent":  # the best entries crowd the end of the row, as recency-biased scores would
        scores += torch.linspace(0, 6, n, device="cuda")
    return scores


def bench_topk(quick: bool) -> None:
    k = 512
    shapes = [(1, 4096, "randn"), (1, 65536, "randn"), (1, 262144, "randn"), (1, 1 << 20, "randn"),
              (32, 1 << 20, "randn"), (8, 262144, "randn"), (1, 1 << 20, "recent")]
    for b, n, kind in shapes:
        gen = torch.Generator(device="cuda").manual_seed(n + b)
        scores = _topk_scores(b, n, kind, gen)
        lengths = torch.full((b,), n, dtype=torch.int32, device="cuda")
        ref = torch.topk(scores, k, dim=1).indices.sort(dim=1).values.int()
        floor_us = b * n * 4 / (META["copy_tbps"] * 1e6)
        shape = f"B={b} N={n}" + ("" if kind == "randn" else f" {kind}")
        base = median_us(lambda: torch.topk(scores, k, dim=1), graph=True)
        add_row(op="csa_topk", shape=shape, provider="torch.topk", config="", median_us=base,
                gbps=b * n * 4 / base / 1e3, pct_roofline=100 * floor_us / base)
        best = None
        for name, cfg in TOPK_CONFIGS[: 1 if quick else None]:
            t0 = time.time()
            out = topk(scores, lengths, k, **cfg)
            torch.cuda.synchronize()
            first_s = time.time() - t0  # includes the compile when this specialisation is new
            ok = bool(torch.equal(out, ref))
            us = median_us(lambda: topk(scores, lengths, k, **cfg), graph=True)
            add_row(op="csa_topk", shape=shape, provider=f"zoe {name}", config=json.dumps(cfg),
                    median_us=us, gbps=b * n * 4 / us / 1e3, pct_roofline=100 * floor_us / us,
                    speedup_vs_torch=base / us, correct=ok, first_call_s=round(first_s, 2))
            if not name.startswith("radix"):
                best = min(best or us, us)
        log(f"topk {shape}: torch {base:.1f} us, zoe best {best:.1f} us ({base / best:.1f}x)")


# ------------------------------------------------------------------------------------------------------- indexer
def _indexer_inputs(m, n, h, ranges, d=128):
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    q = (torch.randn(m, h, d, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
    k = (torch.randn(n, d, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(m, h, device="cuda", generator=gen) / h
    k_scale = torch.rand(n, device="cuda", generator=gen) * 0.1 + 0.01
    pos = torch.arange(m, device="cuda", dtype=torch.int32)
    if ranges == "causal":  # square prefill
        ks, ke = torch.zeros_like(pos), pos + 1
    elif ranges == "prefix":  # skinny: m new tokens after a cached prefix of n - m
        ks, ke = torch.zeros_like(pos), n - m + pos + 1
    else:  # decode: m sequences' next token over the whole context
        ks, ke = torch.zeros_like(pos), torch.full_like(pos, n) - pos
    return q, w, k, k_scale, ks, ke


def _torch_indexer(q, w, k, k_scale, ks, ke, chunk=1024):
    """The baseline: bf16, row-chunked einsum (what a plain PyTorch port computes)."""
    qb, kb = q.to(torch.bfloat16), k.to(torch.bfloat16)
    out = torch.empty(q.shape[0], k.shape[0], device="cuda", dtype=torch.float32)
    cols = torch.arange(k.shape[0], device="cuda")
    for s in range(0, q.shape[0], chunk):
        sc = torch.einsum("mhd,nd->mhn", qb[s:s + chunk], kb).float() * k_scale
        lg = (sc.relu_() * w[s:s + chunk, :, None]).sum(1)
        valid = (cols[None] >= ks[s:s + chunk, None]) & (cols[None] < ke[s:s + chunk, None])
        out[s:s + chunk] = lg.masked_fill_(~valid, float("-inf"))
    return out


def bench_indexer(quick: bool) -> None:
    h = 64
    configs = [dict(layout="keys"), dict(layout="keys", num_warps=8), dict(layout="keys", block_m=4),
               dict(layout="keys", block_m=4, num_warps=8), dict(layout="heads")]  # heads: run 1's kernel
    shapes = [(4096, 4096, "causal"), (8192, 8192, "causal"), (16384, 16384, "causal"),
              (2048, 16384, "prefix"), (4096, 65536, "prefix"), (32, 65536, "decode"), (128, 65536, "decode")]
    if not quick:
        shapes.insert(3, (32768, 32768, "causal"))
    # pick the "keys" config on the 8K square shape, then use it (and run 1's kernel) everywhere
    best_cfg = configs[0]
    for m, n, ranges in shapes:
        inputs = _indexer_inputs(m, n, h, ranges)
        ks, ke = inputs[4], inputs[5]
        valid_pairs = float((ke - ks).clamp_min(0).sum())
        flops_valid = 2.0 * h * 128 * valid_pairs
        bytes_min = m * n * 4 + n * 129 + m * h * 132
        floor_us = max(flops_valid / (META["fp8_tflops"] * 1e6), bytes_min / (META["copy_tbps"] * 1e6))
        shape = f"M={m} N={n} H={h} {ranges}"
        ref = None
        if m * n <= 16384 * 16384:
            ref = _torch_indexer(*inputs)
            base = median_us(lambda: _torch_indexer(*inputs), graph=False, rep_ms=200)
            add_row(op="dsa_indexer", shape=shape, provider="torch bf16 einsum", config="chunk=1024",
                    median_us=base, tflops=flops_valid / base / 1e6, tflops_dense=2.0 * h * 128 * m * n / base / 1e6,
                    pct_roofline=100 * floor_us / base)
        else:
            base = None
        cands = configs if (m, n) == (8192, 8192) and not quick else [best_cfg, configs[-1]]
        timings = []
        for cfg in cands:
            t0 = time.time()
            lightning_indexer(*inputs, **cfg)
            torch.cuda.synchronize()
            first_s = time.time() - t0
            out = lightning_indexer(*inputs, **cfg)
            ok = None
            if ref is not None:
                fin = torch.isfinite(ref)
                ok = bool(torch.equal(torch.isfinite(out), fin)) and float(
                    (out[fin] - ref[fin]).norm() / ref[fin].norm()) < 1e-2  # bf16 baseline vs exact fp8
            us = median_us(lambda: lightning_indexer(*inputs, **cfg), graph=False)
            timings.append((us, cfg))
            add_row(op="dsa_indexer", shape=shape, provider=f"zoe triton fp8 {cfg['layout']}", config=json.dumps(cfg),
                    median_us=us, tflops=flops_valid / us / 1e6, pct_roofline=100 * floor_us / us,
                    speedup_vs_torch=(base / us) if base else None, correct=ok, first_call_s=round(first_s, 2))
        us, cfg = min(timings, key=lambda t: t[0])
        if (m, n) == (8192, 8192) and not quick:
            best_cfg = min(((u, c) for u, c in timings if c["layout"] == "keys"), key=lambda t: t[0])[1]
        log(f"indexer {shape}: zoe {us:.0f} us = {flops_valid / us / 1e6:.0f} TFLOP/s (valid pairs)"
            + (f", torch {base:.0f} us ({base / us:.1f}x)" if base else ""))
        # top-2048 of the logits
        logits = lightning_indexer(*inputs, **best_cfg)
        if ref is not None:
            del ref
        t_ours = median_us(lambda: indexer_topk(logits, ks, ke, k=2048), graph=False)
        t_torch = median_us(lambda: torch.topk(logits, min(2048, n), dim=1), graph=False)
        add_row(op="dsa_indexer_topk2048", shape=shape, provider="zoe triton", config="", median_us=t_ours,
                gbps=m * n * 4 / t_ours / 1e3, pct_roofline=100 * m * n * 4 / (META["copy_tbps"] * 1e6) / t_ours,
                speedup_vs_torch=t_torch / t_ours)
        add_row(op="dsa_indexer_topk2048", shape=shape, provider="torch.topk", config="", median_us=t_torch,
                gbps=m * n * 4 / t_torch / 1e3, pct_roofline=100 * m * n * 4 / (META["copy_tbps"] * 1e6) / t_torch)
        log(f"  top-2048: zoe {t_ours:.0f} us, torch.topk {t_torch:.0f} us")
        del logits, inputs
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- dual-scope decode
def _decode_inputs(b, h=64, d=512, w=128, k=512, nc=4096, ragged=False):
    """Full windows and k selected entries; ragged (a second draw, its own seed): random window lengths (>= 1)
    and selections with a -1 padded tail."""
    gen = torch.Generator(device="cuda").manual_seed(1000 + b if ragged else b)
    q = torch.randn(b, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    win_k = torch.randn(b, w, d, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    win_v = torch.randn(b, w, d, device="cuda", generator=gen).to(torch.bfloat16)
    comp_k = torch.randn(b, nc, d, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    comp_v = torch.randn(b, nc, d, device="cuda", generator=gen).to(torch.bfloat16)
    win_ks = torch.rand(b, w, device="cuda", generator=gen) + 0.5
    comp_ks = torch.rand(b, nc, device="cuda", generator=gen) + 0.5
    idx = torch.argsort(torch.rand(b, nc, device="cuda", generator=gen), dim=1)[:, :k].int()
    if ragged:
        n_sel = torch.randint(k // 4, k + 1, (b, 1), device="cuda", generator=gen)
        idx = torch.where(torch.arange(k, device="cuda")[None] < n_sel, idx, -1)
        win_len = torch.randint(1, w + 1, (b,), device="cuda", generator=gen).int()
    else:
        win_len = torch.full((b,), w, dtype=torch.int32, device="cuda")
    return q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks


def _gather_dequant(q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks):
    """The window and the selected compressed entries as bf16 keys [B, W+k, D] (fp8 times their scales), values
    [B, W+k, D] and validity [B, W+k] (window positions past win_len and -1 selections are invalid)."""
    d = q.shape[2]
    sel = idx.clamp_min(0).long()
    ck = torch.gather(comp_k.view(torch.uint8), 1, sel[..., None].expand(-1, -1, d)).view(torch.float8_e4m3fn)
    ck = ck.to(torch.bfloat16) * torch.gather(comp_ks, 1, sel)[..., None].to(torch.bfloat16)
    cv = torch.gather(comp_v, 1, sel[..., None].expand(-1, -1, d))
    keys = torch.cat([win_k.to(torch.bfloat16) * win_ks[..., None].to(torch.bfloat16), ck], 1)
    vals = torch.cat([win_v, cv], 1)
    valid = torch.cat([torch.arange(win_k.shape[1], device="cuda")[None] < win_len[:, None], idx >= 0], 1)
    return keys, vals, valid


def _torch_dual_scope_sdpa(*args):
    """A baseline: gather and dequantize, then SDPA with the validity as a boolean mask over GQA-expanded heads."""
    q = args[0]
    keys, vals, valid = _gather_dequant(*args)
    return torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], keys[:, None], vals[:, None], attn_mask=valid[:, None, None], enable_gqa=True)[:, :, 0]


def _torch_dual_scope_bmm(*args):
    """The strongest PyTorch path: gather and dequantize, then two batched matmuls over all heads of a sequence
    at once (scores [B, H, W+k] = q K^T, float32 softmax with invalid entries at -inf, out = P V)."""
    q = args[0]
    keys, vals, valid = _gather_dequant(*args)
    scores = torch.bmm(q, keys.transpose(1, 2)).float() * q.shape[2] ** -0.5
    p = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
    return torch.bmm(p.to(torch.bfloat16), vals)


def _reference_f32(*args):
    """The float32 reference: the same gather and dequantization in float32, float32 matmuls (no TF32) and
    softmax."""
    q = args[0].float()
    keys, vals, valid = _gather_dequant_f32(*args)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        scores = torch.bmm(q, keys.transpose(1, 2)) * q.shape[2] ** -0.5
        p = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
        return torch.bmm(p, vals)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def _gather_dequant_f32(q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks):
    """`_gather_dequant` in float32."""
    d = q.shape[2]
    sel = idx.clamp_min(0).long()
    ck = torch.gather(comp_k.view(torch.uint8), 1, sel[..., None].expand(-1, -1, d)).view(torch.float8_e4m3fn)
    ck = ck.float() * torch.gather(comp_ks, 1, sel)[..., None]
    cv = torch.gather(comp_v, 1, sel[..., None].expand(-1, -1, d)).float()
    keys = torch.cat([win_k.float() * win_ks[..., None], ck], 1)
    vals = torch.cat([win_v.float(), cv], 1)
    valid = torch.cat([torch.arange(win_k.shape[1], device="cuda")[None] < win_len[:, None], idx >= 0], 1)
    return keys, vals, valid


def _poisoned_call(fn):
    """fn() with every floating CUDA tensor that torch.empty returns during the call filled with NaN, so an output
    element a kernel fails to write shows as not finite."""
    plain = torch.empty

    def poisoned(*args, **kwargs):
        t = plain(*args, **kwargs)
        if t.is_cuda and t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = poisoned
    try:
        return fn()
    finally:
        torch.empty = plain


def _rel_err(out, ref) -> float:
    """Relative error (Frobenius) of out against ref; NaN when out has a non-finite element."""
    out = out.float()
    return float((out - ref).norm() / ref.norm()) if bool(out.isfinite().all()) else float("nan")


def _isolated_us(fn) -> float:
    """One call with a clean L2 (`moe_bench.time_isolated`: a write of 4x the L2 before it, subtracted)."""
    flush = torch.empty(torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.float32, device="cuda")
    return time_isolated(fn, flush)


# launch parameters of the one-pass kernel timed beside the default in the `limits` section
FUSED_VARIANTS = [("default", {}), ("one warpgroup and loader warps, 256 value columns, 64-entry tiles",
                                     dict(block_dv=256)),
                  ("two warpgroups, 512 value columns, 32-entry tiles", dict(block_dv=512)),
                  ("3 key slots", dict(num_stages=3))]
DECODE_TOL = 1e-2  # relative error against the float32 reference: bf16 outputs and bf16 P in the value MMAs


def _decode_floor(inputs) -> tuple[int, float]:
    """The call's minimum bytes (every valid entry's key row, value row and key scale, the indices, q in and the
    output out) and the time they take at the run's copy bandwidth."""
    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = inputs
    bytes_min = limits.gathered_bytes(win_len, idx, q.shape[2]) + 2 * q.numel() * q.element_size()
    return bytes_min, bytes_min / (META["copy_tbps"] * 1e6)


def bench_decode(quick: bool) -> None:
    for b in (1, 8, 32, 64, 128):
        inputs = _decode_inputs(b)
        q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = inputs
        h, d = q.shape[1], q.shape[2]
        bytes_min, floor_us = _decode_floor(inputs)
        shape = f"B={b} H={h} D={d} W=128 k=512"
        ragged = _decode_inputs(b, ragged=True)
        refs = (_reference_f32(*inputs), _reference_f32(*ragged))
        providers = [("torch gather+bmm", lambda a: _torch_dual_scope_bmm(*a)),
                     ("torch gather+SDPA", lambda a: _torch_dual_scope_sdpa(*a)),
                     ("zoe default", lambda a: dual_scope_decode(*a[:7], win_k_scale=a[7], comp_k_scale=a[8]))]
        times = {}
        for provider, fn in providers:
            try:
                errs = [_rel_err(_poisoned_call(lambda a=a: fn(a)), ref) for a, ref in zip((inputs, ragged), refs)]
                us = median_us(lambda: fn(inputs), graph=True)
                iso = _isolated_us(lambda: fn(inputs))
            except Exception as exc:  # noqa: BLE001 - a path that fails is reported, not fatal
                add_row(op="csa_dual_scope_decode", shape=shape, provider=provider, error=repr(exc)[:200])
                continue
            times[provider] = (us, iso)
            add_row(op="csa_dual_scope_decode", shape=shape, provider=provider, config="", median_us=us,
                    isolated_us=iso, bytes_min=bytes_min, floor_us=floor_us, gbps=bytes_min / us / 1e3,
                    pct_roofline=100 * floor_us / us, isolated_pct_roofline=100 * floor_us / iso,
                    rel_err_f32=errs[0], rel_err_f32_ragged=errs[1],
                    correct=all(e < DECODE_TOL for e in errs))
        base = times.get("torch gather+bmm", (float("nan"),) * 2)
        for r in ROWS:
            if r.get("op") == "csa_dual_scope_decode" and r.get("shape") == shape and "median_us" in r:
                r["speedup_vs_torch"] = base[0] / r["median_us"]
                r["isolated_speedup_vs_torch"] = base[1] / r["isolated_us"]
        zoe = times.get("zoe default", (float("nan"),) * 2)
        log(f"dual-scope B={b}: torch gather+bmm {base[0]:.1f} us (isolated {base[1]:.1f}), zoe {zoe[0]:.1f} "
            f"(isolated {zoe[1]:.1f}, {100 * floor_us / zoe[0]:.1f} % of the byte floor {floor_us:.1f} us), "
            f"{base[0] / zoe[0]:.2f}x")
        del inputs, ragged, refs
        torch.cuda.empty_cache()


def bench_decode_limits(quick: bool) -> None:
    """Where the B=64 call's time goes (`sparse_decode_limits`): the access pattern's own bandwidth, each launch
    apart, the cost outside the entry loop and per tile, the launch against the device."""
    import sparse_decode_profile

    inputs = _decode_inputs(64)
    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = inputs
    h, d = q.shape[1], q.shape[2]
    META["stream_read_tbps"] = limits.stream_read_tbps(median_us)
    gather, grid = limits.gather_call(inputs)
    gbytes = limits.gathered_bytes(win_len, idx, d)
    gather()
    us, iso = median_us(gather, graph=True), _isolated_us(gather)
    META["gather_tbps"], META["gather_isolated_tbps"] = gbytes / us / 1e6, gbytes / iso / 1e6
    add_row(op="decode_limits", shape="B=64 H=64 D=512 W=128 k=512", provider="gather of the call's rows",
            config=f"grid {list(grid)}, 64 rows a program", median_us=us, isolated_us=iso, bytes=gbytes,
            gbps=gbytes / us / 1e3, isolated_gbps=gbytes / iso / 1e3)
    log(f"limits: streaming read {META['stream_read_tbps']:.2f} TB/s, the call's gather {gbytes / 1e6:.1f} MB in "
        f"{us:.1f} us = {META['gather_tbps']:.2f} TB/s (isolated {iso:.1f} us = {META['gather_isolated_tbps']:.2f})")
    # the one-pass kernel's loader warps alone (compute warps that only free the slots): the copies' own time
    for b in (8, 64):
        ins = inputs if b == 64 else _decode_inputs(b)
        for key_slots, value_slots, block_kv in ((3, 2, 64), (2, 2, 64), (2, 3, 64), (1, 1, 64), (2, 2, 32),
                                                 (4, 4, 32), (5, 5, 32)):
            fn = limits.loader_alone_call(ins, key_slots, value_slots, block_kv=block_kv)
            fn()
            lus, liso = median_us(fn, graph=True), _isolated_us(fn)
            add_row(op="decode_limits", shape=f"B={b} H=64 D=512 W=128 k=512", provider="loader warps alone",
                    config=json.dumps({"key_slots": key_slots, "value_slots": value_slots, "block_kv": block_kv}),
                    median_us=lus, isolated_us=liso)
            log(f"limits: B={b} loader alone, {block_kv}-entry tiles, {key_slots} key / {value_slots} value slots: "
                f"{lus:.1f} us (isolated {liso:.1f})")
    call = lambda: dual_scope_decode(*inputs[:7], win_k_scale=win_ks, comp_k_scale=comp_ks)  # noqa: E731
    launches = sparse_decode_profile.per_kernel_us(call)
    whole = median_us(call, graph=True)
    fused = limits.fused_alone_us(call, median_us)
    split = limits.split_alone_us(q, median_us)
    occ = limits.occupancy(64, h, d, win_k.shape[1] + idx.shape[1], idx.shape[1])
    add_row(op="decode_limits", shape="B=64 H=64 D=512 W=128 k=512", provider="zoe default, per launch",
            config=json.dumps(occ), median_us=whole, launches_us=launches, fused_alone_us=fused, split_alone_us=split)
    log(f"limits: call {whole:.1f} us; per launch {launches}; one-pass kernel alone {fused:.1f} us, q split alone "
        f"{split:.1f} us; launch {occ}")
    del inputs
    for heads, warps in ((4, 4), (1, 1), (2, 1), (4, 2), (8, 4), (16, 4), (16, 8)):
        dsd_mod = limits.dsd
        saved = dsd_mod._SPLIT_HEADS, dsd_mod._SPLIT_WARPS
        dsd_mod._SPLIT_HEADS, dsd_mod._SPLIT_WARPS = heads, warps
        try:
            inputs = _decode_inputs(64)
            ref = _reference_f32(*inputs)
            fn = lambda: dual_scope_decode(*inputs[:7], win_k_scale=inputs[7], comp_k_scale=inputs[8])  # noqa: E731
            err = _rel_err(_poisoned_call(fn), ref)
            split = limits.split_alone_us(inputs[0], median_us)
            us = median_us(fn, graph=True)
        finally:
            dsd_mod._SPLIT_HEADS, dsd_mod._SPLIT_WARPS = saved
        add_row(op="decode_limits", shape="B=64 H=64 D=512 W=128 k=512", provider="zoe, q split variant",
                config=f"{heads} heads, {warps} warps a split program", median_us=us, split_alone_us=split,
                rel_err_f32=err, correct=err < DECODE_TOL)
        log(f"limits: q split {heads} heads x {warps} warps: split {split:.2f} us, call {us:.1f} us, err {err:.1e}")
    # the one-pass launch's program shapes and key slots, each with its isolated time and the kernel alone
    for b in (32, 64, 128):
        inputs = _decode_inputs(b)
        ref = _reference_f32(*inputs)
        for name, cfg in FUSED_VARIANTS:
            fn = lambda: dual_scope_decode(*inputs[:7], win_k_scale=inputs[7], comp_k_scale=inputs[8],  # noqa: E731
                                           **cfg)
            err = _rel_err(_poisoned_call(fn), ref)
            us, iso = median_us(fn, graph=True), _isolated_us(fn)
            fused = limits.fused_alone_us(fn, median_us)
            launches = sparse_decode_profile.per_kernel_us(fn)
            _, floor_us = _decode_floor(inputs)
            add_row(op="decode_limits", shape=f"B={b} H=64 D=512 W=128 k=512", provider=f"zoe, {name}",
                    config=json.dumps(cfg), median_us=us, isolated_us=iso, fused_alone_us=fused, launches_us=launches,
                    pct_roofline=100 * floor_us / us, isolated_pct_roofline=100 * floor_us / iso, rel_err_f32=err,
                    correct=err < DECODE_TOL)
            log(f"limits: B={b} {name}: call {us:.1f} us (isolated {iso:.1f}, {100 * floor_us / us:.1f} % of the "
                f"floor), one-pass kernel alone {fused:.1f}, per launch {launches}, err {err:.1e}")
        del inputs, ref
    # time against tiles at one split per sequence: a line's intercept is the cost outside the entry loop
    for b in ((8, 64) if quick else (8, 32, 64, 128)):
        for k in (64, 192, 320, 512):
            inputs = _decode_inputs(b, k=k)
            ref = _reference_f32(*inputs)
            fn = lambda: dual_scope_decode(*inputs[:7], win_k_scale=inputs[7], comp_k_scale=inputs[8],  # noqa: E731
                                           splits=1)
            err = _rel_err(_poisoned_call(fn), ref)
            us = median_us(fn, graph=True)
            fused = limits.fused_alone_us(fn, median_us)
            bytes_min, _ = _decode_floor(inputs)
            bkv = limits.occupancy(b, h, d, 128 + k, k)["tile_entries"]
            tiles = triton.cdiv(128, bkv) + triton.cdiv(k, bkv)
            add_row(op="decode_limits", shape=f"B={b} H=64 D=512 W=128 k={k}", provider="zoe, one split a sequence",
                    config=json.dumps({"tiles": tiles, "tile_entries": bkv, "splits": 1}), median_us=us,
                    fused_alone_us=fused, bytes_min=bytes_min, gbps=bytes_min / us / 1e3, rel_err_f32=err,
                    correct=err < DECODE_TOL)
            log(f"limits: B={b} k={k} ({tiles} tiles of {bkv}): call {us:.1f} us, one-pass kernel alone {fused:.1f} "
                f"us, err {err:.1e}")
            del inputs, ref
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------- main
def run_tests(out_dir: Path, timeout_s: int) -> None:
    env = dict(os.environ, PYTHONPATH=f"/tmp/zoe_kernels_shim:{REPO}:" + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/test_indexer.py",
           "tests/kernels/test_csa_topk.py", "tests/kernels/test_csa_dual_scope.py"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    (out_dir / "sparse_pytest.log").write_text(proc.stdout + proc.stderr)
    tail = (proc.stdout.strip().splitlines() or ["?"])[-1]
    META["pytest"] = {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "summary": tail,
                      "seconds": round(time.time() - t0, 1)}
    log(f"pytest on GPU: rc={proc.returncode} {tail}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/kernels/results"))
    ap.add_argument("--quick", action="store_true", help="one config per op, fewer shapes")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--test-timeout", type=int, default=420,
                    help="seconds for the GPU pytest; a cold Triton cache compiles many top-k sort networks")
    ap.add_argument("--sections", default="topk,decode,limits,indexer")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    META.update(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                command="python bench/kernels/sparse_bench.py " + " ".join(sys.argv[1:]),
                started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not args.skip_tests:
        try:
            run_tests(out_dir, args.test_timeout)
        except subprocess.TimeoutExpired:
            META["pytest"] = {"error": f"timed out after {args.test_timeout} s"}
            log(f"pytest on GPU timed out after {args.test_timeout} s; benchmarking anyway")
    measure_ceilings()
    sections = {"topk": bench_topk, "indexer": bench_indexer, "decode": bench_decode, "limits": bench_decode_limits}
    for name in args.sections.split(","):
        t0 = time.time()
        try:
            sections[name](args.quick)
        except Exception as exc:  # keep the other sections' numbers
            META.setdefault("errors", {})[name] = repr(exc)[:500]
            log(f"section {name} failed: {exc!r}")
        META.setdefault("section_seconds", {})[name] = round(time.time() - t0, 1)
        (out_dir / "sparse_results.json").write_text(json.dumps({"meta": META, "rows": ROWS}, indent=1))
    log("\nop                     shape                          provider                     median_us  TFLOP/s   GB/s  %roof x_torch")
    for r in ROWS:
        if "median_us" not in r:
            continue
        log(f"{r['op'][:22]:22s} {r['shape'][:30]:30s} {r['provider'][:28]:28s} {r['median_us']:9.1f} "
            f"{r.get('tflops') or 0:8.0f} {r.get('gbps') or 0:6.0f} {r.get('pct_roofline') or 0:5.1f} "
            f"{r.get('speedup_vs_torch') or 0:6.2f} {'WRONG' if r.get('correct') is False else ''} {r.get('config', '')}")


if __name__ == "__main__":
    main()
