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

Kernel: a program owns BM query rows (a [BM*H, D] fp8 Q tile kept in registers) and a run of key tiles;
per key tile one fp8 `tl.dot` gives [BM*H, BN] float32 scores, then relu(score * k_scale), the
weighted head sum, and the range mask; tiles entirely outside every row's range only write -inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.topk import topk_ranges


@triton.jit
def _indexer_logits_kernel(
    q_ptr, w_ptr, k_ptr, k_scale_ptr, ks_ptr, ke_ptr, out_ptr,
    M, N, stride_qm, stride_qh, stride_wm, stride_kn, stride_om,
    H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < M
    lo = tl.load(ks_ptr + rows, mask=row_ok, other=0)
    hi = tl.load(ke_ptr + rows, mask=row_ok, other=0)
    blk_lo = tl.min(tl.where(row_ok & (hi > lo), lo, 2147483647), axis=0)
    blk_hi = tl.max(tl.where(row_ok, hi, 0), axis=0)

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
                      ks: torch.Tensor, ke: torch.Tensor, *, block_m: int | None = None, block_n: int = 64,
                      tiles_per_program: int = 8, num_warps: int = 4, num_stages: int = 3,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """DSA indexer logits [M, N] float32 (see the module doc for the math and the -inf masking).

    block_m query rows share one program (default: 128 // H, so a program's fp8 dot has 128 rows). The
    default tiles are the fastest of four configs on an H200 (8K causal square: 267 TFLOP/s against 182
    for block_n=128/8 warps; bench/kernels/sparse_README.md);
    `out` is an optional preallocated contiguous [M, N] float32 tensor to write into."""
    _check_inputs(q_fp8, weights, k_fp8, k_scale, ks, ke)
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
    grid = (triton.cdiv(m, bm), triton.cdiv(n, block_n * tiles_per_program))
    _indexer_logits_kernel[grid](
        q_fp8, weights, k_fp8, k_scale, ks, ke, out,
        m, n, q_fp8.stride(0), q_fp8.stride(1), weights.stride(0), k_fp8.stride(0), out.stride(0),
        H=h, D=d, BM=bm, BN=block_n, TILES=tiles_per_program, num_warps=num_warps, num_stages=num_stages)
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
