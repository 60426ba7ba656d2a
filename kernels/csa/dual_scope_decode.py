"""CSA dual-scope decode attention (DeepSeek-V4 compressed sparse attention) in Triton.

One query token per sequence attends over two scopes at once: the sliding window of its most recent
tokens (about 128) and the k (512) compressed entries chosen by CSA top-K. Keys and values are shared
by all heads (MQA, as in MLA's latent cache).

    entries(b) = { window[b, t] : t < win_len[b] }  ∪  { comp[b, comp_idx[b, j]] : comp_idx[b, j] >= 0 }
    out[b, h]  = sum_e softmax_e(sm_scale * q[b, h] . K_e) V_e     (softmax over entries and the sink)

With an attention sink (per-head logit `sink[h]`), the softmax denominator gains exp(sink[h]) and the
sink contributes no value. Keys may be FP8 e4m3 with a float32 scale per entry (dequantized on load:
K_e = k_fp8[e] * k_scale[e], applied as a per-entry factor on the scores, since q . (c k) = c (q . k));
values likewise (v_scale, applied to the probabilities), or bf16/fp16/fp32.

Index convention: comp_idx [B, k] int32 holds positions in the request's compressed-entry sequence
(0-based, -1 padding): exactly what `zoe_kernels.csa.topk` returns. The window is passed as the last
W tokens of each sequence, oldest first, win_len[b] <= W of them valid (rows t >= win_len[b] ignored).

Work split: programs (sequence b, head block x value-column block, split s). A program may hold all heads
of its sequence (block_h=64: K and V read once per sequence) and part of the value columns (block_dv < D:
the scores, which need all key columns, are recomputed per value block); `launch_config` picks per batch what
measured fastest (16, 32 or all 64 heads, 4 or 8 warps). Each program takes a contiguous run of entry
tiles (window tiles first, then compressed tiles) and runs an online softmax in base 2, with one of two loop
schedules (`Schedule`): TWO_LOOPS, compiler-pipelined, one per scope, or ONE_LOOP, compiler-pipelined, with all
selected indices loaded up front (so no dependent index load sits inside the pipeline). Per batch regime the softmax
may also take fp16 score dots, rescale its accumulator only when a row maximum grows by more than 2^8, and
sum its denominators per tile column until the end (fewer instructions and cross-warp reductions per tile).
With one split (large batches) it normalizes, adds the sink and writes the output itself; with several (small
batches, to fill the GPU) it writes a normalized partial output with its log-sum-exp and a second launch
merges the splits exactly (and adds the sink). Two more schedules take bf16 q over fp8 keys (`launch_config`
picks them): TWO_PASS, the scores of every tile then the values by column block (dual_scope_two_pass.py);
FUSED_GLUON, one pass in Gluon on Hopper (dual_scope_fused_ws_gluon.py in one compute warpgroup with loader warps,
dual_scope_fused_gluon.py in two warpgroups), the default there from batch 8.
Split counts follow the target's multiprocessor/CU count (`platform.current_target`).
"""

from __future__ import annotations

import enum
import math

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.dual_scope_tiles import LOG2E, preload_sel, score_q, split_q_kernel, tile_rows, tile_sel
from zoe_kernels.csa.dual_scope_two_pass import gluon_ready, two_pass_decode
from zoe_kernels.platform import Target, current_target, dot_precision, has_pdl

try:  # the one-pass Hopper (Gluon) kernel; a Triton without Gluon keeps the others
    from zoe_kernels.csa import dual_scope_fused_gluon, dual_scope_fused_ws_gluon
except ImportError:  # pragma: no cover - depends on the installed Triton
    dual_scope_fused_gluon = dual_scope_fused_ws_gluon = None

# LAZY_RESCALE's threshold in log2 units: probabilities up to 2^8 against a stale row maximum (bf16/fp16/fp32 P)
RESCALE_LOG2: tl.constexpr = tl.constexpr(8.0)


@triton.jit
def _softmax_step(q, m_i, l_i, acc, kt, vt, ks, vs, ok, qk_scale_log2, K_SCALED: tl.constexpr, V_SCALED: tl.constexpr,
                  DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr, LAZY_RESCALE: tl.constexpr,
                  DEFER_SUM: tl.constexpr):
    """One tile of loaded entries (K rows kt, V rows vt, per-entry scales, valid mask) folded into the online
    softmax state (m_i, l_i, acc), in base 2. LAZY_RESCALE: m_i moves (and acc, l_i are rescaled) only when some
    row's tile maximum exceeds it by more than RESCALE_LOG2, a branch taken by the whole program; otherwise the
    probabilities stay under 2^RESCALE_LOG2 against the stale m_i, exact since out = acc / l_i share it.
    DEFER_SUM: l_i is [BH, BKV], the probabilities summed per tile column, reduced over columns once after the
    loop (a row sum per tile is a reduction across the warps that split the tile's entries)."""
    # fp8 rows convert straight to q's dtype (the dot dtype, or fp16 with QK_F16); the per-entry scales multiply
    # the scores (keys) and the probabilities (values) instead of whole tiles, which keeps [BKV, D] fp32 tiles
    # out of registers
    s = tl.dot(q, tl.trans(kt.to(q.dtype)), input_precision=PRECISION) * qk_scale_log2  # [BH, BKV], log2 units
    if K_SCALED:
        s = s * ks[None, :]
    s = tl.where(ok[None, :], s, float("-inf"))
    m_tile = tl.max(s, axis=1)
    if LAZY_RESCALE:
        # the [BH, DV] accumulator's multiply is skipped on most tiles (a row's -inf max grows on its first entry)
        if tl.max((m_tile > m_i + RESCALE_LOG2).to(tl.int32), axis=0) > 0:
            m_new = tl.maximum(m_i, m_tile)
            alpha = tl.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            acc = acc * alpha[:, None]
            l_i = _scale_rows(l_i, alpha, DEFER_SUM)
            m_i = m_new
        p = tl.exp2(s - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
        l_i = _add_row_sums(l_i, p, DEFER_SUM)
    else:
        m_i_old = m_i
        m_i = tl.maximum(m_i_old, m_tile)
        m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
        alpha = tl.exp2(m_i_old - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = _add_row_sums(_scale_rows(l_i, alpha, DEFER_SUM), p, DEFER_SUM)
        acc = acc * alpha[:, None]
    pv = p
    if V_SCALED:
        pv = p * vs[None, :]
    acc = acc + tl.dot(pv.to(DOT_DTYPE), vt.to(DOT_DTYPE), input_precision=PRECISION)
    return m_i, l_i, acc


@triton.jit
def _scale_rows(l_i, alpha, DEFER_SUM: tl.constexpr):
    """The running denominators times the rows' rescale factors ([BH] or, with DEFER_SUM, [BH, BKV])."""
    if DEFER_SUM:
        scaled = l_i * alpha[:, None]
    else:
        scaled = l_i * alpha
    return scaled


@triton.jit
def _add_row_sums(l_i, p, DEFER_SUM: tl.constexpr):
    """The running denominators plus a tile's probabilities p [BH, BKV] (summed over the tile unless DEFER_SUM)."""
    if DEFER_SUM:
        total = l_i + p
    else:
        total = l_i + tl.sum(p, axis=1)
    return total


@triton.jit
def _attend_tile(q, m_i, l_i, acc, k_rows, v_rows, ks_rows, vs_rows, ok, dd, dv, qk_scale_log2,
                 K_SCALED: tl.constexpr, V_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
                 LAZY_RESCALE: tl.constexpr, DEFER_SUM: tl.constexpr):
    """One tile of entries (row pointers, valid mask) loaded and folded into the online softmax state."""
    kt, vt, ks, vs = _load_rows(k_rows, v_rows, ks_rows, vs_rows, ok, dd, dv, K_SCALED, V_SCALED)
    return _softmax_step(q, m_i, l_i, acc, kt, vt, ks, vs, ok, qk_scale_log2, K_SCALED, V_SCALED, DOT_DTYPE,
                         PRECISION, LAZY_RESCALE, DEFER_SUM)


@triton.jit
def _load_rows(k_rows, v_rows, ks_rows, vs_rows, ok, dd, dv, K_SCALED: tl.constexpr, V_SCALED: tl.constexpr):
    """The loads of one tile's rows: (K rows, V rows, key scales, value scales)."""
    kt = tl.load(k_rows[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
    vt = tl.load(v_rows[:, None] + dv[None, :], mask=ok[:, None], other=0.0)
    ks = ok.to(tl.float32)
    vs = ks
    if K_SCALED:
        ks = tl.load(ks_rows, mask=ok, other=0.0)
    if V_SCALED:
        vs = tl.load(vs_rows, mask=ok, other=0.0)
    return kt, vt, ks, vs


@triton.jit
def _dual_scope_partial_kernel(
    q_ptr, win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr,
    win_ks_ptr, win_vs_ptr, comp_ks_ptr, comp_vs_ptr, part_out_ptr, part_lse_ptr, sink_ptr, out_ptr,
    H, W, KSEL, qk_scale_log2,
    stride_qb, stride_qh, stride_wkb, stride_wkn, stride_wvb, stride_wvn,
    stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_ib,
    stride_wksb, stride_wvsb, stride_cksb, stride_cvsb, stride_ob, stride_oh,
    D: tl.constexpr, DV: tl.constexpr, BH: tl.constexpr, BKV: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    K_SCALED: tl.constexpr, V_SCALED: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
    FINAL: tl.constexpr, HAS_SINK: tl.constexpr, ONE_LOOP: tl.constexpr,
    SEL_TILES: tl.constexpr, QK_F16: tl.constexpr, LAZY_RESCALE: tl.constexpr, DEFER_SUM: tl.constexpr,
):
    """Program (b, head block x value-column block, split): BH heads, value columns [dv0, dv0 + DV), one
    run of entry tiles. The scores need all D key columns, so with DV < D each value block recomputes
    them (cheap next to reading K and V once from HBM; the blocks of one sequence share them through L2).
    FINAL (one split): normalize, add the sink and write `out` directly; else write (out, lse) partials."""
    b = tl.program_id(0)
    n_vblk: tl.constexpr = D // DV
    hb = tl.program_id(1) // n_vblk
    dv0 = (tl.program_id(1) % n_vblk) * DV
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    heads = hb * BH + tl.arange(0, BH)
    h_ok = heads < H
    dd = tl.arange(0, D)
    dv = dv0 + tl.arange(0, DV)
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads * stride_qh
    q = tl.load(q_rows[:, None] + dd[None, :], mask=h_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    q, qk_scale_log2 = score_q(q, qk_scale_log2, QK_F16)
    win_len = tl.minimum(tl.load(win_len_ptr + b), W)
    win_tiles = tl.cdiv(W, BKV)

    m_i = tl.full([BH], float("-inf"), tl.float32)
    if DEFER_SUM:
        l_i = tl.zeros([BH, BKV], tl.float32)
    else:
        l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, DV], tl.float32)
    # this split's tiles [t0, t1): window tiles first, then compressed tiles
    t0 = split * TILES_PER_SPLIT
    t1 = t0 + TILES_PER_SPLIT
    e = tl.arange(0, BKV)
    bq = b.to(tl.int64)
    if ONE_LOOP:
        # one loop over both scopes with all selected indices in registers up front, so a tile's row addresses
        # are arithmetic only and the compiler's pipeline keeps the next tiles in flight (a dependent index load
        # in the loop makes it wait for every copy before each tile: wait_group 0 in the PTX)
        t1 = tl.minimum(t1, win_tiles + tl.cdiv(KSEL, BKV))
        all_sel = preload_sel(comp_idx_ptr, bq, stride_ib, win_tiles, win_tiles, KSEL, e, SEL_TILES, BKV)
        for t in range(t0, t1):
            sel = tile_sel(all_sel, t - win_tiles, SEL_TILES)
            k_rows, v_rows, ks_rows, vs_rows, ok = tile_rows(
                t, sel, t1, win_tiles, win_len, bq, e, win_k_ptr, win_v_ptr, win_ks_ptr, win_vs_ptr,
                comp_k_ptr, comp_v_ptr, comp_ks_ptr, comp_vs_ptr, stride_wkb, stride_wkn, stride_wvb, stride_wvn,
                stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_wksb, stride_wvsb, stride_cksb, stride_cvsb, BKV)
            kt, vt, ks, vs = _load_rows(k_rows, v_rows, ks_rows, vs_rows, ok, dd, dv, K_SCALED, V_SCALED)
            m_i, l_i, acc = _softmax_step(q, m_i, l_i, acc, kt, vt, ks, vs, ok, qk_scale_log2, K_SCALED, V_SCALED,
                                          DOT_DTYPE, PRECISION, LAZY_RESCALE, DEFER_SUM)
    else:
        # two loops, one per scope (no branch around the loads, so the compiler pipelines them)
        for t in range(t0, tl.minimum(t1, win_tiles)):
            pos = t * BKV + e
            ok = pos < win_len
            row = pos.to(tl.int64)
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, win_k_ptr + bq * stride_wkb + row * stride_wkn,
                win_v_ptr + bq * stride_wvb + row * stride_wvn, win_ks_ptr + bq * stride_wksb + row,
                win_vs_ptr + bq * stride_wvsb + row, ok, dd, dv, qk_scale_log2, K_SCALED, V_SCALED, DOT_DTYPE,
                PRECISION, LAZY_RESCALE, DEFER_SUM)
        for t in range(tl.maximum(t0, win_tiles), tl.minimum(t1, win_tiles + tl.cdiv(KSEL, BKV))):
            j = (t - win_tiles) * BKV + e
            sel = tl.load(comp_idx_ptr + bq * stride_ib + j, mask=j < KSEL, other=-1)
            ok = sel >= 0
            row = tl.maximum(sel, 0).to(tl.int64)
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, comp_k_ptr + bq * stride_ckb + row * stride_ckn,
                comp_v_ptr + bq * stride_cvb + row * stride_cvn, comp_ks_ptr + bq * stride_cksb + row,
                comp_vs_ptr + bq * stride_cvsb + row, ok, dd, dv, qk_scale_log2, K_SCALED, V_SCALED, DOT_DTYPE,
                PRECISION, LAZY_RESCALE, DEFER_SUM)

    if DEFER_SUM:
        l_i = tl.sum(l_i, axis=1)
    if FINAL:
        # one split: the merge's arithmetic here (sink in the denominator, zeros for an empty row)
        denom = l_i
        if HAS_SINK:
            sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")).to(tl.float32) * 1.4426950408889634
            top = tl.maximum(m_i, sink)
            top_safe = tl.where(top == float("-inf"), 0.0, top)
            m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
            rescale = tl.exp2(m_safe - top_safe)
            acc = acc * rescale[:, None]
            denom = l_i * rescale + tl.exp2(sink - top_safe)
        out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
        tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dv[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        base = (b.to(tl.int64) * num_splits + split) * H
        tl.store(part_out_ptr + (base + heads)[:, None] * D + dv[None, :], out, mask=h_ok[:, None])
        if dv0 == 0:
            tl.store(part_lse_ptr + base + heads, lse, mask=h_ok)


@triton.jit
def merge_partials_kernel(part_out_ptr, part_lse_ptr, sink_ptr, out_ptr, lse_ptr, H, NUM_SPLITS, stride_ob,
                          stride_oh, D: tl.constexpr, BH: tl.constexpr, SPLITS_P2: tl.constexpr,
                          HAS_SINK: tl.constexpr, WRITE_LSE: tl.constexpr):
    """Exact merge of the splits' (out, lse) partials (lse in log2 units), the sink in the denominator only.
    With WRITE_LSE it also stores the entries' log-sum-exp in natural-log units, +inf for a row with no entry
    (FlashMLA's convention; the paged entry point returns it)."""
    b = tl.program_id(0)
    heads = tl.program_id(1) * BH + tl.arange(0, BH)
    h_ok = heads < H
    ss = tl.arange(0, SPLITS_P2)
    base = b.to(tl.int64) * NUM_SPLITS * H
    lse = tl.load(part_lse_ptr + base + ss[:, None] * H + heads[None, :],
                  mask=(ss[:, None] < NUM_SPLITS) & h_ok[None, :], other=float("-inf"))  # [S, BH]
    top_e = tl.max(lse, axis=0)
    top_e = tl.where(top_e == float("-inf"), 0.0, top_e)
    entries = tl.sum(tl.exp2(lse - top_e[None, :]), axis=0)  # the entries' sum relative to their own max (>= 1)
    top_safe = top_e
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")).to(tl.float32) * 1.4426950408889634
        top = tl.maximum(tl.max(lse, axis=0), sink)
        top_safe = tl.where(top == float("-inf"), 0.0, top)
    denom = entries * tl.exp2(top_e - top_safe)
    if HAS_SINK:
        denom += tl.exp2(sink - top_safe)
    dd = tl.arange(0, D)
    acc = tl.zeros([BH, D], tl.float32)
    for s in range(NUM_SPLITS):
        lse_s = tl.load(part_lse_ptr + base + s * H + heads, mask=h_ok, other=float("-inf"))
        part = tl.load(part_out_ptr + (base + s * H + heads)[:, None] * D + dd[None, :], mask=h_ok[:, None], other=0.0)
        acc += tl.exp2(lse_s - top_safe)[:, None] * part
    acc = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dd[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=h_ok[:, None])
    if WRITE_LSE:
        total = tl.where(entries > 0, (top_e + tl.log2(tl.where(entries > 0, entries, 1.0))) * 0.6931471805599453,
                         float("inf"))
        tl.store(lse_ptr + b.to(tl.int64) * H + heads, total, mask=h_ok)


_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


class Schedule(enum.IntEnum):
    """How a program walks its entry tiles (`launch_config` picks one per batch; the values are the integers the
    public `schedule=` argument has always taken)."""

    TWO_LOOPS = 0  # one compiler-pipelined loop per scope (window, then compressed), the index load inside
    ONE_LOOP = 2  # one compiler-pipelined loop over both scopes, all selected indices loaded up front
    TWO_PASS = 3  # the scores of every tile, then the values by column block (dual_scope_two_pass.py)
    FUSED_GLUON = 4  # one pass in Gluon on Hopper (dual_scope_fused_ws_gluon.py, dual_scope_fused_gluon.py)


# Entry splits only below this many programs (more splits cost a merge launch and re-read q). Retune with
# bench/kernels/sparse_decode_sweep.py at the batch where the grid first reaches it.
_MIN_UNSPLIT_PROGRAMS = 64
# Pipeline depth per schedule when the regime does not set one (the compiler's stages over entry tiles).
_SCHEDULE_STAGES = {Schedule.TWO_LOOPS: 2, Schedule.ONE_LOOP: 3, Schedule.TWO_PASS: 3, Schedule.FUSED_GLUON: 3}
# Batch regimes for 2-byte q (H=64, D=512): small batches split entries over many programs; from
# _TWO_PER_SM_FROM_BATCH two programs per multiprocessor; from _ALL_HEADS_FROM_BATCH all heads per program (K and
# V read once per sequence). Retune with bench/kernels/sparse_decode_sweep.py across B.
_SMALL_BELOW_BATCH = 8
_TWO_PER_SM_FROM_BATCH = 64
_ALL_HEADS_FROM_BATCH = 128
# bf16 q over fp8 keys from this batch on takes the two-pass schedule (the Triton passes; the Gluon passes on Hopper
# from the second value). Retune by timing schedules TWO_PASS against the one-pass defaults per B.
_TWO_PASS_FROM_BATCH = 32
_TWO_PASS_FROM_BATCH_GLUON = 8


# Waves per program on wave64 (CDNA) targets: one per SIMD of a CU, each with the whole 512-register file; 8 waves
# (256 registers each) and 2 (twice a thread's share of the tiles) spill at the regimes' tiles on gfx942 and gfx950
# (python -m zoe_kernels.aot; bench/kernels/amd_aot.json). Retune there: no scratch on any decode row.
_CU_WAVES = 4
# TWO_PASS's scores pass per backend, (block_kv, num_stages): the H200's measured 64-entry tiles at three stages; on
# CDNA q's two e4m3 parts over D=512 and 32- or 64-entry tiles spill (744-3,460 bytes of scratch a thread on gfx950
# at 64 heads), 16-entry tiles at two stages do not. Retune with python -m zoe_kernels.aot --only dual_scope.
_TWO_PASS_SCORES_TILE = {"cuda": (64, 3), "hip": (16, 2)}


def _wave_programs(target: Target) -> int:
    """Programs of one wave at one program per multiprocessor, rounded down to a power of two (128 on a 132-SM
    H200, 256 on MI355X and MI300X): the split counts that fill the GPU are taken against it."""
    return 1 << (max(1, target.cu_count).bit_length() - 1)


def launch_config(bsz: int, heads: int, d: int, entries: int, *, block_h: int | None = None,
                  block_dv: int | None = None, block_kv: int | None = None, splits: int | None = None,
                  num_warps: int | None = None, schedule: int | None = None, num_stages: int | None = None,
                  q_bytes: int = 2, one_loop: bool = True, qk_fp16: bool | None = None,
                  lazy_rescale: bool | None = None, defer_sum: bool | None = None,
                  values_warps: int | None = None, values_stages: int | None = None,
                  fp8_scores: bool = False, gluon: bool = False, selected: int | None = None,
                  kv_bytes: tuple[int, int] = (1, 2), target: Target | None = None) -> dict:
    """Default launch parameters for `target` (default `platform.current_target()`: its multiprocessor/CU count
    sizes the entry splits, its shared memory bounds the Gluon kernel's ring), by batch regime, for 2-byte q (the
    regimes were timed on an H200 at H=64, D=512, W=128, k=512; bench/kernels/sparse_README.md has the runs):
    - B < 8: 16 heads, 4 warps, entry splits to about two programs per multiprocessor, ONE_LOOP over 64-entry
      tiles at two stages, fp16 score dots;
    - 8 <= B < 64: 32 heads, all value columns, 8 warps, TWO_LOOPS over 64-entry tiles, one split from 64 programs
      on, else splits to about two programs per multiprocessor;
    - 64 <= B < 128: two programs per multiprocessor: 32 heads, 4 warps, TWO_LOOPS over 32-entry tiles, entry
      splits up to two programs per multiprocessor (`_wave_programs`), fp16 score dots, lazy rescale and deferred
      sums;
    - B >= 128: all heads per program (K and V read once per sequence), ONE_LOOP over 32-entry tiles at three
      stages, entry splits up to one program per multiprocessor, deferred sums (fp16 score dots and lazy rescale
      spill registers there).
    With fp8_scores (bf16 q over fp8 keys, where the score dots run as fp8 MMAs) B >= 32 takes TWO_PASS
    (`_two_pass_config`), and B >= 8 where Gluon runs (`gluon`: Hopper) FUSED_GLUON (`_fused_config`), or the
    Gluon two passes where FUSED_GLUON's shared memory does not fit (`selected`: the number of selected entries,
    whose staged indices it holds; None: all `entries`). fp32 q keeps the B < 128 regimes with 32-entry tiles.
    one_loop=False (the scopes' K or V dtypes differ) keeps TWO_LOOPS at every batch. An explicit block_h other
    than the regime's keeps the 8-warp default. `schedule` takes a `Schedule` or its integer. kv_bytes: bytes per
    key and per value element; a default block_kv halves (down to 16) until the pipeline's key and value tiles fit
    the target's shared memory (`_kv_tiles_fit`)."""
    target = target or current_target()
    two_byte = q_bytes <= 2
    all_heads = one_loop and two_byte and bsz >= _ALL_HEADS_FROM_BATCH and block_h in (None, 64)
    two_per_sm = (two_byte and not all_heads and _TWO_PER_SM_FROM_BATCH <= bsz and block_h in (None, 32)
                  and num_warps in (None, 4))
    small = one_loop and two_byte and bsz < _SMALL_BELOW_BATCH
    two_pass_from = _TWO_PASS_FROM_BATCH_GLUON if gluon else _TWO_PASS_FROM_BATCH
    if schedule is None and fp8_scores and one_loop and bsz >= two_pass_from and block_h in (None, 64):
        fits = gluon and _fused_config(bsz, heads, d, entries, entries if selected is None else selected,
                                       block_dv=block_dv, block_kv=block_kv, splits=splits,
                                       num_stages=num_stages, target=target)["fits"]
        schedule = Schedule.FUSED_GLUON if fits else Schedule.TWO_PASS
    if schedule is None:
        schedule = Schedule.ONE_LOOP if (all_heads or small) else Schedule.TWO_LOOPS
    try:
        schedule = Schedule(schedule)
    except ValueError:
        raise ValueError(f"schedule must be one of {[int(s) for s in Schedule]} ({', '.join(s.name for s in Schedule)}),"
                         f" got {schedule}") from None
    if not one_loop:
        schedule = Schedule.TWO_LOOPS  # the other schedules select between the scopes' row pointers: one dtype each
    if schedule == Schedule.FUSED_GLUON:
        return _fused_config(bsz, heads, d, entries, entries if selected is None else selected, block_dv=block_dv,
                             block_kv=block_kv, splits=splits, num_stages=num_stages, target=target)
    if schedule == Schedule.TWO_PASS:
        return _two_pass_config(bsz, heads, d, entries, block_h=block_h, block_dv=block_dv, block_kv=block_kv,
                                splits=splits, num_warps=num_warps, num_stages=num_stages, qk_fp16=qk_fp16,
                                values_warps=values_warps, values_stages=values_stages, target=target)
    if num_stages is None:
        num_stages = 3 if all_heads else 2 if schedule == Schedule.ONE_LOOP else _SCHEDULE_STAGES[schedule]
    if block_h is None:
        block_h = 64 if all_heads else 16 if bsz < _SMALL_BELOW_BATCH else 32
    block_h = max(16, min(block_h, triton.next_power_of_2(heads)))
    if block_dv is None:
        block_dv = d
    block_dv = min(block_dv, d)
    if block_kv is None:
        block_kv = 32 if (all_heads or two_per_sm or not two_byte) else 64
        while block_kv > 16 and not _kv_tiles_fit(target, num_stages, block_kv, d, block_dv, kv_bytes):
            block_kv //= 2
    if num_warps is None:
        num_warps = 4 if two_per_sm else 8 if block_h >= 32 and block_h * block_dv >= 32 * 256 else 4
        if target.warp_size == 64:
            num_warps = _CU_WAVES
    programs = bsz * triton.cdiv(heads, block_h) * (d // block_dv)
    tiles = max(1, triton.cdiv(entries, block_kv))
    if splits is None:
        if all_heads:
            splits = triton.cdiv(_wave_programs(target), programs)
        elif two_per_sm:
            splits = triton.cdiv(2 * _wave_programs(target), programs)
        else:
            splits = 1 if programs >= _MIN_UNSPLIT_PROGRAMS else triton.cdiv(2 * target.cu_count, programs)
    splits = max(1, min(splits, tiles))
    qk_fp16 = (small or two_per_sm) if qk_fp16 is None else qk_fp16
    lazy_rescale = two_per_sm if lazy_rescale is None else lazy_rescale
    defer_sum = (two_per_sm or all_heads) if defer_sum is None else defer_sum
    return {"block_h": block_h, "block_dv": block_dv, "block_kv": block_kv, "splits": splits,
            "num_warps": num_warps, "schedule": schedule, "num_stages": num_stages, "qk_fp16": qk_fp16,
            "lazy_rescale": lazy_rescale, "defer_sum": defer_sum}


def _kv_tiles_fit(target: Target, num_stages: int, block_kv: int, d: int, block_dv: int,
                  kv_bytes: tuple[int, int]) -> bool:
    """Whether the key and value tiles a pipeline of num_stages holds (`Target.pipeline_tiles`) fit the target's
    shared memory: tiles x block_kv x (d key bytes + block_dv value bytes)."""
    tile = block_kv * (d * kv_bytes[0] + block_dv * kv_bytes[1])
    return target.pipeline_tiles(num_stages) * tile <= target.lds_bytes


def _two_pass_config(bsz: int, heads: int, d: int, entries: int, *, block_h, block_dv, block_kv, splits,
                     num_warps, num_stages, qk_fp16, values_warps, values_stages, target: Target) -> dict:
    """Launch parameters of TWO_PASS (dual_scope_two_pass.py): block_h heads per program in both passes (all of
    them up to 64), block_kv entries per tile, splits scores programs per (sequence, head block: as many as one
    wave of one program per multiprocessor holds), block_dv value columns per values program; num_warps /
    num_stages for the scores pass, values_warps / values_stages for the values pass."""
    block_h = max(16, min(block_h or 64, triton.next_power_of_2(heads)))
    scores_kv, scores_stages = _TWO_PASS_SCORES_TILE[target.backend]
    block_kv = block_kv or scores_kv
    block_dv = min(block_dv or 128, d)
    tiles = max(1, triton.cdiv(entries, block_kv))
    programs = bsz * triton.cdiv(heads, block_h)
    if splits is None:
        splits = target.cu_count // programs
    splits = max(1, min(splits, tiles))
    return {"block_h": block_h, "block_dv": block_dv, "block_kv": block_kv, "splits": splits,
            "num_warps": num_warps or 4, "schedule": Schedule.TWO_PASS, "num_stages": num_stages or scores_stages,
            "qk_fp16": bool(qk_fp16), "lazy_rescale": False, "defer_sum": False,
            "values_warps": values_warps or num_warps or 4, "values_stages": values_stages or num_stages or 3}


# Key slots of the one-warpgroup one-pass kernel (its loader warps run keys one tile ahead of the compute warps):
# 2 took 27.4-27.6 us at B=64 on the H200 against 27.7-27.9 with 3 (21.1-21.5 against 21.1-21.3 at B=32) and
# leave 33 KB of shared memory free. Retune with bench/kernels/sparse_decode_sweep.py (num_stages 2 / 3).
_FUSED_KEY_SLOTS = 2
# FUSED_GLUON's entries per tile with one warpgroup: 64 (keys two tiles ahead) was faster than 32 on the H200 at every
# batch timed; two warpgroups (all of D=512's value columns) take 32, the tiles that fit their rings. Retune with
# bench/kernels/sparse_decode_sweep.py (block_kv 32 / 64).
_FUSED_BLOCK_KV = 64
# The most splits of a sequence at which the one-pass kernel's programs hold all value columns (two warpgroups, each
# tile's scores computed once): one, so they take the batches where a wave holds at most one of them a sequence
# (from B=67 on 132 SMs), where one-warpgroup programs (two a sequence) need a second wave; split twice (B=64) they
# lose to one-warpgroup programs (a merge launch, and a 32-entry tile costs about what a 64-entry one does).
# Retune with bench/kernels/sparse_decode_sweep.py (block_dv 256 / 512) across B.
_FUSED_WIDE_MAX_SPLITS = 1


def _fused_warpgroups(block_dv: int) -> int:
    """Warpgroups of a one-pass program: one per 256 value columns (a warpgroup MMA's N, 128 accumulator registers
    per thread)."""
    return max(1, block_dv // 256)


def _fused_block_dv(bsz: int, heads: int, d: int, block_dv: int | None, target: Target) -> int:
    """Value columns per program of the one-pass Gluon kernel: all of D = 512 in two warpgroups (each tile's scores
    computed once per sequence) where one wave of such programs splits a sequence at most _FUSED_WIDE_MAX_SPLITS
    ways; else 256 where they divide D (the scores computed by each of D / 256 programs), else 128."""
    if block_dv:
        return block_dv
    programs = bsz * triton.cdiv(heads, 64)
    if d == 512 and target.cu_count // max(1, programs) <= _FUSED_WIDE_MAX_SPLITS:
        return d
    return min(256, d) if d % min(256, d) == 0 else 128


def _fused_sel_rows(tiles_per_split: int, selected: int, block_kv: int) -> int:
    """Rows of staged indices a one-pass program holds: its tiles of selected entries, to a power of two."""
    return triton.next_power_of_2(max(1, min(tiles_per_split, triton.cdiv(selected, block_kv))))


def _fused_smem_bytes(d: int, block_dv: int, block_kv: int, key_slots: int, sel_rows: int) -> int:
    """Shared memory of a one-pass program: q's two fp8 parts, the key ring (rows and scales), the two value slots,
    and in two warpgroups the staged indices and the probabilities handed between them, in one the staged
    validity bytes and the rings' barriers (full and empty a slot)."""
    rings = 2 * 64 * d + key_slots * block_kv * (d + 4) + 2 * block_kv * block_dv * 2
    if _fused_warpgroups(block_dv) > 1:
        return rings + sel_rows * block_kv * 4 + 64 * block_kv * 2
    return rings + sel_rows * block_kv + 8 * 2 * (key_slots + 2) + 256  # + the allocator's alignment (< 256 B)


def _fused_shape_ok(d: int, block_dv: int, block_kv: int, key_slots: int, sel_rows: int, lds_bytes: int) -> bool:
    """The shapes the one-pass Gluon kernel takes: D in 128-column steps, 64-256 value columns per program dividing
    D or 512 in two warpgroups (D a multiple of 256), 32- or 64-entry tiles, 2 or 3 key slots (keys one or two
    tiles ahead), and `_fused_smem_bytes` within `lds_bytes` of shared memory."""
    return (d % 128 == 0 and block_dv in (64, 128, 256, 512) and d % block_dv == 0 and block_kv in (32, 64)
            and key_slots in (2, 3) and _fused_smem_bytes(d, block_dv, block_kv, key_slots, sel_rows) <= lds_bytes)


def _fused_config(bsz: int, heads: int, d: int, entries: int, selected: int, *, block_dv, block_kv, splits,
                  num_stages, target: Target) -> dict:
    """Launch parameters of the one-pass Gluon kernel (dual_scope_fused_ws_gluon.py in one warpgroup,
    dual_scope_fused_gluon.py in two): 64 heads and block_dv value columns per program (`_fused_block_dv`),
    block_kv entries per tile (64 with one warpgroup, 32 with two), num_stages key slots (one warpgroup:
    _FUSED_KEY_SLOTS; two: 3 where they fit the target's shared memory, else 2), splits programs over a sequence's
    entries (as many as fill one wave of one program per multiprocessor); "fits" says whether its shared memory
    does (`_fused_shape_ok`)."""
    block_dv = _fused_block_dv(bsz, heads, d, block_dv, target)
    wgs = _fused_warpgroups(block_dv)
    block_kv = block_kv or (32 if wgs > 1 else _FUSED_BLOCK_KV)
    # the window's tiles and the selection's, counted apart as the launch counts them
    tiles = max(1, triton.cdiv(entries - selected, block_kv) + triton.cdiv(selected, block_kv))
    programs = bsz * triton.cdiv(heads, 64) * (d // block_dv)
    if splits is None:
        splits = max(1, target.cu_count // programs)
    splits = max(1, min(splits, tiles))
    sel_rows = _fused_sel_rows(triton.cdiv(tiles, splits), selected, block_kv)
    if num_stages is None and wgs == 1:
        num_stages = _FUSED_KEY_SLOTS
    elif num_stages is None:
        num_stages = 3 if _fused_shape_ok(d, block_dv, block_kv, 3, sel_rows, target.lds_bytes) else 2
    return {"block_h": 64, "block_dv": block_dv, "block_kv": block_kv, "splits": splits,
            "num_warps": 4 * wgs, "schedule": Schedule.FUSED_GLUON, "num_stages": num_stages,
            "qk_fp16": False, "lazy_rescale": False, "defer_sum": False,
            "fits": _fused_shape_ok(d, block_dv, block_kv, num_stages, sel_rows, target.lds_bytes)}


def fused_supported(q, win_k, comp_k, win_v, comp_v, v_scaled: bool, sm_scale: float, cfg: dict) -> bool:
    """Whether the one-pass Gluon kernel can take this call at launch parameters cfg (`_fused_config`'s): an sm_90
    GPU with Gluon, bf16 q over fp8 e4m3 keys (with their scales) and bf16 values without scales, a positive
    softmax scale (the kernel takes a row's maximum before scaling), shared memory that fits."""
    return (dual_scope_fused_gluon is not None and gluon_ready(q, win_v, comp_v) and q.dtype == torch.bfloat16
            and win_k.dtype == comp_k.dtype == torch.float8_e4m3fn and not v_scaled and sm_scale > 0
            and cfg["fits"])


def _split_partials(bsz: int, heads: int, d: int, tiles: int, splits: int, dev):
    """The splits over a sequence's tiles as launched (tiles per split, splits: no empty split) and their (out,
    lse) partials' buffers, placeholders with one split (the program writes the output itself)."""
    tiles_per_split = triton.cdiv(tiles, splits)
    splits = triton.cdiv(tiles, tiles_per_split)
    final = splits == 1
    part_out = torch.empty((bsz, splits, heads, d) if not final else (1,), dtype=torch.float32, device=dev)
    part_lse = torch.empty((bsz, splits, heads) if not final else (1,), dtype=torch.float32, device=dev)
    return tiles_per_split, splits, part_out, part_lse


def _merge_splits(part_out, part_lse, sink_t, out, has_sink: bool, merge_h: int) -> None:
    """The exact merge of the splits' partials into `out` (merge_partials_kernel: [merge_h, D] float32 rows a
    program), the sink in the denominator."""
    bsz, splits, heads, d = part_out.shape
    merge_partials_kernel[(bsz, triton.cdiv(heads, merge_h))](
        part_out, part_lse, sink_t, out, part_lse, heads, splits, out.stride(0), out.stride(1),
        D=d, BH=merge_h, SPLITS_P2=triton.next_power_of_2(splits), HAS_SINK=has_sink, WRITE_LSE=False, num_warps=4)


# split_q_kernel's heads and warps per program; retune with bench/kernels/sparse_bench.py's `limits` section, which
# times the split alone at other values
_SPLIT_HEADS = 4
_SPLIT_WARPS = 4
# The one-warpgroup one-pass kernel's loader warps (dual_scope_fused_ws_gluon) and the registers a loader thread
# keeps: 4 warps took 27.7 us at B=64 on the H200 against 28.5 with 2 (bench/kernels/sparse_decode_sweep.py with
# the count as a variant); 80 registers compile without spills (bench/kernels/sparse_aot.py --only fused), and
# fewer would give the compute warpgroup nothing (it is at 255).
_LOADER_WARPS = 4
_LOADER_REGS = 80


def _fused_decode(q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, cks, sink, scale_log2, out, *,
                  block_dv: int, block_kv: int, splits: int, num_stages: int) -> torch.Tensor:
    """q split once per sequence (`split_q_kernel`), then the one-pass Gluon launch (one warpgroup and loader
    warps up to 256 value columns a program, else two warpgroups) and the merge of its splits, on tensors
    `dual_scope_decode` has checked and prepared; writes and returns `out`."""
    bsz, heads, d = q.shape
    w_entries, k_sel = win_k.shape[1], comp_idx.shape[1]
    tiles = triton.cdiv(w_entries, block_kv) + triton.cdiv(k_sel, block_kv)
    dev = q.device
    tiles_per_split, splits, part_out, part_lse = _split_partials(bsz, heads, d, tiles, splits, dev)
    final = splits == 1
    sink_t = sink if sink is not None else part_lse
    q8 = torch.empty((bsz, 2, heads, d), dtype=torch.float8_e4m3fn, device=dev)
    q_scale = torch.empty((bsz, heads), dtype=torch.float32, device=dev)
    pdl = has_pdl(dev.index or 0)
    split_q_kernel[(bsz, triton.cdiv(heads, _SPLIT_HEADS))](q, q8, q_scale, heads, scale_log2, q.stride(0), q.stride(1),
                                                            D=d, BH=_SPLIT_HEADS, PDL=pdl, num_warps=_SPLIT_WARPS)
    grid = (bsz, triton.cdiv(heads, 64) * (d // block_dv), splits)
    args = (q8, q_scale, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, cks, sink_t, out, part_out, part_lse,
            heads, w_entries, k_sel, tiles, q8.stride(0), win_k.stride(0), win_k.stride(1), win_v.stride(0),
            win_v.stride(1), comp_k.stride(0), comp_k.stride(1), comp_v.stride(0), comp_v.stride(1), comp_idx.stride(0),
            wks.stride(0), cks.stride(0), out.stride(0), out.stride(1))
    shape = dict(D=d, DV=block_dv, BKV=block_kv, TILES_PER_SPLIT=tiles_per_split, KBUF=num_stages,
                 SEL_P2=_fused_sel_rows(tiles_per_split, k_sel, block_kv), FINAL=final, HAS_SINK=sink is not None,
                 **({"launch_pdl": True} if pdl else {}))
    if _fused_warpgroups(block_dv) == 1:
        dual_scope_fused_ws_gluon.fused_ws_kernel[grid](*args, LOAD_WARPS=_LOADER_WARPS, LOAD_REGS=_LOADER_REGS,
                                                        num_warps=4, **shape)
    else:
        dual_scope_fused_gluon.fused_kernel[grid](*args, num_warps=8, **shape)
    if not final:
        _merge_splits(part_out, part_lse, sink_t, out, sink is not None, 16)
    return out


def dual_scope_decode(q: torch.Tensor, win_k: torch.Tensor, win_v: torch.Tensor, win_len: torch.Tensor,
                      comp_k: torch.Tensor, comp_v: torch.Tensor, comp_idx: torch.Tensor, *,
                      win_k_scale: torch.Tensor | None = None, win_v_scale: torch.Tensor | None = None,
                      comp_k_scale: torch.Tensor | None = None, comp_v_scale: torch.Tensor | None = None,
                      sink: torch.Tensor | None = None, sm_scale: float | None = None,
                      splits: int | None = None, block_h: int | None = None, block_kv: int | None = None,
                      block_dv: int | None = None, num_warps: int | None = None,
                      num_stages: int | None = None, schedule: int | None = None,
                      qk_fp16: bool | None = None, lazy_rescale: bool | None = None,
                      defer_sum: bool | None = None, values_warps: int | None = None,
                      values_stages: int | None = None, qk_fp8: bool | None = None,
                      gluon_values: bool | None = None, gluon_scores: bool | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over its window plus its selected entries.

    q: [B, H, D] (bf16, fp16 or fp32; D a power of two); win_k/win_v: [B, W, D]; win_len: [B];
    comp_k/comp_v: [B, Nc, D]; comp_idx: [B, k] int32 (-1 padded); fp8 keys/values need their
    float32 scales ([B, W] and [B, Nc]). sink: [H] float32 logits or None. sm_scale defaults to
    1/sqrt(D). Returns [B, H, D] in q's dtype; a sequence with no valid entry (and no sink) gets zeros.
    Launch parameters (defaults from `launch_config`, by batch): block_h heads and block_dv value columns per
    program, block_kv entries per tile, splits programs over the entries of a sequence (one split writes the
    output directly; more write (out, lse) partials that a second launch merges exactly), schedule of the
    entry loop (a `Schedule` or its integer: TWO_LOOPS, ONE_LOOP, TWO_PASS, FUSED_GLUON) with num_stages, qk_fp16 (fp8 keys: score dots in fp16 on a power-of-two scaled q), lazy_rescale (the
    accumulator rescaled only when a row maximum grows by more than 2^8; not with fp16 q and value scales, where
    P times a scale could pass fp16's range) and defer_sum (the softmax denominators summed per tile column,
    reduced over columns once at the end). TWO_PASS is the two-pass form (dual_scope_two_pass.py: the scores
    and probabilities of every tile, then the values by column block, with no online softmax), where splits is
    the scores programs per sequence and head block and values_warps / values_stages launch the values pass;
    its score dots run as fp8 MMAs on q split into two e4m3 parts (`qk_fp8`: by default with bf16 q and fp8
    keys, where the split is exact; True also takes fp16 q, exact for bf16-representable values). gluon_scores,
    gluon_values (TWO_PASS): that pass in Gluon on Hopper (`dual_scope_two_pass_gluon`; False: the Triton pass).
    FUSED_GLUON is one pass in Gluon on Hopper (bf16 q, fp8 keys, bf16 values without scales), with block_dv value
    columns per program (up to 256: one compute warpgroup and loader warps, `dual_scope_fused_ws_gluon`; 512: two
    warpgroups, `dual_scope_fused_gluon`), block_kv entries per tile, num_stages key slots and splits programs over
    a sequence's entries; where it cannot run it raises ValueError.
    """
    if q.dim() != 3:
        raise ValueError(f"q must be [B, H, D], got shape {tuple(q.shape)}")
    bsz, heads, d = q.shape
    if d & (d - 1):
        raise ValueError(f"D must be a power of two, got {d}")
    for name, t in (("win_k", win_k), ("win_v", win_v), ("comp_k", comp_k), ("comp_v", comp_v)):
        if t.dim() != 3 or t.shape[0] != bsz or t.shape[2] != d or t.stride(2) != 1:
            raise ValueError(f"{name} must be [B={bsz}, *, D={d}] with unit last stride, got {tuple(t.shape)}")
    if win_v.shape[1] != win_k.shape[1] or comp_v.shape[1] != comp_k.shape[1]:
        raise ValueError("keys and values of a scope must have the same number of entries")
    if comp_idx.dim() != 2 or comp_idx.shape[0] != bsz:
        raise ValueError(f"comp_idx must be [B={bsz}, k], got {tuple(comp_idx.shape)}")
    if win_len.shape != (bsz,):
        raise ValueError(f"win_len must be [B={bsz}], got {tuple(win_len.shape)}")
    if q.dtype not in _DOT_DTYPES:
        raise ValueError(f"q must be bf16, fp16 or fp32, got {q.dtype}")
    scales = {"win_k": (win_k, win_k_scale), "win_v": (win_v, win_v_scale),
              "comp_k": (comp_k, comp_k_scale), "comp_v": (comp_v, comp_v_scale)}
    for name, (t, sc) in scales.items():
        if t.element_size() == 1 and sc is None:
            raise ValueError(f"{name} is fp8: pass {name}_scale (float32 per entry)")
        if sc is not None and sc.shape != t.shape[:2]:
            raise ValueError(f"{name}_scale must be {tuple(t.shape[:2])}, got {tuple(sc.shape)}")
    k_scaled = win_k_scale is not None or comp_k_scale is not None
    v_scaled = win_v_scale is not None or comp_v_scale is not None
    dev = q.device

    def scale_or_ones(sc, t, needed):
        if sc is not None:
            return sc.to(torch.float32).contiguous()
        if needed:
            return torch.ones(t.shape[:2], dtype=torch.float32, device=dev)
        return torch.empty((t.shape[0], 1), dtype=torch.float32, device=dev)

    wks = scale_or_ones(win_k_scale, win_k, k_scaled)
    wvs = scale_or_ones(win_v_scale, win_v, v_scaled)
    cks = scale_or_ones(comp_k_scale, comp_k, k_scaled)
    cvs = scale_or_ones(comp_v_scale, comp_v, v_scaled)
    if sink is not None and sink.shape != (heads,):
        raise ValueError(f"sink must be [H={heads}], got {tuple(sink.shape)}")
    q = q.contiguous() if q.stride(2) != 1 else q
    comp_idx = comp_idx.to(device=dev, dtype=torch.int32).contiguous()
    win_len = win_len.to(device=dev, dtype=torch.int32).contiguous()
    w_entries, k_sel = win_k.shape[1], comp_idx.shape[1]
    one_loop = win_k.dtype == comp_k.dtype and win_v.dtype == comp_v.dtype
    fp8_keys = win_k.dtype == comp_k.dtype == torch.float8_e4m3fn
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)

    def config(sched):
        return launch_config(bsz, heads, d, w_entries + k_sel, block_h=block_h, block_dv=block_dv, block_kv=block_kv,
                             splits=splits, num_warps=num_warps, schedule=sched, num_stages=num_stages,
                             q_bytes=q.element_size(), one_loop=one_loop, qk_fp16=qk_fp16, lazy_rescale=lazy_rescale,
                             defer_sum=defer_sum, values_warps=values_warps, values_stages=values_stages,
                             kv_bytes=(max(win_k.element_size(), comp_k.element_size()),
                                       max(win_v.element_size(), comp_v.element_size())),
                             fp8_scores=fp8_keys and q.dtype == torch.bfloat16 and qk_fp8 is not False,
                             gluon=(gluon_scores is not False and gluon_values is not False and not v_scaled
                                    and gluon_ready(q, win_v, comp_v)), selected=k_sel)

    cfg = config(schedule)
    if schedule is None and cfg["schedule"] == Schedule.FUSED_GLUON and not scale > 0:
        cfg = config(Schedule.TWO_PASS)  # the one pass takes a row's maximum before scaling: a positive scale only
    block_h, block_dv, splits, block_kv = cfg["block_h"], cfg["block_dv"], cfg["splits"], cfg["block_kv"]
    schedule, num_stages = cfg["schedule"], cfg["num_stages"]
    qk_fp16 = (cfg["qk_fp16"] and q.dtype in (torch.bfloat16, torch.float16) and win_k.element_size() == 1
               and comp_k.element_size() == 1)
    lazy_rescale = cfg["lazy_rescale"] and not (q.dtype == torch.float16 and v_scaled)
    qk_fp8 = schedule == Schedule.TWO_PASS and fp8_keys and (q.dtype == torch.bfloat16 if qk_fp8 is None else
                                             bool(qk_fp8) and q.element_size() == 2)
    sink_f32 = sink.to(device=dev, dtype=torch.float32).contiguous() if sink is not None else None
    tiles = triton.cdiv(w_entries, block_kv) + triton.cdiv(k_sel, block_kv)
    out = torch.empty((bsz, heads, d), dtype=q.dtype, device=dev)
    if bsz == 0:
        return out
    if schedule == Schedule.FUSED_GLUON:
        if not fused_supported(q, win_k, comp_k, win_v, comp_v, v_scaled, scale, cfg):
            raise ValueError("schedule 4 (FUSED_GLUON, one pass in Gluon) needs an sm_90 GPU with Gluon, bf16 q "
                             "over fp8 e4m3 keys and bf16 values without scales, a positive sm_scale, D a multiple of "
                             "128, block_dv in (64, 128, 256, 512) dividing D, block_kv 32 or 64 and 2 or 3 key stages "
                             "within the device's shared memory")
        return _fused_decode(q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, cks, sink_f32, scale * LOG2E,
                             out, block_dv=block_dv, block_kv=block_kv, splits=splits, num_stages=num_stages)
    if schedule == Schedule.TWO_PASS:
        return two_pass_decode(
            q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, wvs, cks, cvs, sink_f32, scale * LOG2E, out,
            k_scaled=k_scaled, v_scaled=v_scaled, qk_fp16=qk_fp16, qk_fp8=qk_fp8, block_h=block_h, block_kv=block_kv,
            block_dv=block_dv, tiles_per_prog=triton.cdiv(tiles, splits), num_warps=cfg["num_warps"],
            values_warps=cfg["values_warps"], num_stages=num_stages, values_stages=cfg["values_stages"],
            dot_dtype=_DOT_DTYPES[q.dtype], precision=dot_precision(q.dtype),
            gluon_values=gluon_values, gluon_scores=gluon_scores)
    head_blocks = triton.cdiv(heads, block_h)
    tiles_per_split, splits, part_out, part_lse = _split_partials(bsz, heads, d, tiles, splits, dev)
    final = splits == 1
    sink_t = sink_f32 if sink is not None else part_lse
    _dual_scope_partial_kernel[(bsz, head_blocks * (d // block_dv), splits)](
        q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, wks, wvs, cks, cvs, part_out, part_lse, sink_t, out,
        heads, w_entries, k_sel, scale * LOG2E,
        q.stride(0), q.stride(1), win_k.stride(0), win_k.stride(1), win_v.stride(0), win_v.stride(1),
        comp_k.stride(0), comp_k.stride(1), comp_v.stride(0), comp_v.stride(1), comp_idx.stride(0),
        wks.stride(0), wvs.stride(0), cks.stride(0), cvs.stride(0), out.stride(0), out.stride(1),
        D=d, DV=block_dv, BH=block_h, BKV=block_kv, TILES_PER_SPLIT=tiles_per_split, K_SCALED=k_scaled,
        V_SCALED=v_scaled, DOT_DTYPE=_DOT_DTYPES[q.dtype],
        PRECISION=dot_precision(q.dtype), FINAL=final, HAS_SINK=sink is not None,
        ONE_LOOP=schedule == Schedule.ONE_LOOP, QK_F16=qk_fp16, LAZY_RESCALE=lazy_rescale,
        DEFER_SUM=cfg["defer_sum"],
        SEL_TILES=triton.next_power_of_2(max(1, triton.cdiv(k_sel, block_kv))),
        num_warps=cfg["num_warps"], num_stages=num_stages)
    if not final:
        _merge_splits(part_out, part_lse, sink_t, out, sink is not None, min(block_h, 16))
    return out
