"""Pieces both dual-scope decode schedules share (`dual_scope_decode`'s one-pass kernel and
`dual_scope_two_pass`'s scores and values kernels): the entry tiles of a sequence and the score dots' q.

A sequence's entries form tiles of BKV: the window tiles first (positions t * BKV + e < win_len), then the
compressed tiles (comp_idx[b, j], -1: none)."""

from __future__ import annotations

import triton
import triton.language as tl

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
    largest |q c| in (224, 448]. A bf16 value carries 8 significant bits, hi takes the top 4 and lo the rest, so
    the split is exact for every bf16 value down to about 2^-9 of its head's largest (smaller ones keep an
    absolute error under 2^-18 of it): the score dots then run as two fp8 MMAs straight on the fp8 keys, with no
    conversion of K. Returns (hi, lo, 1 / c)."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), axis=1)
    c = tl.exp2(tl.minimum(tl.floor(tl.log2(448.0 / tl.where(amax > 0, amax, 448.0))), 126.0))
    qs = qf * c[:, None]
    hi = qs.to(tl.float8e4nv)
    lo = (qs - hi.to(tl.float32)).to(tl.float8e4nv)
    return hi, lo, 1.0 / c
