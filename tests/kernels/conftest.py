"""Runs before any kernel test module is imported: without a GPU, Triton's CPU interpreter must be on before the
first `triton.language` import (zoe_kernels.platform imports Triton's CUDA extras, whose @triton.jit helpers are
bound to the compiled or the interpreted runtime when they are first imported)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
