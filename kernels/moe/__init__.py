"""Fused Mixture-of-Experts kernels: `fused_moe` (Triton), `fallback_moe` (PyTorch), formats, references."""

from zoe_kernels.moe.fallback import fallback_moe
from zoe_kernels.moe.formats import FORMATS, dequantize_weights, quantize_weights
from zoe_kernels.moe.fused_moe import fused_moe

__all__ = ["FORMATS", "dequantize_weights", "fallback_moe", "fused_moe", "quantize_weights"]
