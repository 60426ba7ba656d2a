"""Per-token-group fp8 quantization of activations (DeepSeek-V3 style), one Triton launch.

q[r, k] = x[r, k] / s[r, g], s[r, g] = max(amax_{k in group g} |x[r, k]|, 1e-10) / fp8_max, groups of 128
along K. Off the GPU (the Triton CPU interpreter casts fp32 -> fp8 wrongly for a few percent of values),
the PyTorch version in `formats.quantize_act_fp8_torch` computes the same thing. `quantize_groups` is the
arithmetic, shared with the stage-1 epilogue that quantizes the intermediate at M=1 (`grouped_gemm.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.formats import FP8_BLOCK, quantize_act_fp8_torch
from zoe_kernels.platform import fp8_dtype, fp8_max, gdc_launch_dependents


@triton.jit
def _round_to_e4m3(v):
    """v (float32, |v| <= fp8 max) rounded to nearest-even on e4m3's 3 mantissa bits, in float32 bits: the Triton
    CPU interpreter's own float32 -> fp8 cast drops the carry into the exponent (124.6 -> 64), so the interpreter
    casts values that are already representable (normal range; the few subnormals round twice)."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def quantize_groups(x, FP8_MAX: tl.constexpr, ROUND_E4M3: tl.constexpr):
    """x [G, GROUP] float32 -> (q [G, GROUP] float32 holding fp8 values before the cast, s [G]): one scale per
    group, as the module docstring; ROUND_E4M3 pre-rounds for the interpreter (`_round_to_e4m3`)."""
    s = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-10) / FP8_MAX
    q = tl.clamp(x / s[:, None], -FP8_MAX, FP8_MAX)
    if ROUND_E4M3:
        q = _round_to_e4m3(q)
    return q, s


@triton.jit
def _act_quant_fp8_kernel(x_ptr, q_ptr, s_ptr, R, K, stride_xr, stride_qr, stride_sr, zero_ptr, zero_numel,
                          FP8_MAX: tl.constexpr, GROUP: tl.constexpr, GROUPS_PER_PROG: tl.constexpr,
                          ZBLOCK: tl.constexpr, TRIGGER: tl.constexpr):
    if TRIGGER:  # the next launch (a programmatic dependent) may start now; it waits for this grid's writes
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    if ZBLOCK > 0:  # an int32 buffer the next launch needs zeroed (the stage-1 group counters at M=1)
        pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        offs_z = pid * ZBLOCK + tl.arange(0, ZBLOCK)
        tl.store(zero_ptr + offs_z, tl.zeros([ZBLOCK], dtype=tl.int32), mask=offs_z < zero_numel)
    g = tl.program_id(1) * GROUPS_PER_PROG + tl.arange(0, GROUPS_PER_PROG)
    offs = g[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    mask = offs < K
    x = tl.load(x_ptr + row * stride_xr + offs, mask=mask, other=0.0).to(tl.float32)
    q, s = quantize_groups(x, FP8_MAX, False)
    tl.store(q_ptr + row * stride_qr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + row * stride_sr + g, s, mask=g * GROUP < K)


def quantize_act_fp8(x: torch.Tensor, zero: torch.Tensor | None = None,
                     trigger: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (fp8 [R, K], fp32 scales [R, ceil(K/128)]); Triton on a GPU, PyTorch elsewhere.
    `zero` (int32, contiguous) is zeroed on the way (saves the next launch a memset). `trigger`: the next launch,
    made as a programmatic dependent (`platform.has_pdl`), may start while this one runs."""
    if not x.is_cuda:
        if zero is not None:
            zero.zero_()
        return quantize_act_fp8_torch(x)
    dtype = fp8_dtype(x.device)
    r, k = x.shape
    groups = triton.cdiv(k, FP8_BLOCK)
    q = torch.empty((r, k), dtype=dtype, device=x.device)
    s = torch.empty((r, groups), dtype=torch.float32, device=x.device)
    if r == 0:
        if zero is not None:
            zero.zero_()
        return q, s
    per_prog = min(8, triton.next_power_of_2(groups))
    grid = (r, triton.cdiv(groups, per_prog))
    zblock = 0 if zero is None else max(16, triton.next_power_of_2(triton.cdiv(zero.numel(), grid[0] * grid[1])))
    _act_quant_fp8_kernel[grid](
        x, q, s, r, k, x.stride(0), q.stride(0), s.stride(0), zero if zero is not None else s,
        0 if zero is None else zero.numel(),
        FP8_MAX=fp8_max(dtype), GROUP=FP8_BLOCK, GROUPS_PER_PROG=per_prog, ZBLOCK=zblock, TRIGGER=trigger,
        num_warps=4,
    )
    return q, s
