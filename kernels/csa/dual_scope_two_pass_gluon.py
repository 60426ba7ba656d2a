"""The two-pass dual-scope decode's passes written in Gluon for Hopper (sm_90): the same math as
`dual_scope_two_pass`'s Triton kernels, with the loops written out by hand.

Why: the Triton passes spend 1,800 (scores) and 635 (values) instructions per warp and 64-entry tile, with
17 and 12 block barriers (`ncu` source counters on an H200): the gathered rows' addresses are
computed in layouts Triton picks, each tile's selected indices, scales and factors come out of preloaded
tables by cross-warp sums, and Triton's pipeliner copies an index load that feeds the next load's addresses
asynchronously, which made every tile wait for every copy in flight. Here each thread loads the indices of
exactly the rows it copies, one tile ahead, in the layout of its copies; the gathered rows land in
NVMMA-swizzled shared memory by cp.async through a ring of NUM_BUF buffers (NUM_BUF - 1 tiles in flight),
and warpgroup MMAs read them there. One block barrier per tile makes every thread's copies visible to them.
Both passes are faster than the Triton ones on the H200 at every batch timed (bench/kernels/sparse_README.md).
`_tile_row_ptrs` and the values
pass's softmax statistics are Gluon twins of `dual_scope_tiles.tile_rows` and of the Triton values pass's
(Triton's jit helpers take no layouts, so Gluon cannot call them); a change to one needs the other.

- `scores_kernel`: bf16 (or fp16) q over fp8 keys with per-entry scales, no value scales: q split into two
  e4m3 parts (dual_scope_tiles.split_q_fp8's split) in shared memory once, two fp8 MMAs per tile.
- `values_kernel`: 2-byte values of the probabilities' dtype, P_t and V_t copied into shared memory, one MMA
  per tile, acc += 2^(m_t - m) / denom * P_t V_t.
Programs, index conventions, scopes and the stored p, m_t, l_t are the Triton passes'.
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
def ring_landed(PENDING: gl.constexpr):
    """A ring's next tile is ready: this thread's copies of it landed (at most PENDING later commit groups still in
    flight), made visible to the warpgroup MMAs' async proxy, and every thread's (the barrier, which also orders
    the previous tile's reads of its slot before the copies the caller issues into it next)."""
    async_copy.wait_group(PENDING)
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _tile_sel(comp_idx_row, t, win_tiles, KSEL, rows, BKV: gl.constexpr):
    """The selected indices of tile t in the layout of `rows` (-1 for a window tile or past the selection)."""
    j = (t - win_tiles) * BKV + rows
    return gl.load(comp_idx_row + j, mask=(j >= 0) & (j < KSEL), other=-1)


@gluon.jit
def _issue_value_tile(t, buf, sel, v_smem, p_smem, p_ptr, bq, H, T, win_tiles, win_len, v_rows, v_cols, p_heads,
                      p_cols, win_base, comp_base, stride_wvn, stride_cvn, BKV: gl.constexpr):
    """The copies of tile t's value rows and probabilities into ring buffer `buf`, as one commit group."""
    row_ptrs, ok = _tile_row_ptrs(t, win_tiles, win_len, T, v_rows, sel, win_base, comp_base, stride_wvn,
                                  stride_cvn, BKV)
    async_copy.async_copy_global_to_shared(v_smem.index(buf), row_ptrs[:, None] + v_cols[None, :], mask=ok[:, None])
    p_off = ((bq * T + t) * H + p_heads[:, None]) * BKV + p_cols[None, :]
    async_copy.async_copy_global_to_shared(p_smem.index(buf), p_ptr + p_off, mask=(p_heads[:, None] < H) & (t < T))
    async_copy.commit_group()


@gluon.jit
def _issue_key_tile(t, buf, sel, k_smem, t_end, win_tiles, win_len, k_rows, k_cols, win_base, comp_base, stride_wkn,
                    stride_ckn, BKV: gl.constexpr):
    """The copies of tile t's key rows into ring buffer `buf`, as one commit group."""
    row_ptrs, ok = _tile_row_ptrs(t, win_tiles, win_len, t_end, k_rows, sel, win_base, comp_base, stride_wkn,
                                  stride_ckn, BKV)
    async_copy.async_copy_global_to_shared(k_smem.index(buf), row_ptrs[:, None] + k_cols[None, :], mask=ok[:, None])
    async_copy.commit_group()


@gluon.jit
def values_kernel(
    win_v_ptr, win_len_ptr, comp_v_ptr, comp_idx_ptr, p_ptr, m_ptr, l_ptr, sink_ptr, out_ptr, H, W, KSEL, T,
    stride_wvb, stride_wvn, stride_cvb, stride_cvn, stride_ib, stride_ob, stride_oh,
    D: gl.constexpr, DV: gl.constexpr, BH: gl.constexpr, BKV: gl.constexpr, T_P2: gl.constexpr,
    HAS_SINK: gl.constexpr, NUM_BUF: gl.constexpr, num_warps: gl.constexpr,
):
    gl.static_assert(num_warps == 4 or num_warps == 8, "one or two warpgroups (two split the value columns)")
    gl.static_assert(BH == 64, "64 heads per program: the warpgroup MMA's M")
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    bq = b.to(gl.int64)

    # layouts: the MMA's accumulator, the V copy (16 bytes a thread along a row), the P copy, the statistics
    warps_n: gl.constexpr = num_warps // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, warps_n],
                                                  instr_shape=[16, DV // warps_n, 16])
    v_tpr: gl.constexpr = min(DV // 8, 32)  # threads along a V row (8 bf16 = 16 bytes each)
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [32 // v_tpr, v_tpr], [num_warps, 1], [1, 0])
    p_tpr: gl.constexpr = BKV // 8
    p_copy: gl.constexpr = gl.BlockedLayout([1, 8], [32 // p_tpr, p_tpr], [num_warps, 1], [1, 0])
    stat: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
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
        _issue_value_tile(i, i, _tile_sel(idx_row, i, win_tiles, KSEL, v_rows, BKV), v_smem, p_smem, p_ptr, bq,
                          H, T, win_tiles, win_len, v_rows, v_cols, p_heads, p_cols, win_base, comp_base,
                          stride_wvn, stride_cvn, BKV)
    sel_next = _tile_sel(idx_row, NUM_BUF - 1, win_tiles, KSEL, v_rows, BKV)
    m_next = gl.load(m_ptr + (bq * T + 0) * H + r_heads, mask=r_heads < H, other=float("-inf"))

    acc = gl.zeros([BH, DV], gl.float32, layout=mma)
    zero = gl.zeros([BH, DV], gl.float32, layout=mma)
    for t in range(0, T):
        ring_landed(NUM_BUF - 2)  # tile t
        # issue tile t + NUM_BUF - 1 into the buffer tile t - 1 used; fetch the indices of the tile after it
        t_in = t + NUM_BUF - 1
        _issue_value_tile(t_in, t_in % NUM_BUF, sel_next, v_smem, p_smem, p_ptr, bq, H, T, win_tiles, win_len,
                          v_rows, v_cols, p_heads, p_cols, win_base, comp_base, stride_wvn, stride_cvn, BKV)
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


@gluon.jit
def scores_kernel(
    q_ptr, win_k_ptr, win_len_ptr, comp_k_ptr, comp_idx_ptr, win_ks_ptr, comp_ks_ptr, p_ptr, m_ptr, l_ptr,
    H, W, KSEL, T, qk_scale_log2,
    stride_qb, stride_qh, stride_wkb, stride_wkn, stride_ckb, stride_ckn, stride_ib, stride_wksb, stride_cksb,
    D: gl.constexpr, BH: gl.constexpr, BKV: gl.constexpr, TILES_PER_PROG: gl.constexpr, NUM_BUF: gl.constexpr,
    num_warps: gl.constexpr,
):
    """The scores pass for bf16 q over fp8 keys with per-entry scales (`dual_scope_two_pass._scores_kernel`
    with QK_FP8 and no value scales): q split into two e4m3 parts in shared memory once, the gathered fp8 key
    rows copied into a ring of NUM_BUF buffers by cp.async (each thread loading the indices of its own rows,
    one tile ahead), two fp8 warpgroup MMAs per tile on the rows as copied."""
    gl.static_assert(num_warps == 4 or num_warps == 8, "one or two warpgroups (two split the tile's entries)")
    gl.static_assert(BH == 64, "64 heads per program: the warpgroup MMA's M")
    b = gl.program_id(0)
    h0 = gl.program_id(1) * BH
    t0 = gl.program_id(2) * TILES_PER_PROG
    n_tiles = gl.minimum(T - t0, TILES_PER_PROG)
    bq = b.to(gl.int64)

    warps_n: gl.constexpr = num_warps // 4
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, warps_n],
                                                  instr_shape=[16, BKV // warps_n, 32])
    QC: gl.constexpr = 128  # q columns per step of the split (keeps [BH, QC] float32 in registers)
    q_load: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [num_warps, 1], [1, 0])
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    fp8: gl.constexpr = gl.float8e4nv
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BH, D], fp8)
    q_hi_smem = gl.allocate_shared_memory(fp8, [BH, D], q_layout)
    q_lo_smem = gl.allocate_shared_memory(fp8, [BH, D], q_layout)
    k_smem = gl.allocate_shared_memory(fp8, [NUM_BUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))

    # q = (hi + lo) / c per head (dual_scope_tiles.split_q_fp8's split), in shared memory for the MMAs: the
    # heads' largest |q| first, then the split QC columns at a time
    q_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, q_load))
    q_rows = q_ptr + bq * stride_qb + q_heads[:, None] * stride_qh
    q_ok = (q_heads < H)[:, None]
    amax = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, q_load))
    for ci in gl.static_range(D // QC):
        q_cols = ci * QC + gl.arange(0, QC, layout=gl.SliceLayout(0, q_load))
        qf = gl.load(q_rows + q_cols[None, :], mask=q_ok, other=0.0).to(gl.float32)
        amax = gl.maximum(amax, gl.max(gl.abs(qf), axis=1))
    c = gl.exp2(gl.minimum(gl.floor(gl.log2(448.0 / gl.where(amax > 0, amax, 448.0))), 126.0))
    for ci in gl.static_range(D // QC):
        q_cols = ci * QC + gl.arange(0, QC, layout=gl.SliceLayout(0, q_load))
        qs = gl.load(q_rows + q_cols[None, :], mask=q_ok, other=0.0).to(gl.float32) * c[:, None]
        hi = qs.to(fp8)
        q_hi_smem.slice(ci * QC, QC, dim=1).store(hi)
        q_lo_smem.slice(ci * QC, QC, dim=1).store((qs - hi.to(gl.float32)).to(fp8))
    row_scale = gl.convert_layout(qk_scale_log2 / c, gl.SliceLayout(1, mma))
    fence_async_shared()
    gl.thread_barrier()

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    k_rows = gl.arange(0, BKV, layout=gl.SliceLayout(1, k_copy))
    k_cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_copy))
    s_cols = gl.arange(0, BKV, layout=gl.SliceLayout(0, mma))
    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma))
    win_base = win_k_ptr + bq * stride_wkb
    comp_base = comp_k_ptr + bq * stride_ckb
    idx_row = comp_idx_ptr + bq * stride_ib
    t_end = t0 + n_tiles

    for i in gl.static_range(NUM_BUF - 1):
        _issue_key_tile(t0 + i, i, _tile_sel(idx_row, t0 + i, win_tiles, KSEL, k_rows, BKV), k_smem, t_end,
                        win_tiles, win_len, k_rows, k_cols, win_base, comp_base, stride_wkn, stride_ckn, BKV)
    sel_next = _tile_sel(idx_row, t0 + NUM_BUF - 1, win_tiles, KSEL, k_rows, BKV)
    # the key scales and valid mask of the next tile to score, in the layout of the score columns
    c_sel = _tile_sel(idx_row, t0, win_tiles, KSEL, s_cols, BKV)
    ks_ptrs, c_ok = _tile_row_ptrs(t0, win_tiles, win_len, t_end, s_cols, c_sel, win_ks_ptr + bq * stride_wksb,
                                   comp_ks_ptr + bq * stride_cksb, 1, 1, BKV)
    ks_next = gl.load(ks_ptrs, mask=c_ok, other=0.0)
    ok_next = c_ok

    zero = gl.zeros([BH, BKV], gl.float32, layout=mma)
    for j in range(0, n_tiles):
        t = t0 + j
        ring_landed(NUM_BUF - 2)  # tile t
        t_in = t + NUM_BUF - 1
        _issue_key_tile(t_in, (j + NUM_BUF - 1) % NUM_BUF, sel_next, k_smem, t_end, win_tiles, win_len, k_rows,
                        k_cols, win_base, comp_base, stride_wkn, stride_ckn, BKV)
        sel_next = _tile_sel(idx_row, t_in + 1, win_tiles, KSEL, k_rows, BKV)
        ks = ks_next
        s_ok = ok_next
        c_sel = _tile_sel(idx_row, t + 1, win_tiles, KSEL, s_cols, BKV)
        ks_ptrs, ok_next = _tile_row_ptrs(t + 1, win_tiles, win_len, t_end, s_cols, c_sel,
                                          win_ks_ptr + bq * stride_wksb, comp_ks_ptr + bq * stride_cksb, 1, 1, BKV)
        ks_next = gl.load(ks_ptrs, mask=ok_next, other=0.0)

        k_t = k_smem.index(j % NUM_BUF).permute((1, 0))  # [D, BKV]: the keys' D contiguous (K-major)
        s = warpgroup_mma(q_hi_smem, k_t, zero, use_acc=False, is_async=True)
        s = warpgroup_mma(q_lo_smem, k_t, s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        s = s * row_scale[:, None] * ks[None, :]
        s = gl.where(s_ok[None, :], s, float("-inf"))
        m_t = gl.max(s, axis=1)
        p = gl.exp2(s - gl.where(m_t == float("-inf"), 0.0, m_t)[:, None])
        l_t = gl.sum(p, axis=1)
        row = (bq * T + t) * H + r_heads
        gl.store(p_ptr + row[:, None] * BKV + s_cols[None, :], p.to(p_ptr.dtype.element_ty),
                 mask=(r_heads < H)[:, None])
        gl.store(m_ptr + row, m_t, mask=r_heads < H)
        gl.store(l_ptr + row, l_t, mask=r_heads < H)
    async_copy.wait_group(0)
