"""Where a dual-scope decode call's time goes on one GPU, beside the bytes it has to move (sparse_bench.py's
`limits` section; bench/kernels/sparse_README.md reads its rows).

- `gather_ceiling`: the bandwidth of the call's own access pattern, by a kernel that reads exactly the rows the
  call reads (window rows, then the selected rows by index: fp8 keys, their scales, bf16 values) with as many
  programs as the GPU takes and no arithmetic beyond a sum; and a plain streaming read of 1 GiB;
- `launch_split`: each launch of the default call timed apart (torch.profiler), the one-pass kernel alone (the
  q split skipped: q's parts left from the previous call, a timing diagnostic only, its output not used) and
  the q split alone, back to back;
- `tile_sweep`: the default call at one split per sequence over 3 to 14 tiles of 64 entries (64 to 768 selected
  entries) at several batches; a line through time against tiles gives the cost outside the entry loop
  (intercept) and per tile (slope), and the slope at a small batch, where HBM is far from busy, is one
  program's serial chain per tile;
- `loader_alone`: the one-pass kernel's loader warps (`dual_scope_fused_ws_gluon._loader`) filling the same
  rings at the same grid, with compute warps that only wait for each slot and free it: how long the copies
  alone take with the kernel's buffering, the time the compute cannot go below;
- `occupancy`: the default launch's programs against the multiprocessor count and its shared memory against
  the device's, read from the device.
"""

from __future__ import annotations

import importlib

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from zoe_kernels.csa.dual_scope_fused_ws_gluon import _loader

dsd = importlib.import_module("zoe_kernels.csa.dual_scope_decode")  # the module (the package exports its function)


@gluon.jit
def _drain(k_full, k_empty, v_full, v_empty, n_tiles, KBUF: gl.constexpr, VBUF: gl.constexpr):
    """Compute warps that do no compute: each tile's key slot and value slot waited for and freed."""
    for j in range(0, n_tiles):
        mbarrier.wait(k_full.index(j % KBUF), (j // KBUF) & 1)
        gl.thread_barrier()
        mbarrier.arrive(k_empty.index(j % KBUF))
        mbarrier.wait(v_full.index(j % VBUF), (j // VBUF) & 1)
        gl.thread_barrier()
        mbarrier.arrive(v_empty.index(j % VBUF))


@gluon.jit
def _loader_alone_kernel(win_k_ptr, win_v_ptr, win_len_ptr, comp_k_ptr, comp_v_ptr, comp_idx_ptr, win_ks_ptr,
                         comp_ks_ptr, W, KSEL, T, stride_wkb, stride_wkn, stride_wvb, stride_wvn, stride_ckb,
                         stride_ckn, stride_cvb, stride_cvn, stride_ib, stride_wksb, stride_cksb, D: gl.constexpr,
                         DV: gl.constexpr, BKV: gl.constexpr, KBUF: gl.constexpr, VBUF: gl.constexpr,
                         LOAD_WARPS: gl.constexpr, LOAD_REGS: gl.constexpr, num_warps: gl.constexpr):
    """Program (b, value-column block): the one-pass kernel's rings and loader over all T tiles, `_drain` as the
    compute partition."""
    b = gl.program_id(0)
    dv0 = gl.program_id(1) * DV
    bq = b.to(gl.int64)
    fp8: gl.constexpr = gl.float8e4nv
    vdt: gl.constexpr = win_v_ptr.dtype.element_ty
    k_ring = gl.allocate_shared_memory(fp8, [KBUF, BKV, D], gl.NVMMASharedLayout.get_default_for([BKV, D], fp8))
    v_ring = gl.allocate_shared_memory(vdt, [VBUF, BKV, DV], gl.NVMMASharedLayout.get_default_for([BKV, DV], vdt))
    ks_ring = gl.allocate_shared_memory(gl.float32, [KBUF, BKV], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    k_full = gl.allocate_shared_memory(gl.int64, [KBUF, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [KBUF, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [VBUF, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [VBUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(KBUF):
        mbarrier.init(k_full.index(i), count=32 * LOAD_WARPS)
        mbarrier.init(k_empty.index(i), count=1)
    for i in gl.static_range(VBUF):
        mbarrier.init(v_full.index(i), count=32 * LOAD_WARPS)
        mbarrier.init(v_empty.index(i), count=1)
    win_len = gl.minimum(gl.load(win_len_ptr + b), W)
    gl.warp_specialize([
        (_drain, (k_full, k_empty, v_full, v_empty, T, KBUF, VBUF)),
        (_loader, (k_ring, ks_ring, v_ring, k_full, k_empty, v_full, v_empty, comp_idx_ptr + bq * stride_ib,
                   win_k_ptr + bq * stride_wkb, comp_k_ptr + bq * stride_ckb, win_ks_ptr + bq * stride_wksb,
                   comp_ks_ptr + bq * stride_cksb, win_v_ptr + bq * stride_wvb, comp_v_ptr + bq * stride_cvb, win_len,
                   0, T, gl.cdiv(W, BKV), KSEL, stride_wkn, stride_ckn, stride_wvn, stride_cvn, dv0, D, DV, BKV, KBUF,
                   VBUF, LOAD_WARPS)),
    ], [LOAD_WARPS], [LOAD_REGS])


def loader_alone_call(inputs, key_slots: int, value_slots: int, block_dv: int = 256, block_kv: int = 64,
                      loader_warps: int = 4):
    """A function launching `_loader_alone_kernel` on the decode call's inputs (one program per sequence and
    value-column block, as the one-pass kernel's one-warpgroup form at one split)."""
    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = inputs
    bsz, w, d = win_k.shape
    tiles = triton.cdiv(w, block_kv) + triton.cdiv(idx.shape[1], block_kv)
    grid = (bsz, d // block_dv)

    def call():
        _loader_alone_kernel[grid](
            win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks, w, idx.shape[1], tiles, win_k.stride(0),
            win_k.stride(1), win_v.stride(0), win_v.stride(1), comp_k.stride(0), comp_k.stride(1), comp_v.stride(0),
            comp_v.stride(1), idx.stride(0), win_ks.stride(0), comp_ks.stride(0), D=d, DV=block_dv, BKV=block_kv,
            KBUF=key_slots, VBUF=value_slots, LOAD_WARPS=loader_warps, LOAD_REGS=dsd._LOADER_REGS, num_warps=4)

    return call


@triton.jit
def _stream_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Sum of BLOCK int32 words a program: a plain streaming read."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0), axis=0))


@triton.jit
def _gather_rows_kernel(wk_ptr, ck_ptr, wv_ptr, cv_ptr, wks_ptr, cks_ptr, idx_ptr, win_len_ptr, out_ptr, KSEL,
                        stride_wkb, stride_wkn, stride_ckb, stride_ckn, stride_wvb, stride_wvn, stride_cvb, stride_cvn,
                        stride_wsb, stride_csb, stride_ib, WIN_TILES: tl.constexpr, COLS: tl.constexpr,
                        BKV: tl.constexpr):
    """Program (b, tile t, part): tile t's rows as the decode call reads them (window positions below win_len,
    then comp_idx's entries, -1: none), all int32 words: part 0 the key rows (COLS words) and their scales,
    part p > 0 the value rows' words (p - 1) * COLS .. p * COLS. Stores one sum so nothing is optimized away."""
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1)
    part = tl.program_id(2)
    rows = tl.arange(0, BKV)
    cols = tl.arange(0, COLS)
    if t < WIN_TILES:
        pos = (t * BKV + rows).to(tl.int64)
        ok = pos < tl.load(win_len_ptr + b)
        if part == 0:
            base = wk_ptr + b * stride_wkb + pos * stride_wkn
            extra = tl.load(wks_ptr + b * stride_wsb + pos, mask=ok, other=0)
        else:
            base = wv_ptr + b * stride_wvb + pos * stride_wvn + (part - 1) * COLS
            extra = tl.zeros([BKV], tl.int32)
    else:
        j = (t - WIN_TILES) * BKV + rows
        sel = tl.load(idx_ptr + b * stride_ib + j, mask=j < KSEL, other=-1)
        ok = sel >= 0
        pos = tl.maximum(sel, 0).to(tl.int64)
        if part == 0:
            base = ck_ptr + b * stride_ckb + pos * stride_ckn
            extra = tl.load(cks_ptr + b * stride_csb + pos, mask=ok, other=0)
        else:
            base = cv_ptr + b * stride_cvb + pos * stride_cvn + (part - 1) * COLS
            extra = tl.zeros([BKV], tl.int32)
    v = tl.load(base[:, None] + cols[None, :], mask=ok[:, None], other=0)
    out = (b * tl.num_programs(1) + t) * tl.num_programs(2) + part
    tl.store(out_ptr + out, tl.sum(tl.sum(v, axis=1) + extra, axis=0))


def _words(t: torch.Tensor) -> torch.Tensor:
    """A [B, N, D] or [B, N] tensor's bytes as int32 words (its last dimension in words)."""
    return t.view(torch.uint8).view(torch.int32)


def gathered_bytes(win_len, idx, d: int) -> int:
    """Bytes the call must read from the caches: every valid entry's fp8 key row, bf16 value row and float32
    key scale, plus the selected indices."""
    entries = int(win_len.sum()) + int((idx >= 0).sum())
    return entries * (d + 2 * d + 4) + idx.numel() * 4


def gather_call(inputs, block_kv: int = 64):
    """A function that reads exactly the rows the decode call reads (`_gather_rows_kernel`), and its grid."""
    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = inputs
    b, w, d = win_k.shape
    wk, ck, wv, cv = _words(win_k), _words(comp_k), _words(win_v), _words(comp_v)
    wks, cks = win_ks.view(torch.int32), comp_ks.view(torch.int32)
    key_words = wk.shape[2]
    parts = 1 + wv.shape[2] // key_words  # values in blocks of a key row's words
    win_tiles = triton.cdiv(w, block_kv)
    grid = (b, win_tiles + triton.cdiv(idx.shape[1], block_kv), parts)
    out = torch.empty(grid[0] * grid[1] * grid[2], dtype=torch.int32, device=q.device)

    def call():
        _gather_rows_kernel[grid](
            wk, ck, wv, cv, wks, cks, idx, win_len, out, idx.shape[1], wk.stride(0), wk.stride(1), ck.stride(0),
            ck.stride(1), wv.stride(0), wv.stride(1), cv.stride(0), cv.stride(1), wks.stride(0), cks.stride(0),
            idx.stride(0), WIN_TILES=win_tiles, COLS=key_words, BKV=block_kv, num_warps=4)
        return out

    return call, grid


def stream_read_tbps(median_us) -> float:
    """TB/s of a plain streaming read of 1 GiB (`_stream_read_kernel`, 16 KiB a program)."""
    n = 1 << 28
    x = torch.randint(0, 1 << 30, (n,), dtype=torch.int32, device="cuda")
    block = 4096
    out = torch.empty(triton.cdiv(n, block), dtype=torch.int32, device="cuda")
    us = median_us(lambda: _stream_read_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block, num_warps=4),
                   graph=False)
    del x
    return 4 * n / us / 1e6


class _SkippedLaunch:
    """Stands in for a kernel whose launch a timing diagnostic leaves out (`kernel[grid](...)` does nothing)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def fused_alone_us(call, median_us) -> float:
    """The default call with its q split skipped (the one-pass kernel reads q's parts left in memory by the
    previous call): what the one-pass launch costs the call by itself."""
    real = dsd.split_q_kernel
    call()
    torch.cuda.synchronize()
    dsd.split_q_kernel = _SkippedLaunch()
    try:
        return median_us(call, graph=True)
    finally:
        dsd.split_q_kernel = real


def split_alone_us(q, median_us) -> float:
    """The q split launch alone, as the default call launches it."""
    bsz, heads, d = q.shape
    q8 = torch.empty((bsz, 2, heads, d), dtype=torch.float8_e4m3fn, device=q.device)
    qs = torch.empty((bsz, heads), dtype=torch.float32, device=q.device)
    grid = (bsz, triton.cdiv(heads, dsd._SPLIT_HEADS))
    return median_us(lambda: dsd.split_q_kernel[grid](q, q8, qs, heads, 1.0, q.stride(0), q.stride(1), D=d,
                                                       BH=dsd._SPLIT_HEADS, PDL=False, num_warps=4), graph=True)


def occupancy(bsz: int, heads: int, d: int, entries: int, selected: int) -> dict:
    """The default launch at this shape against the device: programs per wave and shared memory per program."""
    from zoe_kernels.platform import current_target

    target = current_target()
    cfg = dsd._fused_config(bsz, heads, d, entries, selected, block_dv=None, block_kv=None, splits=None,
                            num_stages=None, target=target)
    programs = bsz * triton.cdiv(heads, 64) * (d // cfg["block_dv"]) * cfg["splits"]
    tiles = triton.cdiv(entries - selected, cfg["block_kv"]) + triton.cdiv(selected, cfg["block_kv"])
    sel_rows = dsd._fused_sel_rows(triton.cdiv(tiles, cfg["splits"]), selected, cfg["block_kv"])
    smem = dsd._fused_smem_bytes(d, cfg["block_dv"], cfg["block_kv"], cfg["num_stages"], sel_rows)
    return {"multiprocessors": target.cu_count, "shared_bytes_per_program_limit": target.lds_bytes,
            "programs": programs, "warps": cfg["num_warps"], "value_columns": cfg["block_dv"],
            "tile_entries": cfg["block_kv"], "splits": cfg["splits"],
            "tiles_per_program": triton.cdiv(tiles, cfg["splits"]), "key_slots": cfg["num_stages"],
            "shared_bytes": smem, "wave_fill": programs / target.cu_count}
