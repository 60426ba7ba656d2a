"""Pieces both dual-scope decode schedules share (`dual_scope_decode`'s one-pass kernel and
`dual_scope_two_pass`'s scores and values kernels): the entry tiles of a sequence and the score dots' q.

A sequence's entries form tiles of BKV: the window tiles first (positions t * BKV + e < win_len), then the
compressed tiles (comp_idx[b, j], -1: none)."""

from __future__ import annotations

import triton
import triton.language as tl

from zoe_kernels.platform import gdc_launch_dependents

LOG2E = 1.4426950408889634


@triton.jit
def tile_rows(t, sel, t1, win_tiles, win_len, bq, e, win_k_ptr, win_v_ptr, win_ks_ptr, win_vs_ptr, comp_k_ptr,
              comp_v_ptr, comp_ks_ptr, comp_vs_ptr, stride_wkb, stride_wkn, stride_wvb, stride_wvn, stride_ckb,
              stride_ckn, stride_cvb, stride_cvn, stride_wksb, stride_wvsb, stride_cksb, stride_cvsb,
              BKV: tl.constexpr):
    """Row pointers (K, V, key scale, value scale) and valid mask of tile t: a window tile below win_tiles, else
    the compressed entries `sel` (-1: none). Tiles at or past t1 have no valid row."""
    pos = t * BKV + e
    is_win = t < win_tiles
    ok = tl.where(is_win, pos < win_len, sel >= 0) & (e < tl.where(t < t1, BKV, 0))
    wrow = pos.to(tl.int64)
    crow = tl.maximum(sel, 0).to(tl.int64)
    k_rows = tl.where(is_win, win_k_ptr + bq * stride_wkb + wrow * stride_wkn,
                      comp_k_ptr + bq * stride_ckb + crow * stride_ckn)
    v_rows = tl.where(is_win, win_v_ptr + bq * stride_wvb + wrow * stride_wvn,
                      comp_v_ptr + bq * stride_cvb + crow * stride_cvn)
    ks_rows = tl.where(is_win, win_ks_ptr + bq * stride_wksb + wrow, comp_ks_ptr + bq * stride_cksb + crow)
    vs_rows = tl.where(is_win, win_vs_ptr + bq * stride_wvsb + wrow, comp_vs_ptr + bq * stride_cvsb + crow)
    return k_rows, v_rows, ks_rows, vs_rows, ok


@triton.jit
def score_q(q, qk_scale_log2, QK_F16: tl.constexpr):
    """q as the score dots take it, with the score scale to match. QK_F16 (fp8 keys, bf16 or fp16 q): the dots
    run in fp16 on q scaled by a power of two (largest |q| in [2^14, 2^15]), exact for every bf16 value down to
    2^-24 of the largest (fp16 has 3 more mantissa bits), and an fp8 pair converts to fp16 in one instruction
    instead of three (fp8 -> fp16 -> bf16)."""
    if QK_F16:
        qf = q.to(tl.float32)
        amax = tl.max(tl.abs(qf))
        q_exp = tl.where(amax > 0, tl.floor(tl.log2(tl.where(amax > 0, amax, 1.0))), 0.0)
        q_mult = tl.exp2(14.0 - q_exp)
        q = (qf * q_mult).to(tl.float16)
        qk_scale_log2 = qk_scale_log2 / q_mult
    return q, qk_scale_log2


@triton.jit
def preload_sel(comp_idx_ptr, bq, stride_ib, first_tile, win_tiles, KSEL, e, N_TILES: tl.constexpr,
                BKV: tl.constexpr):
    """The selected indices of tiles first_tile .. first_tile + N_TILES - 1, loaded before the entry loop
    ([N_TILES, BKV]; -1 outside the compressed scope). Inside a compiler-pipelined loop an index load that
    feeds the next load's addresses is copied asynchronously like the rows, and reading it waits for every
    copy in flight (cp.async.wait_group 0): the tiles' loads then run one after another."""
    ti = tl.arange(0, N_TILES)
    j = (first_tile + ti[:, None] - win_tiles) * BKV + e[None, :]
    return tl.load(comp_idx_ptr + bq * stride_ib + j, mask=(j >= 0) & (j < KSEL), other=-1)


@triton.jit
def tile_sel(all_sel, i, N_TILES: tl.constexpr):
    """Row i of a tensor of per-tile rows loaded before the loop ([N_TILES, n]: indices, scales, factors), by a
    masked sum: register tensors take no dynamic index."""
    ti = tl.arange(0, N_TILES)
    return tl.sum(tl.where(ti[:, None] == i, all_sel, 0), axis=0)


@triton.jit
def split_q_fp8(q):
    """q [BH, D] as two e4m3 parts per head: q = (hi + lo) / c, c a power of two per head putting the head's
    largest |q c| in (224, 448]. A bf16 value carries 8 significant bits, hi takes the top 4 (`e4m3_round`) and lo
    the rest, so the split is exact for every bf16 value down to about 2^-10 of its head's largest (smaller ones
    keep an absolute error of about 2^-18 of it): the score dots then run as two fp8 MMAs straight on the fp8 keys,
    with no conversion of K. Returns (hi, lo, 1 / c)."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), axis=1)
    c = tl.exp2(tl.minimum(tl.floor(tl.log2(448.0 / tl.where(amax > 0, amax, 448.0))), 126.0))
    qs = qf * c[:, None]
    hi_f = e4m3_round(qs)
    return hi_f.to(tl.float8e4nv), (qs - hi_f).to(tl.float8e4nv), 1.0 / c


@triton.jit
def e4m3_round(x):
    """x (float32, |x| <= 448) rounded to nearest-even at e4m3's 3 mantissa bits, in float32, by integer
    arithmetic on its bits: representable in e4m3 wherever e4m3 is normal (|x| >= 2^-6), and x - e4m3_round(x) is
    exact in float32 with at most 4 significant bits. Triton 3.6 converted such fp8 values back to float32 wrongly
    for half of the elements in `split_q_kernel`'s layout on an H200 (and bitcasts of them to integers likewise),
    so the split never reads an fp8 value back."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # round at bit 20, ties to even; carries into e
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def split_q_kernel(q_ptr, q8_ptr, qs_ptr, H, qk_scale_log2, stride_qb, stride_qh, D: tl.constexpr, BH: tl.constexpr,
                   PDL: tl.constexpr):
    """Program (b, head block): q[b] [H, D] as `split_q_fp8`'s two e4m3 parts into q8 [B, 2, H, D] (hi, then lo)
    and each head's score scale qk_scale_log2 / c into qs [B, H]: once per sequence, for the one-pass Gluon
    kernels (dual_scope_fused_ws_gluon, dual_scope_fused_gluon), whose programs copy them in. With PDL the next
    launch may start at once (it waits for this one's writes before reading them)."""
    if PDL:
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = heads < H
    dd = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dd[None, :], mask=h_ok[:, None], other=0.0)
    hi, lo, inv_c = split_q_fp8(q)
    rows = (b * 2 * H + heads) * D
    tl.store(q8_ptr + rows[:, None] + dd[None, :], hi, mask=h_ok[:, None])
    tl.store(q8_ptr + (rows + H * D)[:, None] + dd[None, :], lo, mask=h_ok[:, None])
    tl.store(qs_ptr + b * H + heads, qk_scale_log2 * inv_c, mask=h_ok)
