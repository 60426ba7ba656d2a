"""DSA lightning indexer (DeepSeek-V3.2 / GLM-5.3 sparse attention) in Triton: FP8 logits and top-k.

Math, for query row i and key j:

    logits[i, j] = sum_h w[i, h] * relu((q[i, h, :] . k[j, :]) * k_scale[j])    if ks[i] <= j < ke[i]
    logits[i, j] = -inf                                                          otherwise

q: [M, H, D] float8_e4m3fn (e4m3fnuz on gfx942), H in {32, 64} (any power of two works), D = 128.
w: [M, H] float32, the per-head gate with the query scale (and softmax scale) folded in, as vLLM
passes `weights` to DeepGEMM's `fp8_mqa_logits`. k: [N, D] fp8 with k_scale: [N] float32 per key.
ks, ke: [M] int32 valid key range of each row: causal prefill `ks = seq_start, ke = seq_start + pos + 1`,
prefill after a cached prefix (the prefix's keys are in range), or decode (one row per sequence).

Index conventions (what the engines expect from the top-k): `indexer_topk` returns int32 [M, k] key
positions relative to ks[i], i.e. the token position inside the row's sequence (vLLM's
`sparse_attn_indexer` subtracts `cu_seqlen_ks` from torch.topk's indices and masks to -1 outside
[0, ke - ks); SGLang's NSA indexer also hands positions within the request to its page-table
transform). Rows with fewer than k valid keys are padded with -1. Ties: larger logit first, then lower
position; the selected positions are returned in ascending order.

Kernel: a program owns BM query rows (a [D, BM*H] fp8 Q^T tile, loaded once) and a run of key tiles;
per key tile one fp8 `tl.dot` gives scores^T [BN, BM*H] float32, then relu, the weighted head sum along
the columns, the k_scale factor (k_scale >= 0, so relu(s * k_scale) = k_scale * relu(s)) and the range
mask; tiles entirely outside every row's range only write -inf. A second kernel with heads along the rows
(the head sum across warps, slower on the H200) stays selectable as layout="heads": bench/kernels/sparse_bench.py
times it beside the default.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.topk import topk_ranges
from zoe_kernels.platform import sm_count

# Programs per multiprocessor/CU the "keys" layout splits a few rows' keys into (decode): 8 keep an H200's SMs
# busy (1,056 programs on 132). Retune with bench/kernels/sparse_bench.py's indexer rows at small M.
_PROGRAMS_PER_SM = 8


@triton.jit
def _row_block(ks_ptr, ke_ptr, pid_m, M, BM: tl.constexpr):
    """Query rows of block pid_m, their [ks, ke) ranges and the union of the non-empty ones [blk_lo, blk_hi)."""
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < M
    lo = tl.load(ks_ptr + rows, mask=row_ok, other=0)
    hi = tl.load(ke_ptr + rows, mask=row_ok, other=0)
    blk_lo = tl.min(tl.where(row_ok & (hi > lo), lo, 2147483647), axis=0)
    blk_hi = tl.max(tl.where(row_ok, hi, 0), axis=0)
    return rows, row_ok, lo, hi, blk_lo, blk_hi


@triton.jit
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_ptr, k_scale_ptr, ks_ptr, ke_ptr, out_ptr,
    M, N, stride_qm, stride_qh, stride_wm, stride_kn, stride_om,
    H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, row_ok, lo, hi, blk_lo, blk_hi = _row_block(ks_ptr, ke_ptr, pid_m, M, BM)

    # Q tile: row r = (query i, head h) flattened as i * H + h
    qr = tl.arange(0, BM * H)
    q_row = pid_m * BM + qr // H
    q_ok = q_row < M
    dd = tl.arange(0, D)
    q = tl.load(q_ptr + q_row.to(tl.int64)[:, None] * stride_qm + (qr % H)[:, None] * stride_qh + dd[None, :],
                mask=q_ok[:, None], other=0.0)
    w = tl.load(w_ptr + q_row.to(tl.int64) * stride_wm + qr % H, mask=q_ok, other=0.0)

    out_rows = out_ptr + rows.to(tl.int64)[:, None] * stride_om
    for t in range(TILES):
        cols = (pid_n * TILES + t) * BN + tl.arange(0, BN)
        col_ok = cols < N
        tile_lo = (pid_n * TILES + t) * BN
        if (tile_lo < blk_hi) & (tile_lo + BN > blk_lo):
            kt = tl.load(k_ptr + cols.to(tl.int64)[:, None] * stride_kn + dd[None, :], mask=col_ok[:, None], other=0.0)
            sc = tl.load(k_scale_ptr + cols, mask=col_ok, other=0.0)
            s = tl.dot(q, tl.trans(kt))  # [BM*H, BN] fp32, exact products of fp8
            s = tl.maximum(s * sc[None, :], 0.0) * w[:, None]
            logits = tl.sum(tl.reshape(s, (BM, H, BN)), axis=1)
            valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
            logits = tl.where(valid, logits, float("-inf"))
        else:
            logits = tl.full((BM, BN), float("-inf"), tl.float32)
        tl.store(out_rows + cols[None, :], logits, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _indexer_logits_keys_kernel(
    q_ptr, w_ptr, k_ptr, k_scale_ptr, ks_ptr, ke_ptr, out_ptr,
    M, N, stride_qm, stride_qh, stride_wm, stride_kn, stride_om, TILES,
    H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):
    """Keys-as-rows variant (the default): per key tile one fp8 dot gives scores^T [BN keys, BM*H], so the
    weighted head sum runs along the accumulator's columns (inside a thread and its quad, no shared-memory
    reduction), and since k_scale >= 0, relu(s * k_scale) = k_scale * relu(s) moves the scale out of the
    head sum: the epilogue is one max and one fma per score, then one multiply per logit."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows, row_ok, lo, hi, blk_lo, blk_hi = _row_block(ks_ptr, ke_ptr, pid_m, M, BM)

    # Q^T tile: column c = (query i, head h) flattened as i * H + h
    qc = tl.arange(0, BM * H)
    q_row = pid_m * BM + qc // H
    q_ok = q_row < M
    dd = tl.arange(0, D)
    q_t = tl.load(q_ptr + q_row.to(tl.int64)[None, :] * stride_qm + (qc % H)[None, :] * stride_qh + dd[:, None],
                  mask=q_ok[None, :], other=0.0)  # [D, BM*H]
    w = tl.load(w_ptr + q_row.to(tl.int64) * stride_wm + qc % H, mask=q_ok, other=0.0)

    out_rows = out_ptr + rows.to(tl.int64)[None, :] * stride_om
    t0 = pid_n * TILES
    t1 = tl.minimum(t0 + TILES, tl.cdiv(N, BN))
    # tiles that meet some row's range get the dot, in a loop of their own (no branch around the loads, so
    # the K loads are pipelined); the others only get -inf
    a = tl.minimum(tl.maximum(t0, blk_lo // BN), t1)
    b = tl.maximum(tl.minimum(t1, tl.cdiv(blk_hi, BN)), a)
    for t in range(a, b):
        cols = t * BN + tl.arange(0, BN)
        col_ok = cols < N
        kt = tl.load(k_ptr + cols.to(tl.int64)[:, None] * stride_kn + dd[None, :], mask=col_ok[:, None], other=0.0)
        s = tl.dot(kt, q_t)  # [BN, BM*H] fp32, exact products of fp8
        prod = tl.maximum(s, 0.0) * w[None, :]
        logits = tl.sum(tl.reshape(prod, (BN, BM, H)), axis=2)  # [BN, BM]
        logits = logits * tl.load(k_scale_ptr + cols, mask=col_ok, other=0.0)[:, None]
        valid = (cols[:, None] >= lo[None, :]) & (cols[:, None] < hi[None, :])
        tl.store(out_rows + cols[:, None], tl.where(valid, logits, float("-inf")),
                 mask=row_ok[None, :] & col_ok[:, None])
    for t in range(t0, t1):
        if (t < a) | (t >= b):
            cols = t * BN + tl.arange(0, BN)
            tl.store(out_rows + cols[:, None], tl.full((BN, BM), float("-inf"), tl.float32),
                     mask=row_ok[None, :] & (cols < N)[:, None])


def _check_inputs(q, weights, k, k_scale, ks, ke):
    if q.dim() != 3:
        raise ValueError(f"q must be [M, H, D], got shape {tuple(q.shape)}")
    m, h, d = q.shape
    if h & (h - 1) or d & (d - 1):
        raise ValueError(f"H and D must be powers of two, got H={h}, D={d}")
    if weights.shape != (m, h):
        raise ValueError(f"weights must be [M, H] = [{m}, {h}], got {tuple(weights.shape)}")
    if k.dim() != 2 or k.shape[1] != d:
        raise ValueError(f"k must be [N, {d}], got {tuple(k.shape)}")
    if k_scale.shape != (k.shape[0],):
        raise ValueError(f"k_scale must be [N] = [{k.shape[0]}], got {tuple(k_scale.shape)}")
    if ks.shape != (m,) or ke.shape != (m,):
        raise ValueError(f"ks/ke must be [M] = [{m}], got {tuple(ks.shape)}/{tuple(ke.shape)}")
    if q.element_size() != 1 or k.element_size() != 1:
        raise ValueError(f"q and k must be fp8 (e4m3), got {q.dtype} and {k.dtype}")


def lightning_indexer(q_fp8: torch.Tensor, weights: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor,
                      ks: torch.Tensor, ke: torch.Tensor, *, block_m: int | None = None, block_n: int | None = None,
                      tiles_per_program: int | None = None, num_warps: int | None = None, num_stages: int = 3,
                      layout: str = "keys", out: torch.Tensor | None = None) -> torch.Tensor:
    """DSA indexer logits [M, N] float32 (see the module doc for the math and the -inf masking).

    k_scale must be >= 0 (a quantization scale), which the default kernel relies on. layout: "keys"
    (default; scores^T tiles [block_n keys, block_m * H], head sum along the accumulator's columns) or
    "heads" ([block_m * H, block_n] tiles, head sum across warps; the benchmark's comparison). block_m query rows
    share one program (default: 128 // H, so a program's fp8 dot has 128 query-head columns or rows);
    defaults per layout: "keys" 128-key tiles, all of a row block's key tiles in one program unless that
    leaves under _PROGRAMS_PER_SM programs per multiprocessor, 4 warps (faster than 8 on the H200); "heads"
    64-key tiles, 8 per program, 4 warps (bench/kernels/sparse_README.md has both). `out` is an optional
    preallocated contiguous [M, N] float32 tensor to write into."""
    _check_inputs(q_fp8, weights, k_fp8, k_scale, ks, ke)
    if layout not in ("keys", "heads"):
        raise ValueError(f"layout must be 'keys' or 'heads', got {layout!r}")
    m, h, d = q_fp8.shape
    n = k_fp8.shape[0]
    if q_fp8.stride(2) != 1 or q_fp8.stride(1) != d:
        q_fp8 = q_fp8.contiguous()
    k_fp8 = k_fp8.contiguous()
    weights = weights.to(torch.float32).contiguous()
    k_scale = k_scale.to(torch.float32).contiguous()
    ks = ks.to(device=q_fp8.device, dtype=torch.int32).contiguous()
    ke = ke.to(device=q_fp8.device, dtype=torch.int32).contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=q_fp8.device)
    elif out.shape != (m, n) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous float32 [{m}, {n}] tensor, got {tuple(out.shape)} {out.dtype}")
    if m == 0 or n == 0:
        return out
    bm = block_m or max(1, 128 // h)
    args = (q_fp8, weights, k_fp8, k_scale, ks, ke, out,
            m, n, q_fp8.stride(0), q_fp8.stride(1), weights.stride(0), k_fp8.stride(0), out.stride(0))
    if layout == "heads":
        bn, tiles = block_n or 64, tiles_per_program or 8
        _indexer_logits_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn * tiles))](
            *args, H=h, D=d, BM=bm, BN=bn, TILES=tiles, num_warps=num_warps or 4, num_stages=num_stages)
        return out
    bn = block_n or 128
    n_tiles = triton.cdiv(n, bn)
    if tiles_per_program is None:
        # a program sweeps all of its rows' keys (Q^T is loaded once), unless that leaves too few programs
        # (decode): then the keys split until there are _PROGRAMS_PER_SM programs per multiprocessor
        n_splits = min(n_tiles, max(1, triton.cdiv(_PROGRAMS_PER_SM * sm_count(q_fp8.device.index or 0),
                                                          triton.cdiv(m, bm))))
        tiles_per_program = triton.cdiv(n_tiles, n_splits)
    _indexer_logits_keys_kernel[(triton.cdiv(m, bm), triton.cdiv(n_tiles, tiles_per_program))](
        *args, tiles_per_program, H=h, D=d, BM=bm, BN=bn, num_warps=num_warps or 4, num_stages=num_stages)
    return out


def indexer_topk(*args: torch.Tensor, k: int = 2048, splits: int | None = None, tile: int = 4096) -> torch.Tensor:
    """Top-k key positions per query row: int32 [M, k], relative to ks, ascending, -1 padded.

    Call as `indexer_topk(logits, ks, ke, k=2048)` with logits from `lightning_indexer`, or with the
    indexer's inputs `indexer_topk(q_fp8, weights, k_fp8, k_scale, ks, ke, k=2048)` (logits are
    computed first). Ties: larger logit first, then lower position.
    """
    if len(args) == 6:
        q_fp8, weights, k_fp8, k_scale, ks, ke = args
        logits = lightning_indexer(q_fp8, weights, k_fp8, k_scale, ks, ke)
    elif len(args) == 3:
        logits, ks, ke = args
    else:
        raise TypeError("indexer_topk takes (logits, ks, ke) or (q_fp8, weights, k_fp8, k_scale, ks, ke); "
                        f"got {len(args)} positional arguments")
    # default splits: one program per row when rows are many (prefill), split few long rows (decode)
    return topk_ranges(logits, ks, ke, k, splits=splits, tile=tile)
