"""The fallback MoE that `dispatch.moe_impl_for` picks where zoe's kernel is slower: the best baseline
PyTorch offers for each format, with the same arguments and the same math as `fused_moe`.

- "bf16" on a CUDA/ROCm GPU: `torch._grouped_mm` over the edges sorted by expert (graph-capturable).
- everything else: a plain loop over the experts that received tokens, dequantizing each expert's weights
  (exact, host-synchronizing, slow; PyTorch has no grouped GEMM for block-scaled fp8, int4 or mxfp4).
"""

from __future__ import annotations

import torch

from zoe_kernels.moe.fused_moe import check_moe_args
from zoe_kernels.moe.reference import fused_moe_reference


def grouped_mm_available(device: torch.device) -> bool:
    """True when `torch._grouped_mm` can run on `device` (a GPU with torch >= 2.8)."""
    return device.type == "cuda" and hasattr(torch, "_grouped_mm")


def _sort_edges(topk_ids: torch.Tensor, num_experts: int):
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    # scatter_add, not bincount: bincount synchronizes with the host, which breaks graph capture
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat.clamp(0, num_experts - 1), torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return order, offs


def grouped_mm_moe(hidden_states, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """bf16 MoE through `torch._grouped_mm`: gather, grouped gate+up, SwiGLU, grouped down, weighted sum."""
    m, h = hidden_states.shape
    e, two_i = w13.shape[:2]
    i = two_i // 2
    top_k = topk_ids.shape[1]
    order, offs = _sort_edges(topk_ids, e)
    xs = hidden_states[order // top_k]
    gate_up = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
    inter = torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]
    y = torch._grouped_mm(inter, w2.transpose(1, 2), offs=offs)
    y = y.float() * topk_weights.reshape(-1)[order, None].float()
    out = torch.zeros((m, h), dtype=torch.float32, device=hidden_states.device)
    out.index_add_(0, order // top_k, y)
    return out.to(hidden_states.dtype)


def fallback_moe(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    fmt: str = "bf16",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `zoe_kernels.moe.fused_moe` (ids must lie in [0, E) for the grouped path)."""
    check_moe_args(hidden_states, w13, w2, topk_weights, topk_ids, fmt, w13_scale, w2_scale)
    if fmt == "bf16" and hidden_states.dtype == torch.bfloat16 and grouped_mm_available(hidden_states.device):
        return grouped_mm_moe(hidden_states, w13, w2, topk_weights, topk_ids)
    out = fused_moe_reference(hidden_states, w13, w2, topk_weights, topk_ids, fmt=fmt, w13_scale=w13_scale,
                              w2_scale=w2_scale, emulate_kernel_rounding=False)
    return out.to(hidden_states.dtype)
