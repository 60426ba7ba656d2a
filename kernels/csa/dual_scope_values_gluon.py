"""The two-pass dual-scope decode's values pass written in Gluon for Hopper (sm_90): the same math as
`dual_scope_two_pass._values_kernel`, with the loop written out by hand.

Why: the Triton values pass spends about 635 instructions per warp and 64-entry tile and 12 block barriers
(H200 run 19-decode, `ncu` source counters): the gathered rows' addresses are computed in a layout Triton
picks, each tile's selected indices and factor come out of preloaded tables by cross-warp sums, and its
pipeliner copies an index load that feeds the next load's addresses asynchronously, which made every tile
wait for every copy in flight. Here each thread loads the indices of exactly the rows it copies, one tile
ahead, straight into the layout of its copies; the rows of V and P land in NVMMA-swizzled shared memory by
cp.async through a ring of NUM_BUF buffers (NUM_BUF - 1 tiles in flight), and one warpgroup MMA per tile
reads them there. One block barrier per tile makes every thread's copies visible to the MMA.

Program (sequence b, head block x value-column block), 4 warps (one warpgroup): BH=64 heads, DV value
columns, BKV-entry tiles. Index conventions, scopes and the stored p, m_t, l_t are the Triton pass's.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, warpgroup_mma, \
    warpgroup_mma_wait


@gluon.jit
def _tile_row_ptrs(t, win_tiles, win_len, T, rows, sel, win_base, comp_base, stride_wn, stride_cn,
                   BKV: gl.constexpr):
    """Row pointers and valid mask of tile t (a window tile below win_tiles, else the selected entries `sel`;
    none at or past T), in the layout of `rows`."""
    pos = t * BKV + rows
    is_win = t < win_tiles
    ok = gl.where(is_win, pos < win_len, sel >= 0) & (t < T)
    row_ptrs = gl.where(is_win, win_base + pos.to(gl.int64) * stride_wn,
                        comp_base + gl.maximum(sel, 0).to(gl.int64) * stride_cn)
    return row_ptrs, ok


@gluon.jit
def _tile_sel(comp_idx_row, t, win_tiles, KSEL, rows, BKV: gl.constexpr):
    """The selected indices of tile t in the layout of `rows` (-1 for a window tile or past the selection)."""
    j = (t - win_tiles) * BKV + rows
    return gl.load(comp_idx_row + j, mask=(j >= 0) & (j < KSEL), other=-1)


@gluon.jit
def values_kernel(
    win_v_ptr, win_len_ptr, comp_v_ptr, comp_idx_ptr, p_ptr, m_ptr, l_ptr, sink_ptr, out_ptr, H, W, KSEL, T,
    stride_wvb, stride_wvn, stride_cvb, stride_cvn, stride_ib, stride_ob, stride_oh,
    D: gl.constexpr, DV: gl.constexpr, BH: gl.constexpr, BKV: gl.constexpr, T_P2: gl.constexpr,
    HAS_SINK: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4, "one warpgroup")
    gl.static_assert(BH == 64, "64 heads per program: the warpgroup MMA's M")
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    bq = b.to(gl.int64)

    # layouts: the MMA's accumulator, the V copy (16 bytes a thread along a row), the P copy, the statistics
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV, 16])
    v_tpr: gl.constexpr = DV // 8  # threads along a V row (8 bf16 = 16 bytes each)
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [32 // v_tpr, v_tpr], [4, 1], [1, 0])
    p_tpr: gl.constexpr = BKV // 8
    p_copy: gl.constexpr = gl.BlockedLayout([1, 8], [32 // p_tpr, p_tpr], [4, 1], [1, 0])
    stat: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    dtype: gl.constexpr = win_v_ptr.dtype.element_ty
    v_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], dtype))
    p_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BH, BKV], gl.NVMMASharedLayout.get_default_for([BH, BKV], dtype))

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    v_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, v_copy))
    v_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, v_copy))
    p_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, p_copy))
    p_cols = gl.arange(0, BKV, layout=gl.SliceLayout(0, p_copy))
    win_base = win_v_ptr + bq * stride_wvb
    comp_base = comp_v_ptr + bq * stride_cvb
    idx_row = comp_idx_ptr + bq * stride_ib

    # the softmax statistics over all tiles: max m, denominator sum_t l_t 2^(m_t - m) (+ the sink's term)
    s_tiles = gl.arange(0, T_P2, layout=gl.SliceLayout(1, stat))
    s_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(0, stat))
    s_off = (bq * T + s_tiles[:, None]) * H + s_heads[None, :]
    s_ok = (s_tiles[:, None] < T) & (s_heads[None, :] < H)
    m_all = gl.load(m_ptr + s_off, mask=s_ok, other=float("-inf"))
    l_all = gl.load(l_ptr + s_off, mask=s_ok, other=0.0)
    top = gl.max(m_all, axis=0)
    if HAS_SINK:
        sink = gl.load(sink_ptr + s_heads, mask=s_heads < H, other=float("-inf")) * 1.4426950408889634
        top = gl.maximum(top, sink)
    top = gl.where(top == float("-inf"), 0.0, top)
    denom = gl.sum(l_all * gl.exp2(m_all - top[None, :]), axis=0)
    if HAS_SINK:
        denom += gl.exp2(sink - top)
    inv = gl.where(denom > 0, 1.0 / gl.where(denom > 0, denom, 1.0), 0.0)
    top_r = gl.convert_layout(top, gl.SliceLayout(1, mma))
    inv_r = gl.convert_layout(inv, gl.SliceLayout(1, mma))
    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma))

    # prologue: tiles 0 .. NUM_BUF - 2 in flight, the indices of tile NUM_BUF - 1 in registers
    for i in gl.static_range(NUM_BUF - 1):
        sel = _tile_sel(idx_row, i, win_tiles, KSEL, v_rows, BKV)
        row_ptrs, ok = _tile_row_ptrs(i, win_tiles, win_len, T, v_rows, sel, win_base, comp_base, stride_wvn,
                                      stride_cvn, BKV)
        async_copy.async_copy_global_to_shared(v_smem.index(i), row_ptrs[:, None] + v_cols[None, :],
                                               mask=ok[:, None])
        p_off = ((bq * T + i) * H + p_heads[:, None]) * BKV + p_cols[None, :]
        async_copy.async_copy_global_to_shared(p_smem.index(i), p_ptr + p_off,
                                               mask=(p_heads[:, None] < H) & (i < T))
        async_copy.commit_group()
    sel_next = _tile_sel(idx_row, NUM_BUF - 1, win_tiles, KSEL, v_rows, BKV)
    m_next = gl.load(m_ptr + (bq * T + 0) * H + r_heads, mask=r_heads < H, other=float("-inf"))

    acc = gl.zeros([BH, DV], gl.float32, layout=mma)
    zero = gl.zeros([BH, DV], gl.float32, layout=mma)
    for t in range(0, T):
        # tile t's copies landed (each thread's own), visible to the MMA's async proxy, and every thread's
        # (the barrier; it also orders the previous tile's MMA reads before the copies into its buffer)
        async_copy.wait_group(NUM_BUF - 2)
        fence_async_shared()
        gl.thread_barrier()
        # issue tile t + NUM_BUF - 1 into the buffer tile t - 1 used; fetch the indices of the tile after it
        t_in = t + NUM_BUF - 1
        buf_in = t_in % NUM_BUF
        row_ptrs, ok = _tile_row_ptrs(t_in, win_tiles, win_len, T, v_rows, sel_next, win_base, comp_base,
                                      stride_wvn, stride_cvn, BKV)
        async_copy.async_copy_global_to_shared(v_smem.index(buf_in), row_ptrs[:, None] + v_cols[None, :],
                                               mask=ok[:, None])
        p_off = ((bq * T + t_in) * H + p_heads[:, None]) * BKV + p_cols[None, :]
        async_copy.async_copy_global_to_shared(p_smem.index(buf_in), p_ptr + p_off,
                                               mask=(p_heads[:, None] < H) & (t_in < T))
        async_copy.commit_group()
        sel_next = _tile_sel(idx_row, t_in + 1, win_tiles, KSEL, v_rows, BKV)
        # tile t: P_t V_t, scaled per head by 2^(m_t - m) / denom
        m_t = m_next
        m_next = gl.load(m_ptr + (bq * T + t + 1) * H + r_heads, mask=(r_heads < H) & (t + 1 < T),
                         other=float("-inf"))
        buf = t % NUM_BUF
        pv = warpgroup_mma(p_smem.index(buf), v_smem.index(buf), zero, use_acc=False, is_async=True)
        pv = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
        acc += (gl.exp2(m_t - top_r) * inv_r)[:, None] * pv
    async_copy.wait_group(0)

    o_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, mma))
    o_ptrs = out_ptr + bq * stride_ob + r_heads[:, None] * stride_oh + o_cols[None, :]
    gl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(r_heads < H)[:, None])
