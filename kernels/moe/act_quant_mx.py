"""MXFP8 quantization of activations (OCP Microscaling: e4m3 elements, one e8m0 scale per 32 along K), one Triton
launch. It feeds the e2m1-weight MoE on hardware that scales natively (gfx950's v_mfma_scale_f32_*_f8f6f4 take both
operands in 8 bits or fewer), where 16-bit activations would make Triton upcast the weights to bf16 instead.

For each row r and block b of MX_GROUP = 32 elements along K (the last block zero-padded):
    e[r, b] = floor(log2(max_{k in b} |x[r, k]|)) - 8          (8: the exponent of e4m3's largest power of two)
    s[r, b] = clamp(e[r, b] + 127, 1, 254)                     (the e8m0 byte, uint8; x = 0 gives the smallest)
    q[r, k] = e4m3(clamp(x[r, k] / 2^(s[r, b] - 127), -448, 448)), rounded to nearest even
so x[r, k] ~= q[r, k] * 2^(s[r, b] - 127). The block's largest magnitude lands in [256, 512) and saturates to 448
above it, the shared exponent the OCP MX spec (v1.0, section 6.3) prescribes. Off the GPU (the Triton CPU
interpreter casts fp32 -> fp8 wrongly for a few percent of values) `quantize_act_mxfp8_torch` computes the same.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.formats import MX_GROUP

MXFP8_DTYPE = torch.float8_e4m3fn  # OCP e4m3, the element type tl.dot_scaled's "e4m3" operand takes
E4M3_MAX = 448.0
E4M3_EMAX = 8  # exponent of the largest power of two e4m3 holds (256)


def quantize_act_mxfp8_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch version of `quantize_act_mxfp8` (same math, same outputs)."""
    r, k = x.shape
    blocks = triton.cdiv(k, MX_GROUP)
    xb = torch.nn.functional.pad(x.float(), (0, blocks * MX_GROUP - k)).view(r, blocks, MX_GROUP)
    amax_exp = (xb.abs().amax(dim=-1).view(torch.int32) >> 23) & 0xFF  # biased exponent: floor(log2) + 127
    s = (amax_exp - E4M3_EMAX).clamp(1, 254)
    q = (xb / torch.exp2(s.float() - 127.0)[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(MXFP8_DTYPE)
    return q.view(r, blocks * MX_GROUP)[:, :k].contiguous(), s.to(torch.uint8)


def dequantize_act_mxfp8(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(e4m3 [R, K], e8m0 uint8 [R, ceil(K/32)]) -> float32 [R, K], exactly."""
    scale = torch.exp2(s.float() - 127.0).repeat_interleave(MX_GROUP, dim=-1)[:, : q.shape[1]]
    return q.float() * scale


@triton.jit
def _act_quant_mxfp8_kernel(x_ptr, q_ptr, s_ptr, K, stride_xr, stride_qr, stride_sr, E4M3_MAX: tl.constexpr,
                            E4M3_EMAX: tl.constexpr, GROUP: tl.constexpr, GROUPS_PER_PROG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS_PER_PROG + tl.arange(0, GROUPS_PER_PROG)
    offs = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xr + offs, mask=mask, other=0.0).to(tl.float32)
    amax_exp = (tl.max(tl.abs(x), axis=1).to(tl.int32, bitcast=True) >> 23) & 0xFF
    s = tl.clamp(amax_exp - E4M3_EMAX, 1, 254)
    scale = (s << 23).to(tl.float32, bitcast=True)  # 2^(s - 127), a normal float for s >= 1
    q = tl.clamp(x / scale[:, None], -E4M3_MAX, E4M3_MAX)
    tl.store(q_ptr + row * stride_qr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sr + g, s.to(tl.uint8), mask=g * GROUP < K)


def quantize_act_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (e4m3 [R, K], e8m0 uint8 scales [R, ceil(K/32)]); Triton on a GPU, PyTorch elsewhere."""
    if not x.is_cuda:
        return quantize_act_mxfp8_torch(x)
    r, k = x.shape
    groups = triton.cdiv(k, MX_GROUP)
    q = torch.empty((r, k), dtype=MXFP8_DTYPE, device=x.device)
    s = torch.empty((r, groups), dtype=torch.uint8, device=x.device)
    if r == 0:
        return q, s
    per_prog = min(32, triton.next_power_of_2(groups))
    _act_quant_mxfp8_kernel[(r, triton.cdiv(groups, per_prog))](
        x, q, s, k, x.stride(0), q.stride(0), s.stride(0),
        E4M3_MAX=E4M3_MAX, E4M3_EMAX=E4M3_EMAX, GROUP=MX_GROUP, GROUPS_PER_PROG=per_prog, num_warps=4,
    )
    return q, s
