"""CSA dual-scope decode in one pass, written in Gluon for Hopper (sm_90): `dual_scope_decode(..., schedule=4)`,
the default there from batch 8.

The same attention as `dual_scope_decode` (its docstring has the math, shapes and index conventions) for bf16
q over fp8 e4m3 keys with per-entry scales and bf16 values without scales (the DeepSeek-V4 cache), with no
intermediate in global memory: programs (sequence b, head block of 64 x value-column block of DV, entry split),
one warpgroup each, run an online softmax over 32-entry tiles:

- q arrives split into two e4m3 parts per head with its score scale (`dual_scope_tiles.split_q_kernel`, a small
  launch before this one, once per sequence; programmatic dependent launch overlaps the two);
- the program's selected indices are loaded first and staged in shared memory; per tile the gathered key rows
  (all D columns, fp8), value rows (the program's DV columns), key scales and valid flags land by cp.async in a
  ring of NUM_BUF slots, NUM_BUF - 1 tiles ahead;
- S = q K^T as two fp8 warpgroup MMAs (q's parts in shared memory), scaled per head and per entry in registers;
- m, l and the [64, DV] float32 accumulator stay in the warpgroup's registers; P goes to the value MMA from
  registers (no shared-memory round trip), acc = alpha * acc + P V.

Why: the two-pass schedule (`dual_scope_two_pass`) reads the keys in one launch and the values in another and
moves P through L2 between them (B=64: 43.6 us against a 17.1 us byte floor, H200 run 33-decode). Here each
program reads its keys and values once, in one launch: 33 us at B=64, 1.04-1.32x the two passes from B=8 to 128
(run 33). The value columns are split into D / DV blocks (DV <= 256: the MMA's N and the accumulator's 128
registers per thread), so each block computes the scores: the sibling blocks of a sequence run at the same time
and the second reads its key rows from L2. With one split the program normalizes, adds the sink and writes the
output; with several it writes a normalized partial with its log-sum-exp and `merge_partials_kernel` merges them.
Measured and removed (sparse_README.md, runs 26-32): 64-entry tiles (spills, one tile in flight), the split of q
in every program (a quarter of the samples), two warpgroups by warp specialization (a ring each, or a producer
warpgroup and two consumers), the score MMAs one tile ahead, a lazy rescale.
`_tile_row_ptrs`, `_tile_sel` and `ring_landed` are `dual_scope_two_pass_gluon`'s.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma, \
    warpgroup_mma_wait

from zoe_kernels.csa.dual_scope_two_pass_gluon import _tile_row_ptrs, _tile_sel, ring_landed


@gluon.jit
def _issue_tile(t, slot, k_sel, v_sel, c_sel, k_ring, v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len,
                k_rows, k_cols, v_rows, v_cols, c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base,
                comp_ks_base, stride_wkn, stride_ckn, stride_wvn, stride_cvn, BKV: gl.constexpr):
    """The cp.async copies of tile t into ring `slot`: its key rows, value rows, key scales, and 1.0 for each valid
    entry (masked copies write zeros: a masked entry's row, scale and flag are 0)."""
    k_ptrs, k_ok = _tile_row_ptrs(t, win_tiles, win_len, t_end, k_rows, k_sel, win_k_base, comp_k_base, stride_wkn,
                                  stride_ckn, BKV)
    async_copy.async_copy_global_to_shared(k_ring.index(slot), k_ptrs[:, None] + k_cols[None, :], mask=k_ok[:, None])
    v_ptrs, v_ok = _tile_row_ptrs(t, win_tiles, win_len, t_end, v_rows, v_sel, win_v_base, comp_v_base, stride_wvn,
                                  stride_cvn, BKV)
    async_copy.async_copy_global_to_shared(v_ring.index(slot), v_ptrs[:, None] + v_cols[None, :], mask=v_ok[:, None])
    s_ptrs, s_ok = _tile_row_ptrs(t, win_tiles, win_len, t_end, c_rows, c_sel, win_ks_base, comp_ks_base, 1, 1, BKV)
    async_copy.async_copy_global_to_shared(ks_ring.index(slot), s_ptrs, mask=s_ok)
    async_copy.async_copy_global_to_shared(vld_ring.index(slot), ones_ptr + c_rows, mask=s_ok)


@gluon.jit
def _load_sel(idx_row, t0, t_end, win_tiles, KSEL, TP2: gl.constexpr, BKV: gl.constexpr):
    """The selected indices of tiles t0 .. t_end - 1 as [TP2, BKV] (row i: tile t0 + i; -1 outside the selection
    and for window tiles), loaded first thing so that their latency overlaps the first copies; `idx_smem` holds
    them for the loop. Each tile's row pointers then come from shared memory: an index load from global memory
    right before the copies it feeds waited on it every tile (H200 run 27 `ncu`: a third of the loop's stall
    samples on the address arithmetic; run 30: 35.6 against 38.5-40.0 us at B=64 in runs 26-29)."""
    lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
    ti = gl.arange(0, TP2, layout=gl.SliceLayout(1, lay))
    rr = gl.arange(0, BKV, layout=gl.SliceLayout(0, lay))
    pos = (t0 + ti[:, None] - win_tiles) * BKV + rr[None, :]
    ok = (pos >= 0) & (pos < KSEL) & ((t0 + ti[:, None]) < t_end)
    return gl.load(idx_row + pos, mask=ok, other=-1)


@gluon.jit
def _score_mma(q_hi_smem, q_lo_smem, k_buf, s_zero):
    """The score MMAs of one key tile, asynchronous: (q_hi + q_lo) K^T, two fp8 MMAs on the rows as copied."""
    k_t = k_buf.permute((1, 0))  # [D, BKV]: the keys' D contiguous (K-major)
    s = warpgroup_mma(q_hi_smem, k_t, s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_lo_smem, k_t, s, is_async=True)


@gluon.jit
def _attend_tile(s, ks_buf, vld_buf, v_buf, row_scale, m_i, l_i, acc, mma_s: gl.constexpr, mma_o: gl.constexpr,
                 FMA_SOFTMAX: gl.constexpr = 0):
    """One tile's step of the online softmax in base 2 from its scores s: scaled per head and per entry, -inf for
    a masked entry; acc = alpha acc + P V, P from registers. Returns the new m, l and the value MMA's token. (A
    lazy rescale, the accumulator multiplied only when some row's maximum grows by more than 2^8, measured slower:
    37.2 against 33.1 us at B=64 in run 32, its warpgroup-wide branch costing a cross-warp reduction per tile.)"""
    ks = ks_buf.load(gl.SliceLayout(0, mma_s))
    vld = vld_buf.load(gl.SliceLayout(0, mma_s))
    if FMA_SOFTMAX:
        s = s * ks[None, :] + gl.where(vld > 0, 0.0, float("-inf"))[None, :]
        m_new = gl.maximum(m_i, row_scale * gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s * row_scale[:, None] - m_safe[:, None])
    else:
        s = gl.where(vld[None, :] > 0, s * row_scale[:, None] * ks[None, :], float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    pv = warpgroup_mma(gl.convert_layout(p.to(v_buf.dtype), p_op), v_buf, acc, is_async=True)
    return m_new, l_i, pv


@gluon.jit
def _finish(acc, m, l, r_heads, o_cols, H, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, bq, split, n_splits,
            stride_ob, stride_oh, dv0, D: gl.constexpr, FINAL: gl.constexpr, HAS_SINK: gl.constexpr,
            st_layout: gl.constexpr):
    """Columns o_cols of the program's output from acc (relative to its rows' m) and the denominators l: with
    FINAL normalized (the sink in the denominator) into `out`, else a normalized partial and its log-sum-exp."""
    h_ok = r_heads < H
    if FINAL:
        denom = l
        if HAS_SINK:
            sink = gl.load(sink_ptr + r_heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
            top = gl.maximum(m, sink)
            top = gl.where(top == float("-inf"), 0.0, top)
            f = gl.exp2(gl.where(m == float("-inf"), top, m) - top)
            denom = l * f + gl.exp2(sink - top)
            acc = acc * f[:, None]
        inv = gl.where(denom > 0, 1.0 / gl.where(denom > 0, denom, 1.0), 0.0)
        # 16 bytes a store: the accumulator's layout holds 2 adjacent columns per thread
        o = gl.convert_layout((acc * inv[:, None]).to(out_ptr.dtype.element_ty), st_layout)
        s_heads = gl.convert_layout(r_heads, gl.SliceLayout(1, st_layout))
        s_cols = gl.convert_layout(o_cols, gl.SliceLayout(0, st_layout))
        gl.store(out_ptr + bq * stride_ob + s_heads[:, None] * stride_oh + s_cols[None, :], o,
                 mask=(s_heads < H)[:, None])
    else:
        inv = gl.where(l > 0, 1.0 / gl.where(l > 0, l, 1.0), 0.0)
        row = (bq * n_splits + split) * H + r_heads
        gl.store(part_out_ptr + row[:, None] * D + o_cols[None, :], acc * inv[:, None], mask=h_ok[:, None])
        lse = gl.where(l > 0, m + gl.log2(gl.where(l > 0, l, 1.0)), float("-inf"))
        gl.store(part_lse_ptr + row, lse, mask=h_ok & (dv0 == 0))


@gluon.jit
def _copy_q(q_hi_smem, q_lo_smem, scale_smem, q8_ptr, qs_ptr, b, bq, h0, H, stride_q8b, D: gl.constexpr,
            WARPS: gl.constexpr):
    """q's two e4m3 parts and the per-head score scale (split_q_kernel, the launch before this one) into shared
    memory by cp.async, after the previous launch's writes are visible (programmatic dependent launch lets this
    program start before that launch ends)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    q_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [WARPS, 1], [1, 0])
    q_heads = h0 + gl.arange(0, 64, layout=gl.SliceLayout(1, q_copy))
    q_cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_copy))
    q_rows = q8_ptr + bq * stride_q8b + q_heads[:, None].to(gl.int64) * D + q_cols[None, :]
    q_ok = (q_heads < H)[:, None]
    async_copy.async_copy_global_to_shared(q_hi_smem, q_rows, mask=q_ok)
    async_copy.async_copy_global_to_shared(q_lo_smem, q_rows + H * D, mask=q_ok)
    s_heads = h0 + gl.arange(0, 64, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
    async_copy.async_copy_global_to_shared(scale_smem, qs_ptr + b * H + s_heads, mask=s_heads < H)


@gluon.jit
def fused_kernel(
    q8_ptr, qs_ptr, ones_ptr, win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr, win_ks_ptr,
    comp_ks_ptr, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, H, W, KSEL, T, stride_q8b, stride_wkb, stride_wkn,
    stride_wvb, stride_wvn, stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_ib, stride_wksb, stride_cksb,
    stride_ob, stride_oh,
    D: gl.constexpr, DV: gl.constexpr, BKV: gl.constexpr, TILES_PER_SPLIT: gl.constexpr, NUM_BUF: gl.constexpr,
    FINAL: gl.constexpr, HAS_SINK: gl.constexpr, num_warps: gl.constexpr, OPAQUE_Q: gl.constexpr = 0,
    EARLY_COPY: gl.constexpr = 0,
    FMA_SOFTMAX: gl.constexpr = 0, SCORES_AHEAD: gl.constexpr = 0, AHEAD_WAIT: gl.constexpr = 2,
):
    """Program (b, head block x value-column block, split), one warpgroup: see the module docstring. part_out:
    [B, splits, H, D] float32, part_lse: [B, splits, H] (log2 units), written only without FINAL."""
    gl.static_assert(num_warps == 4, "one warpgroup: m, l and the accumulator's rows stay in its warps")
    BH: gl.constexpr = 64  # heads per program: the warpgroup MMA's M
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    split = gl.program_id(2)
    t0 = split * TILES_PER_SPLIT
    t_end = gl.minimum(t0 + TILES_PER_SPLIT, T)
    n_tiles = t_end - t0
    bq = b.to(gl.int64)

    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BKV, 32])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    c_copy: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    fp8: gl.constexpr = gl.float8e4nv
    vdt: gl.constexpr = win_v_ptr.dtype.element_ty
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # rank 1: the ring index drops the leading dim
    q_smem = gl.allocate_shared_memory(fp8, [2, BH, D], gl.NVMMASharedLayout.get_default_for([BH, D], fp8))
    q_hi_smem = q_smem.index(0)
    q_lo_smem = q_smem.index(1)
    scale_smem = gl.allocate_shared_memory(gl.float32, [BH], flat)
    k_ring = gl.allocate_shared_memory(fp8, [NUM_BUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))
    v_ring = gl.allocate_shared_memory(vdt, [NUM_BUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], vdt))
    ks_ring = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BKV], flat)
    vld_ring = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BKV], flat)
    TP2: gl.constexpr = triton.next_power_of_2(TILES_PER_SPLIT)
    idx_smem = gl.allocate_shared_memory(gl.int32, [TP2, BKV], flat)

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    k_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, k_copy))
    k_cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_copy))
    v_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, v_copy))
    v_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, v_copy))
    c_rows = gl.arange(0, BKV, layout=c_copy)
    win_k_base = win_k_ptr + bq * stride_wkb
    comp_k_base = comp_k_ptr + bq * stride_ckb
    win_v_base = win_v_ptr + bq * stride_wvb
    comp_v_base = comp_v_ptr + bq * stride_cvb
    win_ks_base = win_ks_ptr + bq * stride_wksb
    comp_ks_base = comp_ks_ptr + bq * stride_cksb
    idx_row = comp_idx_ptr + bq * stride_ib

    # prologue: the program's selected indices on their way, tiles 0 .. NUM_BUF - 2 in flight (one commit group
    # each), then q (its own group); the indices into shared memory
    sel_all = _load_sel(idx_row, t0, t_end, win_tiles, KSEL, TP2, BKV)
    for i in gl.static_range(NUM_BUF - 1):
        t = t0 + i
        _issue_tile(t, i, _tile_sel(idx_row, t, win_tiles, KSEL, k_rows, BKV),
                    _tile_sel(idx_row, t, win_tiles, KSEL, v_rows, BKV), _tile_sel(idx_row, t, win_tiles, KSEL, c_rows,
                    BKV), k_ring, v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len, k_rows, k_cols,
                    v_rows, v_cols, c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base,
                    comp_ks_base, stride_wkn, stride_ckn, stride_wvn, stride_cvn, BKV)
        async_copy.commit_group()
    _copy_q(q_hi_smem, q_lo_smem, scale_smem, q8_ptr, qs_ptr, b, bq, h0, H, stride_q8b, D, 4)
    async_copy.commit_group()
    idx_smem._reinterpret(gl.int32, [TP2, BKV], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(sel_all)
    ring_landed(0)  # every copy so far, the indices' store

    row_scale = scale_smem.load(gl.SliceLayout(1, mma_s))
    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BH, DV], gl.float32, layout=mma_o)
    s_zero = gl.zeros([BH, BKV], gl.float32, layout=mma_s)
    if SCORES_AHEAD:
        # the score MMAs of tile j + 1 run while the softmax of tile j does; ring slots hold tiles j - 1 .. j + 2
        p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        s_a = _score_mma(q_smem.index(0), q_smem.index(1), k_ring.index(0), s_zero)
        acc = warpgroup_mma(gl.zeros([BH, BKV], vdt, layout=p_op), v_ring.index(0), acc, use_acc=False,
                            is_async=True)  # the loop carries the value MMA in flight: a first one, of zeros
        s_b = s_zero
        # two tiles an iteration, so that each tile's scores keep their registers (a loop-carried copy of an
        # accumulator in flight makes ptxas serialize every warpgroup MMA); past n_tiles a tile is all masked
        for j in range(0, n_tiles, 2):
            z = j // (n_tiles + 2)
            ring_landed(NUM_BUF - 3)  # tile j + 1 landed
            s_b = _score_mma(q_smem.index(z), q_smem.index(z + 1), k_ring.index((j + 1) % NUM_BUF), s_b)
            s_a, acc = warpgroup_mma_wait(num_outstanding=AHEAD_WAIT, deps=(s_a, acc))  # S(j), P(j-1) V(j-1) done
            gl.thread_barrier()  # in every warp: tile j - 1's slot free
            jn = gl.minimum(j + NUM_BUF - 1, TP2 - 1)  # past the program's tiles: masked copies, any indices
            _issue_tile(t0 + j + NUM_BUF - 1, (j + NUM_BUF - 1) % NUM_BUF, idx_smem.index(jn).load(gl.SliceLayout(1, k_copy)),
                        idx_smem.index(jn).load(gl.SliceLayout(1, v_copy)), idx_smem.index(jn).load(c_copy), k_ring,
                        v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len, k_rows, k_cols, v_rows, v_cols,
                        c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base, comp_ks_base, stride_wkn,
                        stride_ckn, stride_wvn, stride_cvn, BKV)
            async_copy.commit_group()
            m_i, l_i, acc = _attend_tile(s_a, ks_ring.index(j % NUM_BUF), vld_ring.index(j % NUM_BUF),
                                         v_ring.index(j % NUM_BUF), row_scale, m_i, l_i, acc, mma_s, mma_o, FMA_SOFTMAX)
            ring_landed(NUM_BUF - 3)  # tile j + 2 landed
            s_a = _score_mma(q_smem.index(z), q_smem.index(z + 1), k_ring.index((j + 2) % NUM_BUF), s_a)
            s_b, acc = warpgroup_mma_wait(num_outstanding=AHEAD_WAIT, deps=(s_b, acc))  # S(j+1), P(j) V(j) done
            gl.thread_barrier()  # in every warp: tile j's slot free
            jn = gl.minimum(j + NUM_BUF, TP2 - 1)  # past the program's tiles: masked copies, any indices
            _issue_tile(t0 + j + NUM_BUF, (j + NUM_BUF) % NUM_BUF, idx_smem.index(jn).load(gl.SliceLayout(1, k_copy)),
                        idx_smem.index(jn).load(gl.SliceLayout(1, v_copy)), idx_smem.index(jn).load(c_copy), k_ring,
                        v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len, k_rows, k_cols, v_rows, v_cols,
                        c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base, comp_ks_base, stride_wkn,
                        stride_ckn, stride_wvn, stride_cvn, BKV)
            async_copy.commit_group()
            m_i, l_i, acc = _attend_tile(s_b, ks_ring.index((j + 1) % NUM_BUF), vld_ring.index((j + 1) % NUM_BUF),
                                         v_ring.index((j + 1) % NUM_BUF), row_scale, m_i, l_i, acc, mma_s, mma_o,
                                         FMA_SOFTMAX)
        acc, s_a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_a))
    else:
        for j in range(0, n_tiles):
            ring_landed(NUM_BUF - 2)  # tile j; tile j - 1's slot free for the copies below
            slot = j % NUM_BUF
            if OPAQUE_Q == 1:
                z = j // (n_tiles + 1)
                s = _score_mma(q_smem.index(z), q_smem.index(z + 1), k_ring.index(slot), s_zero)
            else:
                s = _score_mma(q_hi_smem, q_lo_smem, k_ring.index(slot), s_zero)
            if EARLY_COPY:
                # while the value MMA runs: tile j + NUM_BUF - 1 into the slot tile j - 1 used
                jn = gl.minimum(j + NUM_BUF - 1, TP2 - 1)  # past the program's tiles: masked copies, any indices
                _issue_tile(t0 + j + NUM_BUF - 1, (j + NUM_BUF - 1) % NUM_BUF, idx_smem.index(jn).load(gl.SliceLayout(1, k_copy)),
                            idx_smem.index(jn).load(gl.SliceLayout(1, v_copy)), idx_smem.index(jn).load(c_copy), k_ring,
                            v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len, k_rows, k_cols, v_rows, v_cols,
                            c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base, comp_ks_base, stride_wkn,
                            stride_ckn, stride_wvn, stride_cvn, BKV)
                async_copy.commit_group()
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            m_i, l_i, pv = _attend_tile(s, ks_ring.index(slot), vld_ring.index(slot), v_ring.index(slot), row_scale, m_i,
                                        l_i, acc, mma_s, mma_o, FMA_SOFTMAX)
            if not EARLY_COPY:
                # while the value MMA runs: tile j + NUM_BUF - 1 into the slot tile j - 1 used
                jn = gl.minimum(j + NUM_BUF - 1, TP2 - 1)  # past the program's tiles: masked copies, any indices
                _issue_tile(t0 + j + NUM_BUF - 1, (j + NUM_BUF - 1) % NUM_BUF, idx_smem.index(jn).load(gl.SliceLayout(1, k_copy)),
                            idx_smem.index(jn).load(gl.SliceLayout(1, v_copy)), idx_smem.index(jn).load(c_copy), k_ring,
                            v_ring, ks_ring, vld_ring, ones_ptr, t_end, win_tiles, win_len, k_rows, k_cols, v_rows, v_cols,
                            c_rows, win_k_base, comp_k_base, win_v_base, comp_v_base, win_ks_base, comp_ks_base, stride_wkn,
                            stride_ckn, stride_wvn, stride_cvn, BKV)
                async_copy.commit_group()
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
    async_copy.wait_group(0)

    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_o))
    o_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, mma_o))
    _finish(acc, gl.convert_layout(m_i, gl.SliceLayout(1, mma_o)), gl.convert_layout(l_i, gl.SliceLayout(1, mma_o)),
            r_heads, o_cols, H, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, bq, split, gl.num_programs(2), stride_ob,
            stride_oh, dv0, D, FINAL, HAS_SINK, gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _rows_of(t, win_tiles, win_len, t_end, rows, sel, win_base, comp_base, stride_wn, stride_cn, BKV: gl.constexpr):
    """Row pointers and valid mask of tile t, by a branch on the tile's scope (the program's tiles all take the
    same side): a window tile's positions below win_len, else the selected entries `sel` (-1: none); none at or
    past t_end. A masked copy reads nothing, so a masked row's pointer is left as it is."""
    if t < win_tiles:
        pos = t * BKV + rows
        ptrs = win_base + pos.to(gl.int64) * stride_wn
        ok = (pos < win_len) & (t < t_end)
    else:
        ptrs = comp_base + sel.to(gl.int64) * stride_cn
        ok = (sel >= 0) & (t < t_end)
    return ptrs, ok


@gluon.jit
def _issue_keys(t, slot, sel_k, sel_c, k_ring, ks_ring, t_end, win_tiles, win_len, k_rows, k_cols, c_rows, win_k_base,
                comp_k_base, win_ks_base, comp_ks_base, stride_wkn, stride_ckn, BKV: gl.constexpr):
    """The cp.async copies of tile t's key rows and key scales into key slot `slot` (masked: zeros)."""
    k_ptrs, k_ok = _rows_of(t, win_tiles, win_len, t_end, k_rows, sel_k, win_k_base, comp_k_base, stride_wkn,
                                  stride_ckn, BKV)
    async_copy.async_copy_global_to_shared(k_ring.index(slot), k_ptrs[:, None] + k_cols[None, :], mask=k_ok[:, None])
    s_ptrs, s_ok = _rows_of(t, win_tiles, win_len, t_end, c_rows, sel_c, win_ks_base, comp_ks_base, 1, 1, BKV)
    async_copy.async_copy_global_to_shared(ks_ring.index(slot), s_ptrs, mask=s_ok)


@gluon.jit
def _issue_values(t, slot, sel_v, v_ring, t_end, win_tiles, win_len, v_rows, v_cols, win_v_base, comp_v_base,
                  stride_wvn, stride_cvn, BKV: gl.constexpr):
    """The cp.async copies of tile t's value rows (the program's columns) into value slot `slot` (masked: zeros)."""
    v_ptrs, v_ok = _rows_of(t, win_tiles, win_len, t_end, v_rows, sel_v, win_v_base, comp_v_base, stride_wvn,
                                  stride_cvn, BKV)
    async_copy.async_copy_global_to_shared(v_ring.index(slot), v_ptrs[:, None] + v_cols[None, :], mask=v_ok[:, None])


@gluon.jit
def _sel_row(idx_smem, t, t_sel0, SEL_P2: gl.constexpr, layout: gl.constexpr):
    """The selected indices of tile t (any values for a window tile or past the program's tiles: the copies and the
    validity mask do not read them there) from shared memory, in `layout`."""
    r = gl.minimum(gl.maximum(t - t_sel0, 0), SEL_P2 - 1)
    return idx_smem.index(r).load(layout)


@gluon.jit
def _e4m3_round(x):
    """`dual_scope_tiles.e4m3_round` in Gluon: x rounded to nearest-even at e4m3's 3 mantissa bits, in float32."""
    bits = x.to(gl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _split_rows(q, r0: gl.constexpr, q_smem, scale_buf, qk_scale_log2):
    """`dual_scope_tiles.split_q_fp8` of q's rows r0 .. r0 + 16 (bf16) into the two e4m3 parts in q_smem and each
    row's score scale qk_scale_log2 / c into scale_buf."""
    qf = q.to(gl.float32)
    amax = gl.max(gl.abs(qf), axis=1)
    c = gl.exp2(gl.minimum(gl.floor(gl.log2(448.0 / gl.where(amax > 0, amax, 448.0))), 126.0))
    qs = qf * c[:, None]
    hi = _e4m3_round(qs)
    q_smem.index(0).slice(r0, 16).store(hi.to(gl.float8e4nv))
    q_smem.index(1).slice(r0, 16).store((qs - hi).to(gl.float8e4nv))
    scale_buf.slice(r0, 16).store(qk_scale_log2 / c)


@gluon.jit
def fused_kv_kernel(
    q8_ptr, qs_ptr, win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr, win_ks_ptr,
    comp_ks_ptr, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, H, W, KSEL, T, stride_q8b, stride_wkb, stride_wkn,
    stride_wvb, stride_wvn, stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_ib, stride_wksb, stride_cksb,
    stride_ob, stride_oh, q_ptr, stride_qb, stride_qh, qk_scale_log2,
    D: gl.constexpr, DV: gl.constexpr, BKV: gl.constexpr, TILES_PER_SPLIT: gl.constexpr, KBUF: gl.constexpr,
    VBUF: gl.constexpr, SEL_P2: gl.constexpr, FINAL: gl.constexpr, HAS_SINK: gl.constexpr, num_warps: gl.constexpr,
    ONE_WAIT: gl.constexpr = 0, INSPLIT: gl.constexpr = 0,
):
    """EXPERIMENT (run 36): key rows KBUF - 1 tiles ahead and value rows VBUF - 1 tiles ahead in rings of their own,
    validity from the staged indices, the row scales loaded from global memory."""
    gl.static_assert(num_warps == 4, "one warpgroup: m, l and the accumulator's rows stay in its warps")
    gl.static_assert(KBUF >= 3 and VBUF == 2, "keys two tiles ahead, values one")
    BH: gl.constexpr = 64
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    split = gl.program_id(2)
    t0 = split * TILES_PER_SPLIT
    t_end = gl.minimum(t0 + TILES_PER_SPLIT, T)
    n_tiles = t_end - t0
    bq = b.to(gl.int64)

    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BKV, 32])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    c_copy: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    col_s: gl.constexpr = gl.SliceLayout(0, mma_s)
    fp8: gl.constexpr = gl.float8e4nv
    vdt: gl.constexpr = win_v_ptr.dtype.element_ty
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_smem = gl.allocate_shared_memory(fp8, [2, BH, D], gl.NVMMASharedLayout.get_default_for([BH, D], fp8))
    k_ring = gl.allocate_shared_memory(fp8, [KBUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))
    v_ring = gl.allocate_shared_memory(vdt, [VBUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], vdt))
    ks_ring = gl.allocate_shared_memory(gl.float32, [KBUF, BKV], flat)
    idx_smem = gl.allocate_shared_memory(gl.int32, [SEL_P2, BKV], flat)

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    t_sel0 = gl.maximum(t0, win_tiles)  # the program's first tile of selected entries
    k_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, k_copy))
    k_cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_copy))
    v_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, v_copy))
    v_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, v_copy))
    c_rows = gl.arange(0, BKV, layout=c_copy)
    win_k_base = win_k_ptr + bq * stride_wkb
    comp_k_base = comp_k_ptr + bq * stride_ckb
    win_v_base = win_v_ptr + bq * stride_wvb
    comp_v_base = comp_v_ptr + bq * stride_cvb
    win_ks_base = win_ks_ptr + bq * stride_wksb
    comp_ks_base = comp_ks_ptr + bq * stride_cksb
    idx_row = comp_idx_ptr + bq * stride_ib

    # prologue: the selected indices of the program's tiles on their way; keys of tiles 0 .. KBUF - 2 and values of
    # tile 0 in flight, then q; the indices into shared memory
    sel_lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    si = gl.arange(0, SEL_P2, layout=gl.SliceLayout(1, sel_lay))
    sc = gl.arange(0, BKV, layout=gl.SliceLayout(0, sel_lay))
    s_pos = (t_sel0 + si[:, None] - win_tiles) * BKV + sc[None, :]
    sel_all = gl.load(idx_row + s_pos, mask=(s_pos < KSEL) & ((t_sel0 + si[:, None]) < t_end), other=-1)
    for i in gl.static_range(KBUF - 1):
        t = t0 + i
        _issue_keys(t, i, _tile_sel(idx_row, t, win_tiles, KSEL, k_rows, BKV),
                    _tile_sel(idx_row, t, win_tiles, KSEL, c_rows, BKV), k_ring, ks_ring, t_end, win_tiles, win_len,
                    k_rows, k_cols, c_rows, win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn,
                    stride_ckn, BKV)
        if i == 0:
            _issue_values(t, 0, _tile_sel(idx_row, t, win_tiles, KSEL, v_rows, BKV), v_ring, t_end, win_tiles,
                          win_len, v_rows, v_cols, win_v_base, comp_v_base, stride_wvn, stride_cvn, BKV)
        async_copy.commit_group()
    if INSPLIT:  # q's bf16 rows, split while the copies above are in flight
        q_lay: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        qh = gl.arange(0, 16, layout=gl.SliceLayout(1, q_lay))
        qc = gl.arange(0, D, layout=gl.SliceLayout(0, q_lay))
        q_base = q_ptr + bq * stride_qb + qc[None, :]
        q0 = gl.load(q_base + (h0 + qh)[:, None] * stride_qh, mask=(h0 + qh < H)[:, None], other=0.0)
        q1 = gl.load(q_base + (h0 + 16 + qh)[:, None] * stride_qh, mask=(h0 + 16 + qh < H)[:, None], other=0.0)
        _split_rows(q0, 0, q_smem, ks_ring.index(KBUF - 1), qk_scale_log2)
        q2 = gl.load(q_base + (h0 + 32 + qh)[:, None] * stride_qh, mask=(h0 + 32 + qh < H)[:, None], other=0.0)
        _split_rows(q1, 16, q_smem, ks_ring.index(KBUF - 1), qk_scale_log2)
        q3 = gl.load(q_base + (h0 + 48 + qh)[:, None] * stride_qh, mask=(h0 + 48 + qh < H)[:, None], other=0.0)
        _split_rows(q2, 32, q_smem, ks_ring.index(KBUF - 1), qk_scale_log2)
        _split_rows(q3, 48, q_smem, ks_ring.index(KBUF - 1), qk_scale_log2)
    else:
        zero = gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                         pack=1)
        q_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        q_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, q_copy))
        q_cols = gl.arange(0, D, layout=gl.SliceLayout(0, q_copy))
        q_rows = q8_ptr + bq * stride_q8b + q_heads[:, None].to(gl.int64) * D + q_cols[None, :]
        async_copy.async_copy_global_to_shared(q_smem.index(0), q_rows, mask=(q_heads < H)[:, None])
        async_copy.async_copy_global_to_shared(q_smem.index(1), q_rows + H * D, mask=(q_heads < H)[:, None])
        async_copy.commit_group()
        r_heads_s = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_s))
        row_scale = gl.load(qs_ptr + b * H + r_heads_s + zero, mask=r_heads_s < H, other=1.0)
    idx_smem._reinterpret(gl.int32, [SEL_P2, BKV], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(sel_all)
    ring_landed(0)
    if INSPLIT:  # the row scales, from the key-scale slot they were parked in (its first copy is in the loop)
        row_scale = ks_ring.index(KBUF - 1).load(gl.SliceLayout(1, mma_s))

    cols_s = gl.arange(0, BKV, layout=col_s)
    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BH, DV], gl.float32, layout=mma_o)
    s_zero = gl.zeros([BH, BKV], gl.float32, layout=mma_s)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    for j in range(0, n_tiles):
        t = t0 + j
        if ONE_WAIT:
            ring_landed(1)  # keys, scales and values of tile j (the keys of j + 1 may be in flight)
        else:
            ring_landed(2)  # keys and scales of tile j (the values of j + 1 and keys of j + 1 may be in flight)
        z = j >> 20  # 0, opaque: the q descriptors are computed here, not held in registers
        s = _score_mma(q_smem.index(z), q_smem.index(z + 1), k_ring.index(j % KBUF), s_zero)
        tv = t + 1
        _issue_values(tv, (j + 1) % VBUF, _sel_row(idx_smem, tv, t_sel0, SEL_P2, gl.SliceLayout(1, v_copy)), v_ring,
                      t_end, win_tiles, win_len, v_rows, v_cols, win_v_base, comp_v_base, stride_wvn, stride_cvn, BKV)
        async_copy.commit_group()
        tk = t + KBUF - 1
        _issue_keys(tk, (j + KBUF - 1) % KBUF, _sel_row(idx_smem, tk, t_sel0, SEL_P2, gl.SliceLayout(1, k_copy)),
                    _sel_row(idx_smem, tk, t_sel0, SEL_P2, c_copy), k_ring, ks_ring, t_end, win_tiles, win_len, k_rows,
                    k_cols, c_rows, win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn, stride_ckn, BKV)
        async_copy.commit_group()
        # validity of tile j's entries: window positions below win_len, selected indices >= 0
        if t < win_tiles:
            bias = gl.where(t * BKV + cols_s < win_len, 0.0, float("-inf"))
        else:
            bias = gl.where(_sel_row(idx_smem, t, t_sel0, SEL_P2, col_s) >= 0, 0.0, float("-inf"))
        ks = ks_ring.index(j % KBUF).load(col_s)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        s = s * ks[None, :] + bias[None, :]
        m_new = gl.maximum(m_i, row_scale * gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s * row_scale[:, None] - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
        p_dot = gl.convert_layout(p.to(vdt), p_op)
        if not ONE_WAIT:
            ring_landed(3)  # values of tile j
        pv = warpgroup_mma(p_dot, v_ring.index(j % VBUF), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
    async_copy.wait_group(0)

    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_o))
    o_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, mma_o))
    _finish(acc, gl.convert_layout(m_i, gl.SliceLayout(1, mma_o)), gl.convert_layout(l_i, gl.SliceLayout(1, mma_o)),
            r_heads, o_cols, H, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, bq, split, gl.num_programs(2), stride_ob,
            stride_oh, dv0, D, FINAL, HAS_SINK, gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
