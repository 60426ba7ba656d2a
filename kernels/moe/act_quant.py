"""Per-token-group fp8 quantization of activations (DeepSeek-V3 style), one Triton launch.

q[r, k] = x[r, k] / s[r, g], s[r, g] = max(amax_{k in group g} |x[r, k]|, 1e-10) / fp8_max, groups of 128
along K. Off the GPU (the Triton CPU interpreter casts fp32 -> fp8 wrongly for a few percent of values),
the PyTorch version in `formats.quantize_act_fp8_torch` computes the same thing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.formats import FP8_BLOCK, quantize_act_fp8_torch
from zoe_kernels.platform import fp8_dtype, fp8_max


@triton.jit
def _act_quant_fp8_kernel(x_ptr, q_ptr, s_ptr, R, K, stride_xr, stride_qr, stride_sr, FP8_MAX: tl.constexpr,
                          GROUP: tl.constexpr, GROUPS_PER_PROG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS_PER_PROG + tl.arange(0, GROUPS_PER_PROG)
    offs = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / FP8_MAX
    q = tl.clamp(x / s[:, None], -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sr + g, s, mask=g * GROUP < K)


def quantize_act_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (fp8 [R, K], fp32 scales [R, ceil(K/128)]); Triton on a GPU, PyTorch elsewhere."""
    if not x.is_cuda:
        return quantize_act_fp8_torch(x)
    dtype = fp8_dtype(x.device)
    r, k = x.shape
    groups = triton.cdiv(k, FP8_BLOCK)
    q = torch.empty((r, k), dtype=dtype, device=x.device)
    s = torch.empty((r, groups), dtype=torch.float32, device=x.device)
    if r == 0:
        return q, s
    per_prog = min(8, triton.next_power_of_2(groups))
    _act_quant_fp8_kernel[(r, triton.cdiv(groups, per_prog))](
        x, q, s, r, k, x.stride(0), q.stride(0), s.stride(0),
        FP8_MAX=fp8_max(dtype), GROUP=FP8_BLOCK, GROUPS_PER_PROG=per_prog, num_warps=4,
    )
    return q, s
