"""CSA dual-scope decode in two passes (`dual_scope_decode(..., schedule=3)`): scores first, then values.

The same attention as `dual_scope_decode` (its docstring has the math, shapes and index conventions), split
so that neither pass carries an online softmax across tiles:

1. scores, programs (sequence b, head block, run of entry tiles): for each tile of BKV entries,
   s = qk_scale * q . K_e (fp8 keys dequantized by their per-entry scale on the scores), the tile's row
   maximum m_t, p = 2^(s - m_t), l_t = sum_e p; it stores p (times the entry's value scale, if any) in the
   dot dtype, and m_t, l_t in float32. Tiles are independent, so nothing serializes them but the loads.
2. values, programs (sequence b, head block x value-column block): the exact softmax statistics from every
   tile's (m_t, l_t) (and the sink), then out = sum_t 2^(m_t - m) / denom * (P_t @ V_t[:, columns]): one
   accumulating dot per tile, with no row maximum or cross-warp sum in the loop.

Why: at one query token per sequence the [heads, D] accumulator of D=512 value columns and the score
tiles of all 64 heads do not fit one program with loads in flight; a one-pass program of 32 heads waits
on its own dots, reductions and barriers (bench/kernels/sparse_README.md). Here the scores pass holds no
accumulator and the values pass holds [heads, DV] with DV < D, and the scores are computed once, not per
value block. Cost: P, [B, tiles, H, BKV] in the dot dtype (5.2 MB at B=64, H=64, 640 entries in bf16),
written once and read once per value block, mostly from L2.

Rounding matches the one-pass kernel's: p is rounded to the dot dtype before the value dot, against its
tile's maximum instead of a running one (both <= 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.dual_scope_tiles import preload_sel, score_q, split_q_fp8, tile_rows, tile_sel
from zoe_kernels.platform import gdc_launch_dependents, gdc_wait, has_gluon_hopper, has_pdl

try:  # the Hopper (Gluon) passes; a Triton without Gluon keeps the portable ones
    from zoe_kernels.csa import dual_scope_two_pass_gluon
except ImportError:  # pragma: no cover - depends on the installed Triton
    dual_scope_two_pass_gluon = None


@triton.jit
def _scores_kernel(
    q_ptr, win_k_ptr, win_len_ptr, comp_k_ptr, comp_idx_ptr, win_ks_ptr, win_vs_ptr, comp_ks_ptr, comp_vs_ptr,
    p_ptr, m_ptr, l_ptr, H, W, KSEL, T, qk_scale_log2,
    stride_qb, stride_qh, stride_wkb, stride_wkn, stride_ckb, stride_ckn, stride_ib,
    stride_wksb, stride_wvsb, stride_cksb, stride_cvsb,
    D: tl.constexpr, BH: tl.constexpr, BKV: tl.constexpr, TILES_PER_PROG: tl.constexpr, RUN_P2: tl.constexpr,
    K_SCALED: tl.constexpr, V_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    QK_F16: tl.constexpr, QK_FP8: tl.constexpr, PDL: tl.constexpr,
):
    """Program (b, head block, tile run): p, m_t and l_t of TILES_PER_PROG consecutive tiles (see the module
    docstring). p_ptr: [B, T, H, BKV]; m_ptr, l_ptr: [B, T, H]."""
    if PDL:
        gdc_launch_dependents()  # the values pass may start its setup; it waits before reading p, m and l
    b = tl.program_id(0)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = heads < H
    dd = tl.arange(0, D)
    bq = b.to(tl.int64)
    q = tl.load(q_ptr + bq * stride_qb + heads[:, None] * stride_qh + dd[None, :], mask=h_ok[:, None], other=0.0)
    if QK_FP8:
        q_hi, q_lo, inv_c = split_q_fp8(q)
        row_scale = qk_scale_log2 * inv_c  # [BH]
    else:
        q, qk_scale_log2 = score_q(q.to(tl.float32).to(DOT_DTYPE), qk_scale_log2, QK_F16)
    win_len = tl.minimum(tl.load(win_len_ptr + b), W)
    win_tiles = tl.cdiv(W, BKV)
    e = tl.arange(0, BKV)
    t0 = tl.program_id(2) * TILES_PER_PROG
    all_sel = preload_sel(comp_idx_ptr, bq, stride_ib, t0, win_tiles, KSEL, e, RUN_P2, BKV)
    # the run's entry scales, loaded before the loop too: a load in the loop that feeds no dot is not
    # pipelined, and each tile would wait on its scattered scale loads (the value pointers are not needed
    # here: the key pointers stand in for them)
    k_rows_all, _v_rows_all, ks_rows, vs_rows, ok_all = tile_rows(
        t0 + tl.arange(0, RUN_P2)[:, None], all_sel, tl.minimum(t0 + TILES_PER_PROG, T), win_tiles, win_len, bq,
        e[None, :], win_k_ptr, win_k_ptr, win_ks_ptr, win_vs_ptr, comp_k_ptr, comp_k_ptr, comp_ks_ptr,
        comp_vs_ptr, stride_wkb, stride_wkn, stride_wkb, stride_wkn, stride_ckb, stride_ckn, stride_ckb, stride_ckn,
        stride_wksb, stride_wvsb, stride_cksb, stride_cvsb, BKV)
    if K_SCALED:
        ks_all = tl.load(ks_rows, mask=ok_all, other=0.0)  # [RUN_P2, BKV]
    if V_SCALED:
        vs_all = tl.load(vs_rows, mask=ok_all, other=0.0)
    for t in range(t0, tl.minimum(t0 + TILES_PER_PROG, T)):
        sel = tile_sel(all_sel, t - t0, RUN_P2)
        k_rows, _v_rows, _ks_rows, _vs_rows, ok = tile_rows(
            t, sel, T, win_tiles, win_len, bq, e, win_k_ptr, win_k_ptr, win_ks_ptr, win_vs_ptr, comp_k_ptr,
            comp_k_ptr, comp_ks_ptr, comp_vs_ptr, stride_wkb, stride_wkn, stride_wkb, stride_wkn, stride_ckb,
            stride_ckn, stride_ckb, stride_ckn, stride_wksb, stride_wvsb, stride_cksb, stride_cvsb, BKV)
        kt = tl.load(k_rows[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
        if QK_FP8:  # two fp8 MMAs on the keys as loaded
            s = tl.dot(q_lo, tl.trans(kt), tl.dot(q_hi, tl.trans(kt))) * row_scale[:, None]  # [BH, BKV], log2
        else:
            s = tl.dot(q, tl.trans(kt.to(q.dtype)), input_precision=PRECISION) * qk_scale_log2
        if K_SCALED:
            s = s * tile_sel(ks_all, t - t0, RUN_P2)[None, :]
        s = tl.where(ok[None, :], s, float("-inf"))
        m_t = tl.max(s, axis=1)
        p = tl.exp2(s - tl.where(m_t == float("-inf"), 0.0, m_t)[:, None])
        l_t = tl.sum(p, axis=1)
        if V_SCALED:
            p = p * tile_sel(vs_all, t - t0, RUN_P2)[None, :]
        row = (bq * T + t) * H + heads
        tl.store(p_ptr + row[:, None] * BKV + e[None, :], p.to(p_ptr.dtype.element_ty), mask=h_ok[:, None])
        tl.store(m_ptr + row, m_t, mask=h_ok)
        tl.store(l_ptr + row, l_t, mask=h_ok)


@triton.jit
def _values_kernel(
    win_v_ptr, win_len_ptr, comp_v_ptr, comp_idx_ptr, p_ptr, m_ptr, l_ptr, sink_ptr, out_ptr, H, W, KSEL, T,
    stride_wvb, stride_wvn, stride_cvb, stride_cvn, stride_ib, stride_ob, stride_oh,
    D: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BKV: tl.constexpr, T_P2: tl.constexpr,
    SEL_TILES: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, HAS_SINK: tl.constexpr, PDL: tl.constexpr,
):
    """Program (b, head block x value-column block): out[b, heads, columns] from the scores pass's p, m_t, l_t
    and the values. A head with no entry (and no sink) gets zeros."""
    b = tl.program_id(0)
    n_vblk: tl.constexpr = D // DV
    heads = (tl.program_id(1) // n_vblk) * BH + tl.arange(0, BH)
    h_ok = heads < H
    dv = (tl.program_id(1) % n_vblk) * DV + tl.arange(0, DV)
    bq = b.to(tl.int64)
    win_len = tl.minimum(tl.load(win_len_ptr + b), W)
    win_tiles = tl.cdiv(W, BKV)
    e = tl.arange(0, BKV)
    if PDL:
        gdc_wait()  # the scores pass's p, m and l are complete from here on
    # the softmax statistics over all tiles: max m, denominator sum_t l_t 2^(m_t - m) (+ the sink's term)
    tt = tl.arange(0, T_P2)
    stat = (bq * T + tt[:, None]) * H + heads[None, :]
    stat_ok = (tt[:, None] < T) & h_ok[None, :]
    m_all = tl.load(m_ptr + stat, mask=stat_ok, other=float("-inf"))  # [T_P2, BH]
    l_all = tl.load(l_ptr + stat, mask=stat_ok, other=0.0)
    top = tl.max(m_all, axis=0)
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
        top = tl.maximum(top, sink)
    top = tl.where(top == float("-inf"), 0.0, top)
    denom = tl.sum(l_all * tl.exp2(m_all - top[None, :]), axis=0)
    if HAS_SINK:
        denom += tl.exp2(sink - top)
    inv = tl.where(denom > 0, 1.0 / tl.where(denom > 0, denom, 1.0), 0.0)
    # every tile's factor 2^(m_t - m) / denom up front (a load in the loop that feeds no dot is not pipelined)
    f_all = tl.exp2(m_all - top[None, :]) * inv[None, :]  # [T_P2, BH]

    acc = tl.zeros([BH, DV], tl.float32)
    all_sel = preload_sel(comp_idx_ptr, bq, stride_ib, win_tiles, win_tiles, KSEL, e, SEL_TILES, BKV)
    for t in range(0, T):
        sel = tile_sel(all_sel, t - win_tiles, SEL_TILES)
        # only the value pointers are used: the value pointers stand in for the others
        _k_rows, v_rows, _ks_rows, _vs_rows, ok = tile_rows(
            t, sel, T, win_tiles, win_len, bq, e, win_v_ptr, win_v_ptr, win_len_ptr, win_len_ptr, comp_v_ptr,
            comp_v_ptr, comp_idx_ptr, comp_idx_ptr, stride_wvb, stride_wvn, stride_wvb, stride_wvn, stride_cvb,
            stride_cvn, stride_cvb, stride_cvn, 0, 0, 0, 0, BKV)
        vt = tl.load(v_rows[:, None] + dv[None, :], mask=ok[:, None], other=0.0)
        row = (bq * T + t) * H + heads
        pt = tl.load(p_ptr + row[:, None] * BKV + e[None, :], mask=h_ok[:, None], other=0.0)
        acc += tile_sel(f_all, t, T_P2)[:, None] * tl.dot(pt, vt.to(DOT_DTYPE), input_precision=PRECISION)
    tl.store(out_ptr + bq * stride_ob + heads[:, None] * stride_oh + dv[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=h_ok[:, None])


def two_pass_decode(q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, wvs, cks, cvs, sink, scale_log2,
                    out, *, k_scaled: bool, v_scaled: bool, qk_fp16: bool, qk_fp8: bool, block_h: int, block_kv: int,
                    block_dv: int, tiles_per_prog: int, num_warps: int, values_warps: int, num_stages: int,
                    values_stages: int, dot_dtype, precision: str, gluon_values: bool | None = None,
                    gluon_scores: bool | None = None) -> torch.Tensor:
    """The two launches on tensors `dual_scope_decode` has checked and prepared (scales as float32 [B, n] or
    [B, 1] placeholders, comp_idx and win_len int32); writes and returns `out` [B, H, D]. gluon_scores /
    gluon_values: that pass in Gluon (`dual_scope_two_pass_gluon`, Hopper only; None: where it can run)."""
    bsz, heads, d = q.shape
    w_entries, k_sel = win_k.shape[1], comp_idx.shape[1]
    tiles = triton.cdiv(w_entries, block_kv) + triton.cdiv(k_sel, block_kv)
    head_blocks = triton.cdiv(heads, block_h)
    p_dtype = q.dtype
    p = torch.empty((bsz, tiles, heads, block_kv), dtype=p_dtype, device=q.device)
    m = torch.empty((bsz, tiles, heads), dtype=torch.float32, device=q.device)
    l_sum = torch.empty_like(m)
    pdl = has_pdl(q.device.index or 0)
    launch = {"launch_pdl": True} if pdl else {}
    sink_t = sink if sink is not None else m
    scores_grid = (bsz, head_blocks, triton.cdiv(tiles, tiles_per_prog))
    gluon_s = qk_fp8 and k_scaled and not v_scaled and gluon_scores_supported(q, win_v, comp_v, d, block_h, block_kv)
    if gluon_scores and not gluon_s:
        raise ValueError("gluon_scores needs an sm_90 GPU with Gluon, 2-byte q split into fp8 parts over fp8 keys "
                         "(qk_fp8), no value scales, block_h=64, D a multiple of 128 and block_kv a multiple of 16")
    if gluon_s and gluon_scores is not False:
        dual_scope_two_pass_gluon.scores_kernel[scores_grid](
            q, win_k, win_len, comp_k, comp_idx, wks, cks, p, m, l_sum, heads, w_entries, k_sel, tiles, scale_log2,
            q.stride(0), q.stride(1), win_k.stride(0), win_k.stride(1), comp_k.stride(0), comp_k.stride(1),
            comp_idx.stride(0), wks.stride(0), cks.stride(0), D=d, BH=block_h, BKV=block_kv,
            TILES_PER_PROG=tiles_per_prog, NUM_BUF=num_stages, num_warps=8)  # 8 warps: faster than 4 at every B timed
    else:
        _scores_kernel[scores_grid](
            q, win_k, win_len, comp_k, comp_idx, wks, wvs, cks, cvs, p, m, l_sum, heads, w_entries, k_sel, tiles,
            scale_log2, q.stride(0), q.stride(1), win_k.stride(0), win_k.stride(1), comp_k.stride(0),
            comp_k.stride(1), comp_idx.stride(0), wks.stride(0), wvs.stride(0), cks.stride(0), cvs.stride(0),
            D=d, BH=block_h, BKV=block_kv, TILES_PER_PROG=tiles_per_prog,
            RUN_P2=triton.next_power_of_2(tiles_per_prog), K_SCALED=k_scaled, V_SCALED=v_scaled,
            DOT_DTYPE=dot_dtype, PRECISION=precision, QK_F16=qk_fp16, QK_FP8=qk_fp8, PDL=pdl, num_warps=num_warps,
            num_stages=num_stages)
    gluon_ok = gluon_values_supported(q, win_v, comp_v, block_h, block_dv, block_kv)
    if gluon_values and not gluon_ok:
        raise ValueError("gluon_values needs an sm_90 GPU with Gluon, 2-byte values of q's dtype, block_h=64, "
                         "block_dv in (64, 128, 256) and block_kv a multiple of 16")
    if gluon_ok and gluon_values is not False:
        dual_scope_two_pass_gluon.values_kernel[(bsz, head_blocks * (d // block_dv))](
            win_v, win_len, comp_v, comp_idx, p, m, l_sum, sink_t, out, heads, w_entries, k_sel, tiles,
            win_v.stride(0), win_v.stride(1), comp_v.stride(0), comp_v.stride(1), comp_idx.stride(0),
            out.stride(0), out.stride(1), D=d, DV=block_dv, BH=block_h, BKV=block_kv,
            T_P2=triton.next_power_of_2(tiles), HAS_SINK=sink is not None, NUM_BUF=values_stages,
            num_warps=8 if values_warps >= 8 else 4)
        return out
    _values_kernel[(bsz, head_blocks * (d // block_dv))](
        win_v, win_len, comp_v, comp_idx, p, m, l_sum, sink_t, out, heads, w_entries, k_sel, tiles,
        win_v.stride(0), win_v.stride(1), comp_v.stride(0), comp_v.stride(1), comp_idx.stride(0), out.stride(0),
        out.stride(1), D=d, DV=block_dv, BH=block_h, BKV=block_kv, T_P2=triton.next_power_of_2(tiles),
        SEL_TILES=triton.next_power_of_2(max(1, triton.cdiv(k_sel, block_kv))),
        DOT_DTYPE=dot_dtype, PRECISION=precision, HAS_SINK=sink is not None, PDL=pdl, num_warps=values_warps,
        num_stages=values_stages, **launch)
    return out


def gluon_ready(q, win_v, comp_v) -> bool:
    """Both Gluon passes can take calls like this one at some block sizes: an sm_90 GPU whose Triton has Gluon
    (and this module's Gluon kernels imported), 2-byte q, and values of q's dtype (the MMA reads them as copied)."""
    return (dual_scope_two_pass_gluon is not None and has_gluon_hopper(q.device.index or 0)
            and q.dtype in (torch.bfloat16, torch.float16) and win_v.dtype == comp_v.dtype == q.dtype)


def gluon_values_supported(q, win_v, comp_v, block_h: int, block_dv: int, block_kv: int) -> bool:
    """Whether the Gluon values pass can take this call: `gluon_ready`, 64 heads per program, 64-256 value
    columns, 16-entry multiples per tile."""
    return (gluon_ready(q, win_v, comp_v) and block_h == 64 and block_dv in (64, 128, 256)
            and block_kv % 16 == 0 and 16 <= block_kv <= 128)


def gluon_scores_supported(q, win_v, comp_v, d: int, block_h: int, block_kv: int) -> bool:
    """Whether the Gluon scores pass can take this call (besides fp8 score dots, key scales and no value scales,
    which the caller checks): `gluon_ready`, 64 heads per program, D in 128-column steps, 16-entry multiples
    per tile."""
    return (gluon_ready(q, win_v, comp_v) and block_h == 64 and d % 128 == 0 and block_kv % 16 == 0
            and 16 <= block_kv <= 128)
