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


def _dequant(t: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    t = t.detach().cpu().double()
    return t * scale.detach().cpu().double()[..., None] if scale is not None else t


def dual_scope_decode_reference(q, win_k, win_v, win_len, comp_k, comp_v, comp_idx, *, win_k_scale=None,
                                win_v_scale=None, comp_k_scale=None, comp_v_scale=None, sink=None,
                                sm_scale=None) -> torch.Tensor:
    """Float64 reference of `zoe_kernels.csa.dual_scope_decode` (same arguments); returns float64 [B, H, D]."""
    bsz, heads, d = q.shape
    scale = sm_scale if sm_scale is not None else d ** -0.5
    wk, wv = _dequant(win_k, win_k_scale), _dequant(win_v, win_v_scale)
    ck, cv = _dequant(comp_k, comp_k_scale), _dequant(comp_v, comp_v_scale)
    qd = q.detach().cpu().double()
    out = torch.zeros((bsz, heads, d), dtype=torch.float64)
    for b in range(bsz):
        n_win = min(int(win_len[b]), wk.shape[1])
        sel = comp_idx[b].cpu().long()
        sel = sel[sel >= 0]
        keys = torch.cat([wk[b, :n_win], ck[b, sel]])
        vals = torch.cat([wv[b, :n_win], cv[b, sel]])
        logits = qd[b] @ keys.T * scale  # [H, E]
        if sink is not None:
            logits = torch.cat([logits, sink.detach().cpu().double()[:, None]], dim=1)
            vals = torch.cat([vals, torch.zeros(1, d, dtype=torch.float64)])
        if logits.shape[1] == 0:
            continue
        out[b] = torch.softmax(logits, dim=1) @ vals
    return out
