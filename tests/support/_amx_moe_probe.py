"""Runs vLLM's AMX MoE kernel once on a tiny layer (run with vLLM's Python by `vllm_server.amx_moe_faults`).

Exits 0 when the kernel ran or torch reports no AMX; a CPU that reports AMX without the tile state enabled
kills this process with SIGILL, which is what the caller looks for.
"""

import torch

import vllm._custom_ops as ops

if torch.cpu._is_amx_tile_supported():
    experts, hidden, inter, tokens, top_k = 4, 64, 32, 4, 2
    w13 = ops.cpu_prepack_moe_weight(torch.randn(experts, 2 * inter, hidden, dtype=torch.bfloat16) * 0.1, "amx")
    w2 = ops.cpu_prepack_moe_weight(torch.randn(experts, hidden, inter, dtype=torch.bfloat16) * 0.1, "amx")
    out = torch.empty(tokens, hidden, dtype=torch.bfloat16)
    ops.cpu_fused_moe(out, torch.randn(tokens, hidden, dtype=torch.bfloat16), w13, w2, None, None,
                      torch.rand(tokens, top_k), torch.randint(0, experts, (tokens, top_k), dtype=torch.int32),
                      "silu", "amx")
    print("amx moe ran")
else:
    print("no amx reported")
