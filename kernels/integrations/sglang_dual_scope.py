"""SGLang's DeepSeek-V4 sparse decode attention, routed to zoe's paged CSA dual-scope decode.

SGLang 0.5.19 and 0.5.23 decode DeepSeek-V4 (`DeepseekV4AttnBackend._forward_attention`) with one FlashMLA call per
layer: the query against the sliding-window entries (`indices` + `topk_length` into the SWA pool) and the
CSA-selected compressed entries (`extra_indices_in_kvcache` + `extra_topk_length` into the C4/C128 pool),
with the attention sink, both pools in FlashMLA's packed FP8 "V4" layout (584 bytes a token, see
`zoe_kernels.csa.paged_dual_scope`). zoe replaces that call, per platform:

- CUDA (0.5.23): `sglang.kernels.ops.attention.flash_mla_interface.flash_mla_with_kvcache`. The backend binds it
  when it is built (`functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=...)`), after
  SGLang's plugins ran, so the partial holds zoe's wrapper.
- ROCm (0.5.19 and 0.5.23): `sglang.srt.layers.attention.hip_flash_mla.flash_mla_with_kvcache_entrypoint(
  backend, **kwargs)`, which `deepseek_v4_backend_hip_radix` imports by name (0.5.23: when it is first
  imported, after the plugins ran; 0.5.19: inside each call).

Per call the wrapper takes zoe's path for a one-token-per-row sparse decode over V4 pools (q [B, 1, H, 512],
d_v 512, fp8 caches of 584 bytes a token, no block table or descales) and returns `(out [B, 1, H, 512],
lse [B, 1, H])` (natural-log lse without the sink, as SGLang's own Triton decode returns it; the backend
uses only `out`). Everything else (V4.1 layouts, dense calls, several query tokens a row) goes to SGLang's
own kernel, with the reason counted. Under CUDA graphs the counts are of captured or eager calls, not
replays.
"""

from __future__ import annotations

from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec
from zoe_kernels.integrations.report import KernelReporter, log
from zoe_kernels.integrations.support import ranges
CUDA_TARGET = "sglang.kernels.ops.attention.flash_mla_interface:flash_mla_with_kvcache"
CUDA_PARAMS = (
    "q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata", "num_splits",
    "softmax_scale", "causal", "descale_q", "descale_k", "is_fp8_kvcache", "indices", "attn_sink",
    "extra_k_cache", "extra_indices_in_kvcache", "topk_length", "extra_topk_length", "kv_format", "use_legacy",
)  # fmt: skip
HIP_TARGET = "sglang.srt.layers.attention.hip_flash_mla:flash_mla_with_kvcache_entrypoint"
HIP_PARAMS = ("backend", "kwargs")
KERNEL = "csa_dual_scope"


def engine_path_reason(kw: dict) -> str | None:
    """None when zoe's paged kernel covers this FlashMLA call (keyword arguments), else why not."""
    from zoe_kernels.csa.paged_dual_scope import BYTES_PER_TOKEN, D_QK

    q, k_cache, indices = kw.get("q"), kw.get("k_cache"), kw.get("indices")
    if indices is None or kw.get("block_table") is not None or kw.get("cache_seqlens") is not None:
        return "dense"
    if not kw.get("is_fp8_kvcache", False) or kw.get("descale_q") is not None or kw.get("kv_format") is not None:
        return "format"
    caches = [k_cache] + ([kw["extra_k_cache"]] if kw.get("extra_k_cache") is not None else [])
    if any(c.dim() != 4 or c.shape[-1] != BYTES_PER_TOKEN or c.element_size() != 1 for c in caches):
        return "layout"  # V4.1 (528 / 288 bytes a token) and other formats
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[-1] != D_QK or kw.get("head_dim_v") != D_QK:
        return "shape"
    if indices.dim() != 3 or indices.shape[1] != 1:
        return "shape"
    extra = kw.get("extra_indices_in_kvcache")
    if kw.get("extra_k_cache") is not None and (extra is None or extra.dim() != 3 or extra.shape[1] != 1):
        return "shape"
    sink = kw.get("attn_sink")
    if sink is not None and tuple(sink.shape) != (q.shape[2],):
        return "shape"
    if q.element_size() != 2:
        return "dtype"
    if kw.get("inv_rope") is not None:  # ROCm: the model's inverse RoPE folded into the output
        return "inv_rope"
    return None


def run_zoe(kw: dict, fp8_dtype):
    """The FlashMLA call's result from zoe's kernel: (out [B, 1, H, 512], lse [B, 1, H])."""
    from zoe_kernels.csa.paged_dual_scope import paged_dual_scope_decode

    extra = kw.get("extra_k_cache")
    out, lse = paged_dual_scope_decode(
        kw["q"][:, 0], kw["k_cache"], kw["indices"][:, 0], kw.get("topk_length"),
        extra, kw["extra_indices_in_kvcache"][:, 0] if extra is not None else None,
        kw.get("extra_topk_length") if extra is not None else None,
        sink=kw.get("attn_sink"), sm_scale=kw.get("softmax_scale"), fp8_dtype=fp8_dtype,
    )  # fmt: skip
    return out.unsqueeze(1), lse.unsqueeze(1)


class _Router:
    """Per call: zoe's kernel or SGLang's own, counted; a raising zoe kernel sends the process back for good."""

    def __init__(self, reporter: KernelReporter, target: str, fp8_dtype: Callable[[], object]):
        self.reporter, self.target, self.fp8_dtype = reporter, target, fp8_dtype
        self.broken: str | None = None

    def __call__(self, kw: dict, original: Callable[[], tuple]):
        why = "zoe_error" if self.broken else engine_path_reason(kw)
        if why is None:
            try:
                result = run_zoe(kw, self.fp8_dtype())
            except Exception as e:  # serve on SGLang's path rather than fail the request; say so loudly
                log.exception("%s: zoe's kernel raised; this process stays on SGLang's decode attention", KERNEL)
                self.broken = repr(e)
                self.reporter.fallback(KERNEL, self.target, "runtime_error", repr(e))
                why = "zoe_error"
            else:
                self.reporter.count(KERNEL, "zoe")
                return result
        self.reporter.count(KERNEL, "engine", why)
        return original()


def _cuda_wrap(reporter: KernelReporter) -> Callable[[Callable], Callable]:
    import torch

    route = _Router(reporter, CUDA_TARGET, lambda: torch.float8_e4m3fn)

    def wrap(original: Callable) -> Callable:
        def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                                   num_splits=None, softmax_scale=None, causal=False, descale_q=None, descale_k=None,
                                   is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None,
                                   extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None,
                                   kv_format=None, *, use_legacy=True):  # fmt: skip
            kw = dict(q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens,
                      head_dim_v=head_dim_v, tile_scheduler_metadata=tile_scheduler_metadata, num_splits=num_splits,
                      softmax_scale=softmax_scale, causal=causal, descale_q=descale_q, descale_k=descale_k,
                      is_fp8_kvcache=is_fp8_kvcache, indices=indices, attn_sink=attn_sink,
                      extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices_in_kvcache,
                      topk_length=topk_length, extra_topk_length=extra_topk_length, kv_format=kv_format)  # fmt: skip
            return route(kw, lambda: original(**kw, use_legacy=use_legacy))

        return flash_mla_with_kvcache

    return wrap


def _hip_wrap(reporter: KernelReporter) -> Callable[[Callable], Callable]:
    def wrap(original: Callable) -> Callable:
        import torch

        # the pool's fp8 flavour is hip_flash_mla's FP8_DTYPE: e4m3fnuz on gfx942, e4m3fn on gfx950
        fp8 = getattr(original, "__globals__", {}).get("FP8_DTYPE", torch.float8_e4m3fn)
        route = _Router(reporter, HIP_TARGET, lambda: fp8)

        def flash_mla_with_kvcache_entrypoint(backend, **kwargs):
            return route(kwargs, lambda: original(backend=backend, **kwargs))

        return flash_mla_with_kvcache_entrypoint

    return wrap


def sglang_platform() -> str:
    """"rocm" on a HIP build of torch, else "cuda" (the platform whose SGLang entry points the hook patches)."""
    import torch

    return "rocm" if torch.version.hip is not None else "cuda"


def csa_dual_scope_specs(reporter: KernelReporter, platform: str | None = None) -> list[PatchSpec]:
    """The patch for `platform` (default: the one this process runs on; CUDA: FlashMLA's interface, ROCm: the
    HIP entry point), one per verified release range (none where its target is missing: `support.GAPS`)."""
    import zoe_kernels.csa.paged_dual_scope  # noqa: F401  (a missing kernel module is a fallback, not a crash later)

    platform = platform or sglang_platform()
    if platform == "rocm":
        target, params, wrap = HIP_TARGET, HIP_PARAMS, _hip_wrap(reporter)
    else:
        target, params, wrap = CUDA_TARGET, CUDA_PARAMS, _cuda_wrap(reporter)
    return [PatchSpec(KERNEL, target, params, versions, wrap) for versions in ranges(KERNEL, "sglang", platform)]
