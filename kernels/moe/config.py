"""Block sizes of the fused MoE stages, picked from the shapes (no autotuning at call time).

Small M is memory bound: small BLOCK_M (16, the least `tl.dot` takes), deep pipelines, and BLOCK_N cut until
the grid has about two programs per SM, so every SM streams weights. Large M is compute bound: 64 or 128
rows per tile and wider tiles. BLOCK_K equals the scale group where the format has one (128), so a K step
needs one scale per row or column.
"""

from __future__ import annotations

from zoe_kernels.platform import has_native_mx, interpreting

TARGET_PROGRAMS = 264  # about two programs per SM on a 132-SM H200 (and 256-CU MI355X gets about one)


def block_m_for(m: int, top_k: int, num_experts: int) -> int:
    """Rows per tile, from the expected edges per active expert."""
    edges = m * top_k
    per_expert = edges / max(1, min(num_experts, edges))
    if per_expert <= 16:
        return 16
    if per_expert <= 32:
        return 32
    return 64 if per_expert <= 96 else 128


def fp8_act_quant_for(block_m: int) -> bool:
    """fp8 runs w8a8 (activations quantized per token group) at every tile height. The w8a16 mode saves two
    launches but measured slower on the H200 at every M (DeepSeek-V3.2 M=1: 150 us against 112 us), since
    Hopper has no single e4m3 -> bf16 conversion (bench/kernels/results/raw/run2_moe_results.json)."""
    del block_m
    return True


def mx_native() -> bool:
    """mxfp4 through `tl.dot_scaled` only where the hardware scales natively; elsewhere Triton would emulate
    it less efficiently than the kernel's own dequantization."""
    return has_native_mx()


def stage_config(m: int, top_k: int, num_experts: int, n: int, k: int, fmt: str, *, gated: bool,
                 block_m: int | None = None) -> dict:
    """Launch parameters for one stage: n output columns (I for stage 1, H for stage 2), k reduction length."""
    bm = block_m or block_m_for(m, top_k, num_experts)
    edges = m * top_k
    active = min(num_experts, edges)
    tiles_m = active * -(-max(1, edges // max(1, active)) // bm)
    bk = 64 if fmt == "bf16" and bm >= 64 else 128
    if interpreting():
        # The interpreter pays per program and loop step: few, large tiles.
        return {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1}
    if bm >= 64:
        bn = 128
        warps = 8 if bm == 128 else 4
        stages = 3
        if gated and fmt != "bf16":
            bn = 64  # two accumulators (gate, up) plus the scaled partial product: keep registers in bounds
    else:
        bn = 64 if gated else 128
        while bn > 16 and tiles_m * -(-n // bn) < TARGET_PROGRAMS:
            bn //= 2
        warps = 4
        stages = 4 if fmt in ("fp8", "w4a16", "mxfp4") else 3
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}
