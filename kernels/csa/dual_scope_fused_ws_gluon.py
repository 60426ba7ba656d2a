"""CSA dual-scope decode in one pass on Hopper (sm_90) in one compute warpgroup, its copies issued by loader
warps (warp specialization): `dual_scope_decode(..., schedule=Schedule.FUSED_GLUON)` where a program holds at
most 256 value columns (the default there for batches 8-66 on the H200).

The attention of `dual_scope_decode` (its docstring has the math, shapes and index conventions) for bf16 q over
fp8 e4m3 keys with per-entry scales and bf16 values without scales. Programs (sequence b, head block of 64 x
value-column block of DV, entry split) walk the split's BKV-entry tiles; q arrives split into two e4m3 parts per
head with its score scale (`dual_scope_tiles.split_q_kernel`, the launch before this one; programmatic dependent
launch overlaps the two). The warps of a program split the work:

- the loader partition (LOAD_WARPS warps, LOAD_REGS registers a thread) issues the cp.async copies of each tile's
  key rows (all D columns, fp8) and key scales into the next free slot of a ring of KBUF, and of its value rows
  (the program's DV columns) into a ring of two; each loader thread arrives on the slot's `full` barrier once its
  copies land (cp.async.mbarrier.arrive.noinc), and waits on its `empty` barrier before refilling it. It holds
  the selected indices two tiles ahead in registers, so no copy waits for its indices' load;
- the compute partition (one warpgroup, num_warps = 4) copies q's parts in and stages a byte of validity per
  selected entry, then per tile waits for its key slot, runs the score MMAs (two fp8 warpgroup MMAs, q's parts
  in shared memory), frees the slot, runs the online softmax in base 2 (m, l and the [64, DV] float32
  accumulator in registers; an entry's validity and the -inf of a masked one fold into the scores' multiply-add),
  waits for the value slot, runs acc = alpha * acc + P V (P from registers) and frees that slot. With one split
  it normalizes, adds the sink and writes the output; with several it writes a partial and its log-sum-exp for
  `merge_partials_kernel` (`dual_scope_fused_gluon._finish`).

Why loader warps: when the compute warps issue the copies themselves (`dual_scope_fused_gluon` in one
warpgroup, the form this replaces), Nsight Compute's stall sampling at B=64 puts a third of the loop's time in
issuing them (310 instructions a warp and tile) while the score MMAs have already finished; here the compute
loop is the MMAs and the softmax, and what the copies alone take is measured apart
(bench/kernels/sparse_README.md).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, mbarrier, \
    warpgroup_mma, warpgroup_mma_wait

from zoe_kernels.csa.dual_scope_fused_gluon import _finish, _issue_keys, _issue_values
from zoe_kernels.csa.dual_scope_two_pass_gluon import _tile_sel


@gluon.jit
def _score_mma(q_hi_smem, q_lo_smem, k_buf, s_zero):
    """The score MMAs of one key tile, asynchronous: (q_hi + q_lo) K^T, two fp8 MMAs on the rows as copied."""
    k_t = k_buf.permute((1, 0))  # [D, BKV]: the keys' D contiguous (K-major)
    s = warpgroup_mma(q_hi_smem, k_t, s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(q_lo_smem, k_t, s, is_async=True)


@gluon.jit
def _loader(k_ring, ks_ring, v_ring, k_full, k_empty, v_full, v_empty, idx_row, win_k_base, comp_k_base,
            win_ks_base, comp_ks_base, win_v_base, comp_v_base, win_len, t0, t_end, win_tiles, KSEL, stride_wkn,
            stride_ckn, stride_wvn, stride_cvn, dv0, D: gl.constexpr, DV: gl.constexpr, BKV: gl.constexpr,
            KBUF: gl.constexpr, VBUF: gl.constexpr, LOAD_WARPS: gl.constexpr):
    """The loader partition: tile j's keys into key slot j % KBUF once it is free, then its values into value
    slot j % VBUF; the selected indices of tile j + 2 are loaded while tile j's copies are issued (held in
    registers two tiles ahead, so that no copy waits for its indices' load)."""
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [LOAD_WARPS, 1], [1, 0])
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [LOAD_WARPS, 1], [1, 0])
    c_copy: gl.constexpr = gl.BlockedLayout([1], [32], [LOAD_WARPS], [0])
    k_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, k_copy))
    k_cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_copy))
    v_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, v_copy))
    v_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, v_copy))
    c_rows = gl.arange(0, BKV, layout=c_copy)
    sel_k = _tile_sel(idx_row, t0, win_tiles, KSEL, k_rows, BKV)
    sel_c = _tile_sel(idx_row, t0, win_tiles, KSEL, c_rows, BKV)
    sel_v = _tile_sel(idx_row, t0, win_tiles, KSEL, v_rows, BKV)
    nxt_k = _tile_sel(idx_row, t0 + 1, win_tiles, KSEL, k_rows, BKV)
    nxt_c = _tile_sel(idx_row, t0 + 1, win_tiles, KSEL, c_rows, BKV)
    nxt_v = _tile_sel(idx_row, t0 + 1, win_tiles, KSEL, v_rows, BKV)
    for j in range(0, t_end - t0):
        t = t0 + j
        kslot = j % KBUF
        mbarrier.wait(k_empty.index(kslot), ((j // KBUF) & 1) ^ 1)  # a fresh barrier passes parity 1 at once
        _issue_keys(t, kslot, sel_k, sel_c, k_ring, ks_ring, t_end, win_tiles, win_len, k_rows, k_cols, c_rows,
                    win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn, stride_ckn, BKV)
        async_copy.mbarrier_arrive(k_full.index(kslot), increment_count=False)
        new_k = _tile_sel(idx_row, t + 2, win_tiles, KSEL, k_rows, BKV)
        new_c = _tile_sel(idx_row, t + 2, win_tiles, KSEL, c_rows, BKV)
        vslot = j % VBUF
        mbarrier.wait(v_empty.index(vslot), ((j // VBUF) & 1) ^ 1)
        _issue_values(t, vslot, sel_v, v_ring, t_end, win_tiles, win_len, v_rows, v_cols, win_v_base, comp_v_base,
                      stride_wvn, stride_cvn, BKV)
        async_copy.mbarrier_arrive(v_full.index(vslot), increment_count=False)
        sel_k, sel_c, sel_v = nxt_k, nxt_c, nxt_v
        nxt_k, nxt_c, nxt_v = new_k, new_c, _tile_sel(idx_row, t + 2, win_tiles, KSEL, v_rows, BKV)


@gluon.jit
def _tile_scores(q_smem, k_ring, ks_ring, ok_smem, k_full, j, t0, win_tiles, win_len, t_sel0, cols_s, s_zero,
                 KBUF: gl.constexpr, BKV: gl.constexpr, SEL_P2: gl.constexpr, col_s: gl.constexpr):
    """Tile j's score MMAs issued (asynchronous) once its key slot is full, its key scales and the bias of its
    entries (0 valid, -inf masked: the masked rows and scales were copied as zeros)."""
    t = t0 + j
    if t < win_tiles:
        bias = gl.where(t * BKV + cols_s < win_len, 0.0, float("-inf"))
    else:
        r = gl.minimum(t - t_sel0, SEL_P2 - 1)
        bias = gl.where(ok_smem.index(r).load(col_s) != 0, 0.0, float("-inf"))
    kslot = j % KBUF
    mbarrier.wait(k_full.index(kslot), (j // KBUF) & 1)
    fence_async_shared()  # the loader's cp.async writes, before the MMAs read them
    z = j >> 20  # 0, opaque: the q descriptors are computed here instead of held in registers
    s = _score_mma(q_smem.index(z), q_smem.index(z + 1), k_ring.index(kslot), s_zero)
    ks = ks_ring.index(kslot).load(col_s)
    return s, ks, bias


@gluon.jit
def _softmax_tile(s, ks, bias, row_scale, m_i, l_i, acc, vdt: gl.constexpr, mma_o: gl.constexpr, p_op: gl.constexpr):
    """The online softmax step of one tile in base 2 (row_scale > 0: see dual_scope_fused_gluon): P as the value
    MMA's register operand, the rows' new maxima and denominators, the accumulator rescaled."""
    s = s * ks[None, :] + bias[None, :]
    m_new = gl.maximum(m_i, row_scale * gl.max(s, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(s * row_scale[:, None] - m_safe[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
    return gl.convert_layout(p.to(vdt), p_op), m_new, l_i, acc


@gluon.jit
def _attend(q_smem, k_ring, ks_ring, v_ring, ok_smem, k_full, k_empty, v_full, v_empty, q8_ptr, qs_ptr, idx_row, b,
            bq, h0, H, win_len, t0, t_end, win_tiles, KSEL, stride_q8b, D: gl.constexpr, DV: gl.constexpr,
            BKV: gl.constexpr, KBUF: gl.constexpr, VBUF: gl.constexpr, SEL_P2: gl.constexpr):
    """The compute partition (one warpgroup): q in and the validity of the program's selected entries staged (a
    byte each), then the online softmax over the program's tiles as the loader fills the slots. Returns the
    [64, DV] float32 accumulator, the rows' maxima and denominators."""
    BH: gl.constexpr = 64
    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BKV, 32])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    q_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    col_s: gl.constexpr = gl.SliceLayout(0, mma_s)
    vdt: gl.constexpr = v_ring.dtype
    # split_q_kernel's writes are visible after this (programmatic dependent launch starts the program earlier, and
    # the loader's copies with it; the wait returns 0 so that the scale loads below depend on it)
    zero = gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                     pack=1)
    q_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, q_copy))
    q_rows = (q8_ptr + bq * stride_q8b + q_heads[:, None].to(gl.int64) * D
              + gl.arange(0, D, layout=gl.SliceLayout(0, q_copy))[None, :])
    async_copy.async_copy_global_to_shared(q_smem.index(0), q_rows, mask=(q_heads < H)[:, None])
    async_copy.async_copy_global_to_shared(q_smem.index(1), q_rows + H * D, mask=(q_heads < H)[:, None])
    async_copy.commit_group()
    r_heads_s = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_s))
    row_scale = gl.load(qs_ptr + b * H + r_heads_s + zero, mask=r_heads_s < H, other=1.0)
    t_sel0 = gl.maximum(t0, win_tiles)  # the program's first tile of selected entries: row 0 of ok_smem
    sel_lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    si = gl.arange(0, SEL_P2, layout=gl.SliceLayout(1, sel_lay))
    s_pos = (t_sel0 + si[:, None] - win_tiles) * BKV + gl.arange(0, BKV, layout=gl.SliceLayout(0, sel_lay))[None, :]
    sel_all = gl.load(idx_row + s_pos, mask=(s_pos < KSEL) & ((t_sel0 + si[:, None]) < t_end), other=-1)
    ok_smem._reinterpret(gl.int8, [SEL_P2, BKV], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(
        (sel_all >= 0).to(gl.int8))
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()

    cols_s = gl.arange(0, BKV, layout=col_s)
    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BH, DV], gl.float32, layout=mma_o)
    s_zero = gl.zeros([BH, BKV], gl.float32, layout=mma_s)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    for j in range(0, t_end - t0):
        s, ks, bias = _tile_scores(q_smem, k_ring, ks_ring, ok_smem, k_full, j, t0, win_tiles, win_len, t_sel0,
                                   cols_s, s_zero, KBUF, BKV, SEL_P2, col_s)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        gl.thread_barrier()  # every warp's MMAs and scale loads are done with the slot
        mbarrier.arrive(k_empty.index(j % KBUF))
        p_dot, m_i, l_i, acc = _softmax_tile(s, ks, bias, row_scale, m_i, l_i, acc, vdt, mma_o, p_op)
        vslot = j % VBUF
        mbarrier.wait(v_full.index(vslot), (j // VBUF) & 1)
        fence_async_shared()
        pv = warpgroup_mma(p_dot, v_ring.index(vslot), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(vslot))
    return acc, m_i, l_i


@gluon.jit
def fused_ws_kernel(
    q8_ptr, qs_ptr, win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr, win_ks_ptr,
    comp_ks_ptr, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, H, W, KSEL, T, stride_q8b, stride_wkb, stride_wkn,
    stride_wvb, stride_wvn, stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_ib, stride_wksb, stride_cksb,
    stride_ob, stride_oh,
    D: gl.constexpr, DV: gl.constexpr, BKV: gl.constexpr, TILES_PER_SPLIT: gl.constexpr, KBUF: gl.constexpr,
    SEL_P2: gl.constexpr, LOAD_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr, FINAL: gl.constexpr,
    HAS_SINK: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (b, head block x value-column block, split): one warpgroup computing (num_warps = 4) and LOAD_WARPS
    loader warps with LOAD_REGS registers a thread; KBUF key slots and two value slots (the loader runs up to
    KBUF - 1 tiles of keys and one of values ahead of the compute warpgroup); SEL_P2 rows of staged validity (a
    power of two at least the program's tiles of selected entries). Other arguments as `fused_kernel`'s."""
    gl.static_assert(num_warps == 4, "one compute warpgroup")
    gl.static_assert(DV <= 256, "the compute warpgroup's value columns: the MMA's N")
    BH: gl.constexpr = 64
    VBUF: gl.constexpr = 2
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    split = gl.program_id(2)
    t0 = split * TILES_PER_SPLIT
    t_end = gl.minimum(t0 + TILES_PER_SPLIT, T)
    bq = b.to(gl.int64)
    fp8: gl.constexpr = gl.float8e4nv
    vdt: gl.constexpr = win_v_ptr.dtype.element_ty
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    q_smem = gl.allocate_shared_memory(fp8, [2, BH, D], gl.NVMMASharedLayout.get_default_for([BH, D], fp8))
    k_ring = gl.allocate_shared_memory(fp8, [KBUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))
    v_ring = gl.allocate_shared_memory(vdt, [VBUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], vdt))
    ks_ring = gl.allocate_shared_memory(gl.float32, [KBUF, BKV], flat)
    ok_smem = gl.allocate_shared_memory(gl.int8, [SEL_P2, BKV], flat)  # rank 1: a row index drops the leading dim
    k_full = gl.allocate_shared_memory(gl.int64, [KBUF, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [KBUF, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [VBUF, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [VBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KBUF):
        mbarrier.init(k_full.index(i), count=32 * LOAD_WARPS)  # every loader thread's copies
        mbarrier.init(k_empty.index(i), count=1)
    for i in gl.static_range(VBUF):
        mbarrier.init(v_full.index(i), count=32 * LOAD_WARPS)
        mbarrier.init(v_empty.index(i), count=1)

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    idx_row = comp_idx_ptr + bq * stride_ib
    acc, m_i, l_i = gl.warp_specialize([
        (_attend, (q_smem, k_ring, ks_ring, v_ring, ok_smem, k_full, k_empty, v_full, v_empty, q8_ptr, qs_ptr, idx_row,
                   b, bq, h0, H, win_len, t0, t_end, win_tiles, KSEL, stride_q8b, D, DV, BKV, KBUF, VBUF, SEL_P2)),
        (_loader, (k_ring, ks_ring, v_ring, k_full, k_empty, v_full, v_empty, idx_row, win_k_ptr + bq * stride_wkb,
                   comp_k_ptr + bq * stride_ckb, win_ks_ptr + bq * stride_wksb, comp_ks_ptr + bq * stride_cksb,
                   win_v_ptr + bq * stride_wvb, comp_v_ptr + bq * stride_cvb, win_len, t0, t_end, win_tiles, KSEL,
                   stride_wkn, stride_ckn, stride_wvn, stride_cvn, dv0, D, DV, BKV, KBUF, VBUF, LOAD_WARPS)),
    ], [LOAD_WARPS], [LOAD_REGS])

    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_o))
    o_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, mma_o))
    _finish(acc, gl.convert_layout(m_i, gl.SliceLayout(1, mma_o)), gl.convert_layout(l_i, gl.SliceLayout(1, mma_o)),
            r_heads, o_cols, H, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, bq, split, gl.num_programs(2), stride_ob,
            stride_oh, dv0, D, FINAL, HAS_SINK, gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0]))
