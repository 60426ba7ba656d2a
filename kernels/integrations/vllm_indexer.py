"""vLLM's DSA lightning-indexer logits (prefill, non-paged), routed to zoe's lightning indexer.

vLLM 0.29 and 0.32 compute the indexer's prefill logits
`logits[i, j] = sum_h w[i, h] * relu((q[i, h] . k[j]) * k_scale[j])` for keys `ks[i] <= j < ke[i]` with
- CUDA: `fp8_fp4_mqa_logits((q, q_scale), (k, k_scale), weights, ks, ke, clean_logits)` (DeepGEMM), called
  by name from `vllm.model_executor.layers.sparse_attn_indexer`;
- ROCm: `rocm_fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)` (AITER or a torch fallback) in
  `vllm.v1.attention.ops.rocm_aiter_mla_sparse`.
Both return float32 `[M, N]`. zoe's path takes FP8 e4m3 q (the per-token q scale already folded into the
weights, `q_scale is None`) and writes -inf outside [ks, ke), which the row top-k that follows ignores
either way. FP4 q/k (`q_scale` given) and the paged decode logits stay on vLLM's path.

On CUDA the prefill row top-k that follows (`vllm._custom_ops.top_k_per_row_prefill`, which writes
positions relative to `ks`, -1 padded) goes to zoe's exact top-k (`zoe_kernels.csa.topk.topk_ranges`, the
kernel behind `zoe_kernels.dsa.indexer_topk`, same convention).
"""

from __future__ import annotations

from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec
from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.support import ranges
CUDA_TARGET = "vllm.model_executor.layers.sparse_attn_indexer:fp8_fp4_mqa_logits"
CUDA_TOPK_TARGET = "vllm._custom_ops:top_k_per_row_prefill"
TOPK_PARAMS = ("logits", "cu_seqlen_ks", "cu_seqlen_ke", "raw_topk_indices", "num_rows", "stride0", "stride1",
               "topk_tokens")  # fmt: skip
ROCM_TARGET = "vllm.v1.attention.ops.rocm_aiter_mla_sparse:rocm_fp8_mqa_logits"
CUDA_PARAMS = ("q", "kv", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "clean_logits")
ROCM_PARAMS = ("q", "kv", "weights", "cu_seqlen_ks", "cu_seqlen_ke")


def _zoe_logits(q, k, k_scale, weights, ks, ke):
    from zoe_kernels.dsa.indexer import lightning_indexer

    return lightning_indexer(q, weights, k, k_scale.reshape(-1), ks, ke)


def _is_fp8(t) -> bool:
    import torch

    return t.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _cuda_wrap(reporter: KernelReporter) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
            q_values, q_scale = q
            k, k_scale = kv
            if q_scale is None and _is_fp8(q_values) and _is_fp8(k):
                reporter.count("lightning_indexer", "zoe")
                return _zoe_logits(q_values, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke)
            reporter.count("lightning_indexer", "engine", "fp4")
            return original(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)

        return fp8_fp4_mqa_logits

    return wrap


def _topk_wrap(reporter: KernelReporter) -> Callable[[Callable], Callable]:
    from zoe_kernels.csa.topk import topk_ranges

    def wrap(original: Callable) -> Callable:
        def top_k_per_row_prefill(logits, cu_seqlen_ks, cu_seqlen_ke, raw_topk_indices, num_rows, stride0, stride1,
                                  topk_tokens):  # fmt: skip
            import torch

            if logits.dtype == torch.float32 and logits.stride(1) == 1 and num_rows > 0:
                idx = topk_ranges(logits[:num_rows], cu_seqlen_ks[:num_rows], cu_seqlen_ke[:num_rows], topk_tokens)
                raw_topk_indices[:num_rows, :topk_tokens].copy_(idx)
                reporter.count("lightning_indexer", "zoe")
                return None
            reporter.count("lightning_indexer", "engine", "layout")
            return original(logits, cu_seqlen_ks, cu_seqlen_ke, raw_topk_indices, num_rows, stride0, stride1,
                            topk_tokens)  # fmt: skip

        return top_k_per_row_prefill

    return wrap


def _rocm_wrap(reporter: KernelReporter) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        def rocm_fp8_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke):
            k, k_scale = kv
            if _is_fp8(q) and _is_fp8(k):
                reporter.count("lightning_indexer", "zoe")
                return _zoe_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke)
            reporter.count("lightning_indexer", "engine", "dtype")
            return original(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke)

        return rocm_fp8_mqa_logits

    return wrap


def lightning_indexer_specs(platform: str, reporter: KernelReporter) -> list[PatchSpec]:
    """The patches for `platform`, one set per verified release range; none on the CPU (vLLM runs no DSA
    indexer there)."""
    import zoe_kernels.dsa.indexer  # noqa: F401  (a missing kernel module is a fallback, not a crash at call time)

    specs: list[PatchSpec] = []
    for versions in ranges("lightning_indexer", "vllm", platform):
        if platform == "cuda":
            specs += [
                PatchSpec("lightning_indexer", CUDA_TARGET, CUDA_PARAMS, versions, _cuda_wrap(reporter)),
                PatchSpec("lightning_indexer", CUDA_TOPK_TARGET, TOPK_PARAMS, versions, _topk_wrap(reporter)),
            ]
        elif platform == "rocm":
            specs.append(PatchSpec("lightning_indexer", ROCM_TARGET, ROCM_PARAMS, versions, _rocm_wrap(reporter)))
    return specs
