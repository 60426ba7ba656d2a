"""Float64 PyTorch references for the DSA lightning indexer and its top-k."""

from __future__ import annotations

import torch

from zoe_kernels.csa.reference import topk_ranges_reference


def lightning_indexer_reference(q_fp8: torch.Tensor, weights: torch.Tensor, k_fp8: torch.Tensor,
                                k_scale: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
    """logits[i, j] = sum_h w[i,h] * relu((q[i,h] . k[j]) * k_scale[j]) inside [ks[i], ke[i]), else -inf.

    Computed in float64 on the CPU from the dequantized fp8 values; returned as float64 [M, N]."""
    q = q_fp8.detach().cpu().double()
    k = k_fp8.detach().cpu().double()
    w = weights.detach().cpu().double()
    sc = k_scale.detach().cpu().double()
    scores = torch.einsum("mhd,nd->mhn", q, k) * sc[None, None, :]
    logits = (scores.clamp_min(0) * w[:, :, None]).sum(dim=1)
    cols = torch.arange(k.shape[0])
    valid = (cols[None, :] >= ks.cpu()[:, None].long()) & (cols[None, :] < ke.cpu()[:, None].long())
    return logits.masked_fill(~valid, float("-inf"))


def indexer_topk_reference(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, k: int = 2048) -> torch.Tensor:
    """Top-k positions relative to ks, ascending, -1 padded; ties: larger logit, then lower position."""
    return topk_ranges_reference(logits, ks, ke, k)
