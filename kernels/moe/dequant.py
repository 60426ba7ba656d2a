"""The large-M path of the 4-bit formats: their weights dequantized to the activations' dtype in a workspace, then
the float tiles of `grouped_gemm.py` (the "bf16" format of the tl.dot path) over them.

    W[e, n, k] = (u - 8) * scale[e, n, k // 128]            w4a16 (int4 nibble u, zero point 8)
    W[e, n, k] = e2m1(u) * 2^(scale[e, n, k // 32] - 127)   mxfp4 (e8m0 scale byte)

with u the low nibble of byte k // 2 for even k and the high nibble for odd k (`formats.py`). Each weight is
rounded once to the activations' dtype, as a checkpoint dequantized offline would be.

When M is large every expert receives many tokens and the MoE is bound by its matrix products, where the float tiles
run at the MMA rate; the 4-bit tiles pay their decode per tile of rows. The dequantization costs one pass over the
packed weights and one write of the float ones, which the products then read: `dispatch.moe_path_for` takes this
path only at the M where it measured faster (`crossover.json`). The workspace holds the gate+up weights of a
chunk of experts, reused for their down weights; experts are processed chunk by chunk when the local experts'
float weights exceed `config.DEQUANT_WORKSPACE_BYTES`. One align launch serves every chunk; each chunk's launches
skip the tiles of other experts, so the call stays graph-capturable (no host synchronization).
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.align import moe_align
from zoe_kernels.moe.config import (
    DEQUANT_TILE,
    DEQUANT_WORKSPACE_BYTES,
    FOUR_BIT_FORMATS,
    block_m_for,
    stage_config,
)
from zoe_kernels.moe.formats import INT4_GROUP, MX_GROUP
from zoe_kernels.moe.grouped_gemm import KernelFormat, down_combine, gate_up_swiglu

@triton.jit
def _dequant_4bit_kernel(w_ptr, s_ptr, out_ptr, rows, K, KP, e0,
                         stride_we, stride_wn, stride_se, stride_sn, stride_oe, stride_on,
                         MX: tl.constexpr, GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_KP: tl.constexpr):
    """out[e, r, k] for expert e0 + e, rows r of one block, packed bytes of one block (2 k each)."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    e = tl.program_id(2).to(tl.int64)
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    kp = pid_k * BLOCK_KP + tl.arange(0, BLOCK_KP)
    mask = (r < rows)[:, None] & (kp < KP)[None, :]
    p = tl.load(w_ptr + (e0 + e) * stride_we + r[:, None].to(tl.int64) * stride_wn + kp[None, :], mask=mask, other=0)
    # one scale serves both nibbles of a byte: the groups (128, 32) are even
    s = tl.load(s_ptr + (e0 + e) * stride_se + r[:, None].to(tl.int64) * stride_sn + (kp // (GROUP // 2))[None, :],
                mask=mask, other=0)
    lo = (p & 0xF).to(tl.int32)
    hi = (p >> 4).to(tl.int32)
    if MX:
        # e2m1 s|e1 e0|m: magnitude m/2 (e = 0) or (1 + m/2) 2^(e-1); e8m0 b: 2^(b - 127), built from its bits
        # (b = 0, 2^-127, is a float32 subnormal: the bit pattern 1 << 22)
        scale = tl.where(s == 0, 1 << 22, s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
        vlo = _e2m1(lo) * scale
        vhi = _e2m1(hi) * scale
    else:
        vlo = (lo - 8).to(tl.float32) * s
        vhi = (hi - 8).to(tl.float32) * s
    v = tl.reshape(tl.join(vlo, vhi), (BLOCK_R, 2 * BLOCK_KP))  # k = 2 kp + (0 | 1)
    k = pid_k * 2 * BLOCK_KP + tl.arange(0, 2 * BLOCK_KP)
    tl.store(out_ptr + e * stride_oe + r[:, None].to(tl.int64) * stride_on + k[None, :],
             v.to(out_ptr.dtype.element_ty), mask=(r < rows)[:, None] & (k < K)[None, :])


@triton.jit
def _e2m1(u):
    """e2m1 nibbles (int32) -> float32 values."""
    ex = (u >> 1) & 3
    m = (u & 1).to(tl.float32)
    mag = tl.where(ex == 0, 0.5 * m, (1.0 + 0.5 * m) * (1 << tl.maximum(ex - 1, 0)).to(tl.float32))
    return tl.where((u & 8) != 0, -mag, mag)


def dequantize_4bit(w: torch.Tensor, scale: torch.Tensor, fmt: str, k: int, out: torch.Tensor,
                    experts: tuple[int, int]) -> torch.Tensor:
    """Experts lo <= e < hi of the packed weight `w` [E, N, ceil(k/2)] (uint8) with its `scale` in `fmt`, into
    `out[: hi - lo, :, :k]` ([>= hi - lo, N, k], contiguous rows, the activations' dtype). Returns that view."""
    if fmt not in FOUR_BIT_FORMATS:
        raise ValueError(f"dequantize_4bit takes {FOUR_BIT_FORMATS}, got {fmt!r}")
    lo, hi = experts
    e, rows, kp = w.shape
    if not 0 <= lo < hi <= e or out.shape[0] < hi - lo or out.shape[1:] != (rows, k) or out.stride(2) != 1:
        raise ValueError(f"out {tuple(out.shape)} cannot hold experts {lo}..{hi} of a [{e}, {rows}, {k}] weight")
    if w.stride(2) != 1 or scale.stride(2) != 1:
        raise ValueError("dequantize_4bit needs the packed weight and its scales contiguous along K")
    block_r, block_kp, warps = DEQUANT_TILE
    grid = (triton.cdiv(rows, block_r), triton.cdiv(kp, block_kp), hi - lo)
    _dequant_4bit_kernel[grid](
        w, scale, out, rows, k, kp, lo,
        w.stride(0), w.stride(1), scale.stride(0), scale.stride(1), out.stride(0), out.stride(1),
        MX=fmt == "mxfp4", GROUP=MX_GROUP if fmt == "mxfp4" else INT4_GROUP, BLOCK_R=block_r, BLOCK_KP=block_kp,
        num_warps=warps,
    )
    return out[: hi - lo]


def expert_chunk(num_experts: int, rows: int, k: int, dtype: torch.dtype,
                 workspace_bytes: int = DEQUANT_WORKSPACE_BYTES) -> int:
    """Experts per chunk: as many [rows, k] float weights as the workspace holds (at least one)."""
    per_expert = rows * k * torch.empty((), dtype=dtype).element_size()
    return max(1, min(num_experts, workspace_bytes // per_expert))


def dequant_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, *, fmt: str, w13_scale: torch.Tensor, w2_scale: torch.Tensor,
                alloc: Callable[..., torch.Tensor] = torch.empty,
                workspace_bytes: int = DEQUANT_WORKSPACE_BYTES) -> torch.Tensor:
    """`fused_moe`'s contract (arguments already checked; x contiguous, topk_weights float32) through the float
    tiles over dequantized weights. Returns [M, H] in x's dtype."""
    m, h = x.shape
    e, two_i = w13.shape[:2]
    i = two_i // 2
    top_k = topk_ids.shape[1]
    dtype, dev = x.dtype, x.device
    bm = block_m_for(m, top_k, e)
    align = moe_align(topk_ids.contiguous(), e, bm)
    cfg1 = stage_config(m, top_k, e, i, h, "bf16", gated=True, block_m=bm)
    cfg2 = stage_config(m, top_k, e, h, i, "bf16", gated=False, block_m=bm)
    chunk = expert_chunk(e, two_i, h, dtype, workspace_bytes)  # w13's [2I, H] per expert is w2's [H, I] twice
    work = alloc((chunk * two_i * h,), dtype=dtype, device=dev)  # w13's chunk, then w2's in the same bytes
    inter = alloc((m * top_k, i), dtype=dtype, device=dev)
    out = torch.zeros((m, h), dtype=torch.float32 if top_k > 1 else dtype, device=dev)
    for lo in range(0, e, chunk):
        hi = min(e, lo + chunk)
        w13_f = dequantize_4bit(w13, w13_scale, fmt, h, work[: chunk * two_i * h].view(chunk, two_i, h), (lo, hi))
        gate_up_swiglu(x, None, w13_f, None, inter, align, top_k=top_k, kfmt=KernelFormat.FLOAT, cfg=cfg1,
                       experts=(lo, hi))
        w2_f = dequantize_4bit(w2, w2_scale, fmt, i, work[: chunk * h * i].view(chunk, h, i), (lo, hi))
        down_combine(inter, None, w2_f, None, out, topk_weights, align, top_k=top_k, kfmt=KernelFormat.FLOAT,
                     cfg=cfg2, experts=(lo, hi))
    return out if out.dtype == dtype else out.to(dtype)
