"""CSA dual-scope decode in one pass, written in Gluon for Hopper (sm_90), in two warpgroups over 512 value
columns: `dual_scope_decode(..., schedule=Schedule.FUSED_GLUON)` where a program holds all of D = 512's value
columns (the default there from batch 67 on the H200; `dual_scope_fused_ws_gluon` is the one-warpgroup form).

The same attention as `dual_scope_decode` (its docstring has the math, shapes and index conventions) for bf16
q over fp8 e4m3 keys with per-entry scales and bf16 values without scales (the DeepSeek-V4 cache), with no
intermediate in global memory: programs (sequence b, head block of 64, entry split), two warpgroups of 256 value
columns each, run an online softmax over tiles of BKV entries (32), split each tile's scores between the
warpgroups by entries and hand its probabilities to both through shared memory, so a tile's scores are computed
once per sequence:

- q arrives split into two e4m3 parts per head with its score scale (`dual_scope_tiles.split_q_kernel`, a small
  launch before this one, once per sequence; programmatic dependent launch overlaps the two);
- the program's selected indices are loaded first and staged in shared memory; the gathered key rows (all D
  columns, fp8) and key scales land by cp.async in a ring of KBUF slots, KBUF - 1 tiles ahead, and the value
  rows in a ring of two, one tile ahead, within the H200's 227 KiB of shared memory at D=512
  (`dual_scope_decode._fused_shape_ok` checks the target's);
- S = q K^T as four fp8 warpgroup MMAs (q's two parts in shared memory, over D's halves, whose shorter
  accumulations halve the error); an entry's validity comes from the staged
  indices (window positions below win_len, selected indices >= 0), and the per-entry scale and the -inf of a
  masked entry fold into one multiply-add per score, the per-head scale into the exponent's multiply-add;
- m, l and the [64, 512] float32 accumulator stay in the warpgroups' registers; P goes to the value MMAs from
  registers after the hand-over, acc = alpha * acc + P V.

The copies of the next tiles are issued right after the score MMAs, and the loop's first wait is for tile 0's
keys and q alone (each prologue copy is its own commit group), so the first MMAs start before the prologue's
burst lands. The q descriptors are computed in the loop from an opaque zero (held in registers they would take
a quarter of the loop's instructions). The score MMAs stay in the tile they belong to (ptxas serializes every
warpgroup MMA once two accumulators are in flight across the loop); what each of these choices was measured
against is in bench/kernels/sparse_README.md. With one split the program normalizes, adds
the sink and writes the output; with several it writes a normalized partial with its log-sum-exp and
`merge_partials_kernel` merges them. `_tile_sel` and `ring_landed` are `dual_scope_two_pass_gluon`'s;
`_rows_of`, `_issue_keys`, `_issue_values` and `_finish` serve the one-warpgroup form too.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, warpgroup_mma, warpgroup_mma_wait

from zoe_kernels.csa.dual_scope_two_pass_gluon import _tile_sel, ring_landed


@gluon.jit
def _rows_of(t, win_tiles, win_len, t_end, rows, sel, win_base, comp_base, stride_wn, stride_cn, BKV: gl.constexpr):
    """Row pointers and valid mask of tile t: a window tile's positions below win_len, else the selected entries
    `sel` (-1: none); none at or past t_end. `dual_scope_two_pass_gluon._tile_row_ptrs` in branch form: a tile is
    all window or all selection, so the branch is uniform and each thread computes one side's pointers, not both
    and a select (fewer instructions a tile). A masked copy reads nothing, so a masked
    row's pointer is left as it is."""
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
def _score_chains(q_hi_smem, q_lo_smem, k_buf, s_zero, D: gl.constexpr):
    """The score MMAs of one key tile as four accumulators (q's two parts x D's two halves), asynchronous, for the
    caller to add: each accumulates 256 products instead of 1,024, which halves the error of the fp8 MMAs'
    accumulation (the same time as one accumulator on the H200; bench/kernels/sparse_README.md)."""
    k_t = k_buf.permute((1, 0))
    HALF: gl.constexpr = D // 2
    k_a = k_t.slice(0, HALF, dim=0)
    k_b = k_t.slice(HALF, HALF, dim=0)
    s0 = warpgroup_mma(q_hi_smem.slice(0, HALF, dim=1), k_a, s_zero, use_acc=False, is_async=True)
    s1 = warpgroup_mma(q_hi_smem.slice(HALF, HALF, dim=1), k_b, s_zero, use_acc=False, is_async=True)
    s2 = warpgroup_mma(q_lo_smem.slice(0, HALF, dim=1), k_a, s_zero, use_acc=False, is_async=True)
    s3 = warpgroup_mma(q_lo_smem.slice(HALF, HALF, dim=1), k_b, s_zero, use_acc=False, is_async=True)
    return s0, s1, s2, s3


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
def fused_kernel(
    q8_ptr, qs_ptr, win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr, win_ks_ptr,
    comp_ks_ptr, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, H, W, KSEL, T, stride_q8b, stride_wkb, stride_wkn,
    stride_wvb, stride_wvn, stride_ckb, stride_ckn, stride_cvb, stride_cvn, stride_ib, stride_wksb, stride_cksb,
    stride_ob, stride_oh,
    D: gl.constexpr, DV: gl.constexpr, BKV: gl.constexpr, TILES_PER_SPLIT: gl.constexpr, KBUF: gl.constexpr,
    SEL_P2: gl.constexpr, FINAL: gl.constexpr, HAS_SINK: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (b, head block x value-column block, split), two warpgroups (num_warps = 8): see the module
    docstring. KBUF key slots (keys KBUF - 1 tiles ahead), two value slots; SEL_P2 rows of staged indices (a power
    of two at least the program's tiles of selected entries). part_out: [B, splits, H, D] float32, part_lse: [B,
    splits, H] (log2 units), written only without FINAL."""
    WG: gl.constexpr = num_warps // 4  # warpgroups: each holds DV / WG value columns and BKV / WG of a tile's scores
    gl.static_assert(num_warps == 8, "two warpgroups (dual_scope_fused_ws_gluon is the one-warpgroup form)")
    gl.static_assert(DV // WG <= 256, "a warpgroup's value columns: the MMA's N")
    gl.static_assert(KBUF == 2 or KBUF == 3, "keys one or two tiles ahead (the commit groups' count below)")
    BH: gl.constexpr = 64  # heads per program: the warpgroup MMA's M
    VBUF: gl.constexpr = 2
    b = gl.program_id(0)
    n_vblk: gl.constexpr = D // DV
    h0 = (gl.program_id(1) // n_vblk) * BH
    dv0 = (gl.program_id(1) % n_vblk) * DV
    split = gl.program_id(2)
    t0 = split * TILES_PER_SPLIT
    t_end = gl.minimum(t0 + TILES_PER_SPLIT, T)
    n_tiles = t_end - t0
    bq = b.to(gl.int64)

    mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                    instr_shape=[16, BKV // WG, 32])
    mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WG],
                                                    instr_shape=[16, DV // WG, 16])
    k_copy: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    v_copy: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    c_copy: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    col_s: gl.constexpr = gl.SliceLayout(0, mma_s)
    fp8: gl.constexpr = gl.float8e4nv
    vdt: gl.constexpr = win_v_ptr.dtype.element_ty
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # rank 1: the ring index drops the leading dim
    q_smem = gl.allocate_shared_memory(fp8, [2, BH, D], gl.NVMMASharedLayout.get_default_for([BH, D], fp8))
    k_ring = gl.allocate_shared_memory(fp8, [KBUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))
    v_ring = gl.allocate_shared_memory(vdt, [VBUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], vdt))
    ks_ring = gl.allocate_shared_memory(gl.float32, [KBUF, BKV], flat)
    idx_smem = gl.allocate_shared_memory(gl.int32, [SEL_P2, BKV], flat)

    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    win_tiles = gl.cdiv(W, BKV)
    t_sel0 = gl.maximum(t0, win_tiles)  # the program's first tile of selected entries: row 0 of idx_smem
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

    # prologue: the selected indices on their way, then one commit group each for the keys of tile 0; q (once
    # split_q_kernel's writes are visible: programmatic dependent launch lets this program start before that launch
    # ends); the values of tile 0; the keys of tile 1 (three key slots). The loop's first wait is for the first two
    # alone, so its first score MMAs start before the rest of the prologue's copies land; its barrier also makes
    # the staged indices visible.
    sel_lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    si = gl.arange(0, SEL_P2, layout=gl.SliceLayout(1, sel_lay))
    s_pos = (t_sel0 + si[:, None] - win_tiles) * BKV + gl.arange(0, BKV, layout=gl.SliceLayout(0, sel_lay))[None, :]
    sel_all = gl.load(idx_row + s_pos, mask=(s_pos < KSEL) & ((t_sel0 + si[:, None]) < t_end), other=-1)
    _issue_keys(t0, 0, _tile_sel(idx_row, t0, win_tiles, KSEL, k_rows, BKV),
                _tile_sel(idx_row, t0, win_tiles, KSEL, c_rows, BKV), k_ring, ks_ring, t_end, win_tiles, win_len,
                k_rows, k_cols, c_rows, win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn, stride_ckn, BKV)
    async_copy.commit_group()
    # the wait returns 0 so that the scale loads below depend on it
    zero = gl.inline_asm_elementwise("griddepcontrol.wait; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                     pack=1)
    q_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, k_copy))
    q_rows = q8_ptr + bq * stride_q8b + q_heads[:, None].to(gl.int64) * D + k_cols[None, :]
    async_copy.async_copy_global_to_shared(q_smem.index(0), q_rows, mask=(q_heads < H)[:, None])
    async_copy.async_copy_global_to_shared(q_smem.index(1), q_rows + H * D, mask=(q_heads < H)[:, None])
    async_copy.commit_group()
    _issue_values(t0, 0, _tile_sel(idx_row, t0, win_tiles, KSEL, v_rows, BKV), v_ring, t_end, win_tiles, win_len,
                  v_rows, v_cols, win_v_base, comp_v_base, stride_wvn, stride_cvn, BKV)
    async_copy.commit_group()
    if KBUF == 3:
        t1 = t0 + 1
        _issue_keys(t1, 1, _tile_sel(idx_row, t1, win_tiles, KSEL, k_rows, BKV),
                    _tile_sel(idx_row, t1, win_tiles, KSEL, c_rows, BKV), k_ring, ks_ring, t_end, win_tiles, win_len,
                    k_rows, k_cols, c_rows, win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn,
                    stride_ckn, BKV)
        async_copy.commit_group()
    r_heads_s = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_s))
    row_scale = gl.load(qs_ptr + b * H + r_heads_s + zero, mask=r_heads_s < H, other=1.0)
    idx_smem._reinterpret(gl.int32, [SEL_P2, BKV], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])).store(sel_all)

    cols_s = gl.arange(0, BKV, layout=col_s)
    m_i = gl.full([BH], float("-inf"), gl.float32, layout=gl.SliceLayout(1, mma_s))
    l_i = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, mma_s))
    acc = gl.zeros([BH, DV], gl.float32, layout=mma_o)
    s_zero = gl.zeros([BH, BKV], gl.float32, layout=mma_s)
    p_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
    for j in range(0, n_tiles):
        # commit groups per tile j: [values of j + 1], then [keys of j + KBUF - 1]; the keys of tile j (and q for
        # j = 0) were in the group 2 (KBUF - 2) groups back (the prologue's groups keep that count), its values in
        # the group 3 back once this tile's two are issued
        t = t0 + j
        ring_landed(2 * (KBUF - 2))  # keys and scales of tile j; the barrier also frees tile j - 1's slots
        z = j >> 20  # 0, opaque: the q descriptors are computed here instead of held in registers
        s0, s1, s2, s3 = _score_chains(q_smem.index(z), q_smem.index(z + 1), k_ring.index(j % KBUF), s_zero, D)
        # while the score MMAs run: values of tile j + 1 and keys of tile j + KBUF - 1 into tile j - 1's slots
        tv = t + 1
        _issue_values(tv, (j + 1) % VBUF, _sel_row(idx_smem, tv, t_sel0, SEL_P2, gl.SliceLayout(1, v_copy)), v_ring,
                      t_end, win_tiles, win_len, v_rows, v_cols, win_v_base, comp_v_base, stride_wvn, stride_cvn, BKV)
        async_copy.commit_group()
        tk = t + KBUF - 1
        _issue_keys(tk, (j + KBUF - 1) % KBUF, _sel_row(idx_smem, tk, t_sel0, SEL_P2, gl.SliceLayout(1, k_copy)),
                    _sel_row(idx_smem, tk, t_sel0, SEL_P2, c_copy), k_ring, ks_ring, t_end, win_tiles, win_len, k_rows,
                    k_cols, c_rows, win_k_base, comp_k_base, win_ks_base, comp_ks_base, stride_wkn, stride_ckn, BKV)
        async_copy.commit_group()
        # 0 for a valid entry, -inf for a masked one (its key row and scale were copied as zeros)
        if t < win_tiles:
            bias = gl.where(t * BKV + cols_s < win_len, 0.0, float("-inf"))
        else:
            bias = gl.where(_sel_row(idx_smem, t, t_sel0, SEL_P2, col_s) >= 0, 0.0, float("-inf"))
        ks = ks_ring.index(j % KBUF).load(col_s)
        s0, s1, s2, s3 = warpgroup_mma_wait(num_outstanding=0, deps=(s0, s1, s2, s3))
        s = (s0 + s1) + (s2 + s3)
        # the online softmax in base 2; row_scale > 0, so the maximum of the scaled scores is row_scale times
        # the maximum of s * ks (launch_config routes sm_scale <= 0 elsewhere)
        s = s * ks[None, :] + bias[None, :]
        m_new = gl.maximum(m_i, row_scale * gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_safe)
        p = gl.exp2(s * row_scale[:, None] - m_safe[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_o))[:, None]
        p_dot = gl.convert_layout(p.to(vdt), p_op)
        if KBUF > 2:
            ring_landed(3)  # values of tile j (with two key slots they landed with its keys)
        pv = warpgroup_mma(p_dot, v_ring.index(j % VBUF), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv, ))
    async_copy.wait_group(0)

    r_heads = h0 + gl.arange(0, BH, layout=gl.SliceLayout(1, mma_o))
    o_cols = dv0 + gl.arange(0, DV, layout=gl.SliceLayout(0, mma_o))
    _finish(acc, gl.convert_layout(m_i, gl.SliceLayout(1, mma_o)), gl.convert_layout(l_i, gl.SliceLayout(1, mma_o)),
            r_heads, o_cols, H, sink_ptr, out_ptr, part_out_ptr, part_lse_ptr, bq, split, gl.num_programs(2), stride_ob,
            stride_oh, dv0, D, FINAL, HAS_SINK, gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0]))
