"""vLLM's DSA lightning-indexer logits (prefill, non-paged), routed to zoe's lightning indexer.

vLLM 0.29, 0.32 and 0.33 compute the indexer's prefill logits
`logits[i, j] = sum_h w[i, h] * relu((q[i, h] . k[j]) * k_scale[j])` for keys `ks[i] <= j < ke[i]` with
- CUDA: `fp8_fp4_mqa_logits` (DeepGEMM), called by name from `vllm.model_executor.layers.sparse_attn_indexer`:
  0.29 and 0.32 `((q, q_scale), (k, k_scale), weights, ks, ke, clean_logits)` returning float32 `[M, N]`;
  0.33 `((q, q_scale), (k, k_scale), weights, ks, ke, max_seqlen_k)` returning row-compressed logits
  `[M, max_seqlen_k]` (row i holds keys ks[i] .. ke[i]-1 from column 0; columns past ke[i]-ks[i] are not read);
- ROCm: `rocm_fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)` (AITER or a torch fallback) in
  `vllm.v1.attention.ops.rocm_aiter_mla_sparse`, float32 `[M, N]` in all three.
zoe's path takes FP8 e4m3 q with float32 k scales (the per-token q scale already folded into the weights,
`q_scale is None`) and writes -inf outside [ks, ke), which the row top-k that follows ignores either way; the
compressed form is gathered from zoe's `[M, N]` logits. FP4 q/k, MX-scaled inputs (0.33 on SM100: unit UE8M0
q scales, int32 k scales) and the paged decode logits stay on vLLM's path.

On CUDA the prefill row top-k that follows (`vllm._custom_ops.top_k_per_row_prefill`, which writes
positions relative to its row starts, -1 padded; 0.33 passes zeros and the row lengths for compressed logits)
goes to zoe's exact top-k (`zoe_kernels.csa.topk.topk_ranges`, the kernel behind `zoe_kernels.dsa.indexer_topk`,
same convention).
"""

from __future__ import annotations

from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec
from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.support import ranges, release

CUDA_TARGET = "vllm.model_executor.layers.sparse_attn_indexer:fp8_fp4_mqa_logits"
CUDA_TOPK_TARGET = "vllm._custom_ops:top_k_per_row_prefill"
TOPK_PARAMS = ("logits", "cu_seqlen_ks", "cu_seqlen_ke", "raw_topk_indices", "num_rows", "stride0", "stride1",
               "topk_tokens")  # fmt: skip
ROCM_TARGET = "vllm.v1.attention.ops.rocm_aiter_mla_sparse:rocm_fp8_mqa_logits"
CUDA_PARAMS = ("q", "kv", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "clean_logits")
CUDA_COMPRESSED_PARAMS = ("q", "kv", "weights", "cu_seqlen_ks", "cu_seqlen_ke", "max_seqlen_k")
COMPRESSED_SINCE = "0.33.0"
"""The first vLLM release whose `fp8_fp4_mqa_logits` returns row-compressed logits."""
ROCM_PARAMS = ("q", "kv", "weights", "cu_seqlen_ks", "cu_seqlen_ke")


def _zoe_logits(q, k, k_scale, weights, ks, ke):
    from zoe_kernels.dsa.indexer import lightning_indexer

    return lightning_indexer(q, weights, k, k_scale.reshape(-1), ks, ke)


def _is_fp8(t) -> bool:
    import torch

    return t.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def compress_rows(logits, ks, width: int):
    """Row-compressed logits [M, width] from full ones [M, N]: out[i, c] = logits[i, ks[i] + c] (columns past
    N read column N-1; the caller reads only c < ke[i] - ks[i])."""
    import torch

    m, n = logits.shape
    if m == 0 or n == 0 or width == 0:
        return logits.new_full((m, width), float("-inf"))
    cols = ks.to(device=logits.device, dtype=torch.int64).unsqueeze(1) + torch.arange(width, device=logits.device)
    return logits.gather(1, cols.clamp_(max=n - 1))


def _zoe_takes(q_values, q_scale, k, k_scale) -> str | None:
    """Why zoe's logits cannot take a CUDA call (None when they can)."""
    import torch

    if not (_is_fp8(q_values) and _is_fp8(k)):
        return "fp4"
    if q_scale is not None or k_scale.dtype != torch.float32:
        return "mx_scales"
    return None


def _cuda_wrap(reporter: KernelReporter, compressed: bool = False) -> Callable[[Callable], Callable]:
    """The CUDA logits replacement: 0.29's and 0.32's form, or with `compressed` 0.33's (the engine passes the
    last argument by name in some releases, so each form keeps its parameter names)."""

    def wrap(original: Callable) -> Callable:
        def logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, last):
            why = _zoe_takes(*q, *kv)
            if why is None:
                reporter.count("lightning_indexer", "zoe")
                full = _zoe_logits(q[0], kv[0], kv[1], weights, cu_seqlen_ks, cu_seqlen_ke)
                return compress_rows(full, cu_seqlen_ks, int(last)) if compressed else full
            reporter.count("lightning_indexer", "engine", why)
            return original(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, last)

        if compressed:

            def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
                return logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)

        else:

            def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
                return logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)

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
            compressed = release(versions[0]) >= release(COMPRESSED_SINCE)
            params = CUDA_COMPRESSED_PARAMS if compressed else CUDA_PARAMS
            specs += [
                PatchSpec("lightning_indexer", CUDA_TARGET, params, versions, _cuda_wrap(reporter, compressed)),
                PatchSpec("lightning_indexer", CUDA_TOPK_TARGET, TOPK_PARAMS, versions, _topk_wrap(reporter)),
            ]
        elif platform == "rocm":
            specs.append(PatchSpec("lightning_indexer", ROCM_TARGET, ROCM_PARAMS, versions, _rocm_wrap(reporter)))
    return specs
