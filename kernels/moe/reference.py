"""float32 PyTorch references of the fused MoE (the correctness oracle of tests and benches)."""

from __future__ import annotations

import torch

from zoe_kernels.moe.formats import dequantize_act_fp8, dequantize_weights, quantize_act_fp8_torch


def _fp8_roundtrip(x: torch.Tensor) -> torch.Tensor:
    q, s = quantize_act_fp8_torch(x)
    return dequantize_act_fp8(q, s)


def fused_moe_reference(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    fmt: str = "bf16",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    emulate_kernel_rounding: bool = True,
    fp8_act_quant: bool = True,
) -> torch.Tensor:
    """out[t] = sum_s w[t,s] * W2[e] (silu(Wg[e] x[t]) * (Wu[e] x[t])) in float32, e = topk_ids[t, s].

    Weights in `fmt` are dequantized exactly. With `emulate_kernel_rounding` the reference also rounds the
    SwiGLU output to the activation dtype, and for fmt "fp8" with `fp8_act_quant` (the kernel's w8a8 mode)
    quantizes x and that intermediate per token group of 128 as the kernel does, so the comparison measures
    accumulation error alone.
    Ids outside [0, E) contribute nothing. Returns float32 [M, H].
    """
    m, h = hidden_states.shape
    e, two_i = w13.shape[:2]
    i = two_i // 2
    x = hidden_states.float()
    quant_acts = fmt == "fp8" and emulate_kernel_rounding and fp8_act_quant
    if quant_acts:
        x = _fp8_roundtrip(x)
    out = torch.zeros((m, h), dtype=torch.float32, device=hidden_states.device)
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    top_k = topk_ids.shape[1]
    for expert in torch.unique(flat_ids).tolist():
        if not 0 <= expert < e:
            continue
        edges = (flat_ids == expert).nonzero().squeeze(1)
        tokens = edges // top_k
        s13 = None if w13_scale is None else w13_scale[expert : expert + 1]
        s2 = None if w2_scale is None else w2_scale[expert : expert + 1]
        w13_e = dequantize_weights(w13[expert : expert + 1], s13, fmt, h)[0]
        w2_e = dequantize_weights(w2[expert : expert + 1], s2, fmt, i)[0]
        gate_up = x[tokens] @ w13_e.T
        inter = torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]
        if emulate_kernel_rounding:
            inter = inter.to(hidden_states.dtype).float()
            if quant_acts:
                inter = _fp8_roundtrip(inter)
        out.index_add_(0, tokens, (inter @ w2_e.T) * flat_w[edges, None])
    return out
