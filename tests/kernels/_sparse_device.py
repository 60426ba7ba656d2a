"""Device choice for the sparse-attention kernel tests: CUDA when present, else Triton's CPU interpreter.

Imported before any `zoe_kernels` module so that TRITON_INTERPRET is set before `@triton.jit` runs."""

import os

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if ON_GPU else "cpu"
FP8 = torch.float8_e4m3fn
