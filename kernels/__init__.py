"""zoe's Triton kernels, imported as `zoe_kernels`: `moe` (fused MoE: align, gate+up SwiGLU, down + top-k
combine; bf16, fp8 block-scaled, w4a16, mxfp4), `dsa`, `csa`, `dispatch` (by M, from measured tables),
`platform` (ROCm vs CUDA), `integrations` (engine plug-ins). Importing the package loads no kernel."""
