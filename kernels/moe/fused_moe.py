"""`fused_moe`: the routed-expert MLP of a Mixture-of-Experts layer in two or three Triton launches.

    out[t] = sum_{s < k} topk_weights[t, s] * W2[e] (silu(W_gate[e] x[t]) * (W_up[e] x[t])),  e = topk_ids[t, s]

with vLLM's `fused_experts` layout: w13 [E, 2I, H] (rows: gate then up), w2 [E, H, I]. Launches: align
(bucket edges by expert, `align.py`), stage 1 (gate+up GEMM, SwiGLU epilogue) and stage 2 (down GEMM,
top-k weighted combine epilogue), `grouped_gemm.py`; fp8 (w8a8) adds two activation-quantization launches.
At M=1 a format in `config.DOT_M1_TILES` (fp8) drops align (one tile per edge, experts read
from topk_ids) and the accumulator's memset (stage 1 zeroes it), splits stage 2 along K, and (with top-k > 1)
quantizes the intermediate in stage 1 (the last program of a 128-column group does it): four launches; stage 1 also
prefetches the first of stage 2's weights into L2 (`config.dot_m1_l2_prefetch_bytes`: a share of the target's L2);
stage 1 starts as a programmatic dependent of x's quantization (`config.DOT_M1_PDL`).
The 4-bit formats' 128-row tiles run each stage in two launches (`config.FOUR_BIT_HALF_TILES`).
With few tokens per expert (decode) the GEMV path (`gemv.py`) runs instead: two launches, no align, no
activation quantization (`config.use_gemv` picks by the expected edges per expert, measured per format).
With many tokens the 4-bit formats may take the dequant path (`dequant.py`: the weights dequantized into a
workspace, then the float tiles) where `dispatch.moe_path_for` measured it faster on the device.
"""

from __future__ import annotations

from typing import Callable

import torch

from zoe_kernels.moe.act_quant import quantize_act_fp8
from zoe_kernels.moe.act_quant_mx import quantize_act_mxfp8
from zoe_kernels.moe.align import moe_align
from zoe_kernels.moe.config import (
    FOUR_BIT_FORMATS,
    block_m_for,
    dot_m1_configs,
    dot_m1_l2_prefetch_bytes,
    dot_m1_pdl,
    dot_m1_quant_in_stage1,
    fp8_act_quant_for,
    gemv_config,
    mx_native,
    stage_config,
    use_gemv,
)
from zoe_kernels.moe.dequant import dequant_moe
from zoe_kernels.moe.formats import FORMATS, FP8_BLOCK, INT4_GROUP, MX_GROUP
from zoe_kernels.moe.gemv import gemv_down_combine, gemv_gate_up
from zoe_kernels.moe.grouped_gemm import KernelFormat, TileRows, down_combine, gate_up_swiglu, kernel_format
from zoe_kernels.platform import device_name, fp8_dtype


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _dequant_measured_faster(m: int, fmt: str, dev: torch.device) -> bool:
    """Whether the crossover table measured the dequant path faster at this M on this GPU (never on the CPU)."""
    if dev.type != "cuda":
        return False
    from zoe_kernels.dispatch import moe_path_for  # the table's module imports this package

    return moe_path_for(m, fmt, device_name(dev)) == "dequant"


def _tile_launches(cfg: dict) -> tuple[dict, ...]:
    """A stage's launches: one, or with `HALF_TILES` two (`grouped_gemm.TileRows`): align's tiles with an edge in
    their upper half at BLOCK_M rows, then the others' lower halves at BLOCK_M / 2 rows."""
    if not cfg.get("HALF_TILES"):
        return (cfg,)
    return (cfg | {"TILE_ROWS": TileRows.UPPER_USED},
            cfg | {"TILE_ROWS": TileRows.LOWER_HALF, "BLOCK_M": cfg["BLOCK_M"] // 2})


def check_moe_args(hidden_states, w13, w2, topk_weights, topk_ids, fmt, w13_scale, w2_scale) -> tuple[int, int]:
    """Validate shapes and dtypes; returns (I, top_k). Raises ValueError naming the argument."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be [M, H], got shape {tuple(hidden_states.shape)}")
    if not hidden_states.is_floating_point() or hidden_states.element_size() < 2:
        raise ValueError(f"hidden_states must be fp32/fp16/bf16, got {hidden_states.dtype}")
    m, h = hidden_states.shape
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError("w13 must be [E, 2I, H] and w2 [E, H, I]")
    e, two_i = w13.shape[:2]
    if two_i % 2:
        raise ValueError(f"w13 must have 2I rows (gate then up), got {two_i}")
    i = two_i // 2
    packed = fmt in ("w4a16", "mxfp4")
    kh, ki = (_cdiv(h, 2), _cdiv(i, 2)) if packed else (h, i)
    if w13.shape[2] != kh or tuple(w2.shape) != (e, h, ki):
        raise ValueError(f"weights do not match hidden size {h} in format {fmt}: w13 {tuple(w13.shape)}, "
                         f"w2 {tuple(w2.shape)}; expected w13 [{e}, {two_i}, {kh}] and w2 [{e}, {h}, {ki}]")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != m or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids and topk_weights must both be [M={m}, k], got {tuple(topk_ids.shape)} "
                         f"and {tuple(topk_weights.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    expected_scales = {
        "fp8": ((e, _cdiv(two_i, FP8_BLOCK), _cdiv(h, FP8_BLOCK)), (e, _cdiv(h, FP8_BLOCK), _cdiv(i, FP8_BLOCK))),
        "w4a16": ((e, two_i, _cdiv(h, INT4_GROUP)), (e, h, _cdiv(i, INT4_GROUP))),
        "mxfp4": ((e, two_i, _cdiv(h, MX_GROUP)), (e, h, _cdiv(i, MX_GROUP))),
    }
    if fmt == "bf16":
        if w13.dtype != hidden_states.dtype or w2.dtype != hidden_states.dtype:
            raise ValueError(f"fmt bf16 takes weights in the activation dtype {hidden_states.dtype}, "
                             f"got {w13.dtype} and {w2.dtype}")
    else:
        for name, scale, shape in (("w13_scale", w13_scale, expected_scales[fmt][0]),
                                   ("w2_scale", w2_scale, expected_scales[fmt][1])):
            if scale is None or tuple(scale.shape) != shape:
                got = None if scale is None else tuple(scale.shape)
                raise ValueError(f"fmt {fmt} needs {name} of shape {shape}, got {got}")
        if fmt == "fp8" and (w13.element_size() != 1 or not w13.is_floating_point()):
            raise ValueError(f"fmt fp8 takes fp8 weights, got {w13.dtype}")
        if packed and (w13.dtype != torch.uint8 or w2.dtype != torch.uint8):
            raise ValueError(f"fmt {fmt} takes uint8 weights holding two 4-bit values each, got {w13.dtype}")
        if fmt == "mxfp4" and (w13_scale.dtype != torch.uint8 or w2_scale.dtype != torch.uint8):
            raise ValueError("fmt mxfp4 takes e8m0 scales as uint8 (use .view(torch.uint8))")
    return i, topk_ids.shape[1]


def fused_moe(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    fmt: str = "bf16",
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    block_m: int | None = None,
    fp8_act_quant: bool | None = None,
    alloc: Callable[..., torch.Tensor] = torch.empty,
    path: str | None = None,
) -> torch.Tensor:
    """Routed-expert MLP; returns [M, H] in the dtype of `hidden_states`.

    hidden_states [M, H] bf16/fp16/fp32; w13 [E, 2I, H] and w2 [E, H, I] in `fmt` (see `formats.py` for
    the layouts and scales: "bf16" means weights in the activation dtype, "fp8" 128x128 block scales with
    per-token-group activation quantization, "w4a16" int4 with groups of 128, "mxfp4" e2m1 + e8m0 per 32, its dot
    path with the activations quantized to MXFP8 where `config.mx_native`, i.e. gfx950);
    topk_weights [M, k] float32; topk_ids [M, k] int32 (ids outside [0, E) contribute nothing).
    fmt "fp8" quantizes the activations (w8a8) when `fp8_act_quant` is true and keeps them in 16 bits with
    the weights upcast in registers (w8a16) when false; None takes `config.fp8_act_quant_for` (w8a8, the
    faster mode on the H200 at every M). `block_m` overrides the rows per tile; `alloc` allocates scratch
    (tests pass one that poisons). `path` forces "gemv" (small-M kernels, fp8 then always w8a16), "dot"
    (tiled `tl.dot` kernels) or, for the 4-bit formats, "dequant" (weights dequantized, then the float tiles);
    None picks "gemv" by `config.use_gemv`, else "dequant" where `dispatch.moe_path_for` says so for this device
    and M, else "dot"; `block_m` or `fp8_act_quant=True` ask for the dot path.
    """
    i, top_k = check_moe_args(hidden_states, w13, w2, topk_weights, topk_ids, fmt, w13_scale, w2_scale)
    m, h = hidden_states.shape
    e = w13.shape[0]
    dev, dtype = hidden_states.device, hidden_states.dtype
    if m == 0:
        return torch.zeros((0, h), dtype=dtype, device=dev)
    x = hidden_states.contiguous()
    topk_weights = topk_weights.float().contiguous()
    if path is None:
        path = "gemv" if block_m is None and not fp8_act_quant and use_gemv(m, top_k, e, fmt, i) else "dot"
        if path == "dot" and block_m is None and fmt in FOUR_BIT_FORMATS and _dequant_measured_faster(m, fmt, dev):
            path = "dequant"
    if path == "dequant":
        if fmt not in FOUR_BIT_FORMATS:
            raise ValueError(f"path 'dequant' takes the 4-bit formats {FOUR_BIT_FORMATS}, got {fmt!r}")
        return dequant_moe(x, w13, w2, topk_weights, topk_ids, fmt=fmt, w13_scale=w13_scale, w2_scale=w2_scale,
                           alloc=alloc)
    if path == "gemv":
        ids = topk_ids.contiguous()
        cfg2 = gemv_config(m, h, fmt, gated=False, top_k=top_k, k=i)
        # slots split over several programs (few tokens): they add into a float32 buffer that stage 1 zeroes
        split = min(cfg2["CHUNKS"], top_k) > 1
        out = alloc((m, h), dtype=torch.float32 if split else dtype, device=dev)
        inter = alloc((m * top_k, i), dtype=dtype, device=dev)
        gemv_gate_up(x, w13, w13_scale, inter, ids, fmt=fmt, cfg=gemv_config(m * top_k, i, fmt, gated=True, k=h),
                     zero=out if split else None)
        gemv_down_combine(inter, w2, w2_scale, out, topk_weights, ids, fmt=fmt, cfg=cfg2)
        return out.to(dtype) if out.dtype != dtype else out
    if path != "dot":
        raise ValueError(f"path must be 'gemv', 'dot', 'dequant' or None, got {path!r}")
    m1 = None if block_m is not None else dot_m1_configs(m, fmt, top_k, i)
    bm = block_m or (m1[0]["BLOCK_M"] if m1 else block_m_for(m, top_k, e, fmt))
    if fp8_act_quant is None:
        fp8_act_quant = fp8_act_quant_for(bm)
    kfmt = kernel_format(fmt, fp8_act_quant=fp8_act_quant, mx_native=mx_native())
    if m1:  # one tile per edge, stage 1 zeroes the accumulator (config.DOT_M1_TILES)
        cfg1, cfg2 = m1
        align = (topk_ids.reshape(-1).contiguous(), None, None)
    else:
        cfg1 = stage_config(m, top_k, e, i, h, fmt, gated=True, block_m=bm)
        cfg2 = stage_config(m, top_k, e, h, i, fmt, gated=False, block_m=bm)
        align = moe_align(topk_ids.contiguous(), e, bm)

    # fp8 at M=1 with top_k > 1 (config.DOT_M1_QUANT_IN_STAGE1): stage 1 writes the intermediate quantized (the last
    # program of each 128-column group quantizes it; x's quantization zeroes their counters): no quantization launch
    quant_inter = bool(m1) and top_k > 1 and kfmt == KernelFormat.FP8_W8A8 and dot_m1_quant_in_stage1()
    counts = None
    if quant_inter:
        groups = _cdiv(i, FP8_BLOCK)
        counts = alloc((m * top_k * groups,), dtype=torch.int32, device=dev)
    x_scale = None
    pdl = quant_inter and x.is_cuda and dot_m1_pdl()  # stage 1 a programmatic dependent of x's quantization
    if kfmt == KernelFormat.FP8_W8A8:
        x, x_scale = quantize_act_fp8(x, zero=counts, trigger=pdl)
    elif kfmt == KernelFormat.MXFP4_NATIVE:  # both operands of the scaled f8f6f4 MFMA in 8 bits or fewer
        x, x_scale = quantize_act_mxfp8(x)
    inter = alloc((m * top_k, i), dtype=dtype, device=dev)
    acc = quant_out = None
    if top_k > 1:
        acc = alloc((m, h), dtype=torch.float32, device=dev) if m1 else torch.zeros((m, h), dtype=torch.float32,
                                                                                   device=dev)
    if quant_inter:
        quant_out = (alloc((m * top_k, i), dtype=fp8_dtype(dev), device=dev),
                     alloc((m * top_k, groups), dtype=torch.float32, device=dev), counts)
    prefetch = None
    if m1 and dot_m1_l2_prefetch_bytes() > 0 and w2.is_contiguous():  # stage 2's first weights into L2
        prefetch = (w2, dot_m1_l2_prefetch_bytes())
    for cfg in _tile_launches(cfg1):
        gate_up_swiglu(x, x_scale, w13, w13_scale, inter, align, top_k=top_k, kfmt=kfmt, cfg=cfg,
                       zero=acc if m1 else None, quant_out=quant_out, prefetch=prefetch, pdl=pdl)

    inter_scale = None
    if quant_out is not None:
        inter, inter_scale = quant_out[0], quant_out[1]
    elif kfmt == KernelFormat.FP8_W8A8:
        inter, inter_scale = quantize_act_fp8(inter)
    elif kfmt == KernelFormat.MXFP4_NATIVE:
        inter, inter_scale = quantize_act_mxfp8(inter)
    if top_k == 1:
        out = torch.zeros((m, h), dtype=dtype, device=dev)
        for cfg in _tile_launches(cfg2):
            down_combine(inter, inter_scale, w2, w2_scale, out, topk_weights, align, top_k=1, kfmt=kfmt, cfg=cfg)
        return out
    for cfg in _tile_launches(cfg2):
        down_combine(inter, inter_scale, w2, w2_scale, acc, topk_weights, align, top_k=top_k, kfmt=kfmt, cfg=cfg)
    return acc if dtype == torch.float32 else acc.to(dtype)
