"""The two GEMM stages of the fused MoE, over the tile work list built by `align.moe_align`.

Stage 1 (`gate_up_swiglu`): for every edge j = token * top_k + slot routed to expert e,
    inter[j, n] = silu(x[token] . w13[e, n]) * (x[token] . w13[e, I + n])        n < I
with SwiGLU in the epilogue, so gate and up never reach HBM.
Stage 2 (`down_combine`): out[token, h] = sum_slot topk_weights[token, slot] * (inter[j] . w2[e, h]),
with the top-k weighted combine in the epilogue (fp32 atomics for top-k > 1, plain stores for top-1).

One program computes a BLOCK_M x BLOCK_N tile of one expert; tiles past `num_padded` exit at once, so the
grid depends on the shapes alone (graph capture). The K loop is software-pipelined (`num_stages`): the next
weight tile is loaded while the current one is multiplied. The weight format is a compile-time constant:
0 float (the activation dtype), 1 fp8 128x128 blocks with per-token-group activation scales, 2 int4 with
K-group scales (dequantized to the activation dtype in registers), 3 mxfp4 through `tl.dot_scaled`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FMT_CODE = {"bf16": 0, "fp8": 1, "w4a16": 2, "mxfp4": 3}
FP8_GROUP = 128
INT4_GROUP = 128
MX_GROUP = 32


@triton.jit
def _load_a(a_ptr, as_ptr, rows, row_mask, k0, K, stride_am, stride_ak, stride_asm, stride_ask,
            FMT: tl.constexpr, BLOCK_K: tl.constexpr, FP8_GROUP: tl.constexpr):
    offs_k = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak,
                mask=row_mask[:, None] & (offs_k[None, :] < K), other=0.0)
    if FMT == 1:
        a_s = tl.load(as_ptr + rows * stride_asm + (k0 // FP8_GROUP) * stride_ask, mask=row_mask, other=0.0)
    else:
        a_s = tl.zeros_like(rows).to(tl.float32)
    if FMT == 3:
        if a.dtype == tl.float32:
            a = a.to(tl.float16)
    return a, a_s


@triton.jit
def _dot_w(acc, a, a_s, w_base, ws_base, wrows, wrow_mask, k0, K,
           stride_wn, stride_wk, stride_wsn, stride_wsk,
           FMT: tl.constexpr, A_FMT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
           FP8_GROUP: tl.constexpr, INT4_GROUP: tl.constexpr, MX_GROUP: tl.constexpr):
    """acc += a @ W[wrows, k0:k0+BLOCK_K].T for the weight format FMT."""
    if FMT == 0:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_base + wrows[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=wrow_mask[None, :] & (offs_k[:, None] < K), other=0.0)
        acc = tl.dot(a, w, acc)
    elif FMT == 1:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_base + wrows[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=wrow_mask[None, :] & (offs_k[:, None] < K), other=0.0)
        w_s = tl.load(ws_base + (wrows // FP8_GROUP) * stride_wsn + (k0 // FP8_GROUP) * stride_wsk,
                      mask=wrow_mask, other=0.0)
        acc += tl.dot(a, w) * a_s[:, None] * w_s[None, :]
    elif FMT == 2:
        offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        p = tl.load(w_base + wrows[:, None] * stride_wn + offs_kp[None, :] * stride_wk,
                    mask=wrow_mask[:, None] & (offs_kp[None, :] < (K + 1) // 2), other=0)
        q = tl.join(p & 0xF, p >> 4).reshape(BLOCK_N, BLOCK_K)  # [n, k]: low nibble = even k
        w_s = tl.load(ws_base + wrows * stride_wsn + (k0 // INT4_GROUP) * stride_wsk, mask=wrow_mask, other=0.0)
        w = ((q.to(tl.float32) - 8.0) * w_s.to(tl.float32)[:, None]).to(a.dtype)
        acc = tl.dot(a, tl.trans(w), acc)
    else:
        offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        p = tl.load(w_base + wrows[None, :] * stride_wn + offs_kp[:, None] * stride_wk,
                    mask=wrow_mask[None, :] & (offs_kp[:, None] < (K + 1) // 2), other=0)
        offs_ks = k0 // MX_GROUP + tl.arange(0, BLOCK_K // MX_GROUP)
        w_s = tl.load(ws_base + wrows[:, None] * stride_wsn + offs_ks[None, :] * stride_wsk,
                      mask=wrow_mask[:, None] & (offs_ks[None, :] < (K + MX_GROUP - 1) // MX_GROUP), other=127)
        acc = tl.dot_scaled(a, None, A_FMT, p, w_s, "e2m1", acc)
    return acc


@triton.jit
def _expert_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, topk_w_ptr,
    sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    num_edges, top_k, N, K,
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_we, stride_wn, stride_wk, stride_wse, stride_wsn, stride_wsk,
    stride_om, stride_on,
    GATED: tl.constexpr, ATOMIC: tl.constexpr, FMT: tl.constexpr, A_FMT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8_GROUP: tl.constexpr, INT4_GROUP: tl.constexpr, MX_GROUP: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    edge = tl.load(sorted_ids_ptr + offs_m)
    row_mask = edge < num_edges
    token = (edge // top_k).to(tl.int64)
    if GATED:
        a_rows = token  # stage 1 reads the token's hidden state
    else:
        a_rows = edge.to(tl.int64)  # stage 2 reads the edge's intermediate row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_base = w_ptr + expert * stride_we
    ws_base = ws_ptr + expert * stride_wse

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a, a_s = _load_a(a_ptr, as_ptr, a_rows, row_mask, k0, K, stride_am, stride_ak, stride_asm, stride_ask,
                         FMT, BLOCK_K, FP8_GROUP)
        acc = _dot_w(acc, a, a_s, w_base, ws_base, offs_n, n_mask, k0, K, stride_wn, stride_wk, stride_wsn,
                     stride_wsk, FMT, A_FMT, BLOCK_K, BLOCK_N, FP8_GROUP, INT4_GROUP, MX_GROUP)
        if GATED:
            acc_up = _dot_w(acc_up, a, a_s, w_base, ws_base, N + offs_n, n_mask, k0, K, stride_wn, stride_wk,
                            stride_wsn, stride_wsk, FMT, A_FMT, BLOCK_K, BLOCK_N, FP8_GROUP, INT4_GROUP, MX_GROUP)

    out_mask = row_mask[:, None] & n_mask[None, :]
    if GATED:
        h = acc / (1.0 + tl.exp(-acc)) * acc_up
        o_ptrs = out_ptr + edge.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(o_ptrs, h.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        weight = tl.load(topk_w_ptr + edge, mask=row_mask, other=0.0)
        y = acc * weight[:, None]
        o_ptrs = out_ptr + token[:, None] * stride_om + offs_n[None, :] * stride_on
        if ATOMIC:
            tl.atomic_add(o_ptrs, y, mask=out_mask, sem="relaxed")
        else:
            tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_mask)


def _a_fmt(dtype: torch.dtype) -> str:
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def _launch(a, a_scale, w, w_scale, out, topk_weights, align, *, num_edges, top_k, n, k, fmt, gated,
            atomic, cfg):
    sorted_ids, block_expert, num_padded = align
    fmt_code = FMT_CODE[fmt]
    a_scale = a_scale if a_scale is not None else a  # unused unless fp8
    w_scale = w_scale if w_scale is not None else w  # unused for the float format
    topk_w = topk_weights if topk_weights is not None else a
    grid = (block_expert.numel() * triton.cdiv(n, cfg["BLOCK_N"]),)
    a_s_strides = (a_scale.stride(0), a_scale.stride(1)) if fmt == "fp8" else (0, 0)
    ws_strides = (w_scale.stride(0), w_scale.stride(1), w_scale.stride(2)) if w_scale.dim() == 3 else (0, 0, 0)
    _expert_gemm_kernel[grid](
        a, a_scale, w, w_scale, out, topk_w,
        sorted_ids, block_expert, num_padded,
        num_edges, top_k, n, k,
        a.stride(0), a.stride(1), *a_s_strides,
        w.stride(0), w.stride(1), w.stride(2), *ws_strides,
        out.stride(0), out.stride(1),
        GATED=gated, ATOMIC=atomic, FMT=fmt_code, A_FMT=_a_fmt(a.dtype),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        FP8_GROUP=FP8_GROUP, INT4_GROUP=INT4_GROUP, MX_GROUP=MX_GROUP,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


def gate_up_swiglu(x, x_scale, w13, w13_scale, inter, align, *, top_k: int, fmt: str, cfg: dict) -> None:
    """Stage 1: inter[edge] = silu(x[token] W_gate^T) * (x[token] W_up^T), for every routed edge.

    x [M, H] (fp8 with x_scale [M, ceil(H/128)] for fmt fp8), w13 [E, 2I, H(/2)], inter [M*top_k, I].
    """
    _launch(x, x_scale, w13, w13_scale, inter, None, align, num_edges=inter.shape[0], top_k=top_k,
            n=inter.shape[1], k=x.shape[1], fmt=fmt, gated=True, atomic=False, cfg=cfg)


def down_combine(inter, inter_scale, w2, w2_scale, out, topk_weights, align, *, top_k: int, fmt: str,
                 cfg: dict) -> None:
    """Stage 2: out[token] (+)= topk_weights[edge] * inter[edge] W2[e]^T.

    inter [M*top_k, I], w2 [E, H, I(/2)], out [M, H]: fp32 and accumulated with atomics when top_k > 1
    (the caller zeroes it), any float dtype and plainly stored when top_k == 1.
    """
    _launch(inter, inter_scale, w2, w2_scale, out, topk_weights.reshape(-1), align, num_edges=inter.shape[0],
            top_k=top_k, n=out.shape[1], k=inter.shape[1], fmt=fmt, gated=False, atomic=top_k > 1, cfg=cfg)
