"""Float64 PyTorch references for the CSA kernels (top-K selection and dual-scope decode)."""

from __future__ import annotations

import torch


def topk_ranges_reference(scores: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k of each row's [starts, ends): positions relative to starts, ascending, -1 padded.

    Tie rule: larger value first, then lower position (a stable sort on the value, descending)."""
    rows = scores.shape[0]
    out = torch.full((rows, k), -1, dtype=torch.int32)
    for r in range(rows):
        lo, hi = int(starts[r]), int(ends[r])
        lo, hi = max(lo, 0), min(hi, scores.shape[1])
        if hi <= lo:
            continue
        vals = scores[r, lo:hi].detach().cpu().double()
        order = torch.sort(vals, descending=True, stable=True).indices[:k]
        chosen = torch.sort(order).values
        out[r, : chosen.numel()] = chosen.to(torch.int32)
    return out


def topk_reference(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512) -> torch.Tensor:
    """Reference for `zoe_kernels.csa.topk`: entry j of row b valid for j < lengths[b]."""
    return topk_ranges_reference(scores, torch.zeros_like(lengths), lengths, k)
