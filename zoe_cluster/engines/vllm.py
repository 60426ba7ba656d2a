"""vLLM adapter: `vllm serve` argv/env from a recipe variant, and vLLM V1 /metrics parsing."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from zoe_cluster.engines.base import (EngineAdapter, EngineCommand, EngineStats, LaunchContext, kv_events_config,
                                      visible_devices_env)
from zoe_cluster.engines.metrics_text import engine_stats

if TYPE_CHECKING:  # recipes load only where a command is built
    from zoe_cluster.recipes import Recipe

# vLLM names the KV-cache dtype of FP8 storage "fp8"; "auto" follows the model dtype.
_KV_DTYPE = {"fp8": "fp8", "bf16": "bfloat16", "auto": "auto"}

_METRICS = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "preemptions": "vllm:num_preemptions_total",
}


def kernel_env(kernels: list[str]) -> dict[str, str]:
    """ZOE_KERNELS tells the zoe plugin inside the engine which kernels to patch in; absent means none."""
    return {"ZOE_KERNELS": ",".join(kernels)} if kernels else {}


def aiter_moe_env(kernels: list[str], platform: str, env: dict[str, str]) -> dict[str, str]:
    """`VLLM_ROCM_USE_AITER_MOE=0` when zoe's fused MoE runs on ROCm with AITER on: vLLM must build its Triton MoE
    experts (the class zoe's plugin patches), not AITER's, whose pre-shuffled weights are not zoe's layout. It goes
    into the engine's environment at launch because vLLM copies the switch when `vllm._aiter_ops` is first
    imported, which can precede the plugin. An explicit value in `env` wins (the plugin then reports the pin)."""
    aiter_on = env.get("VLLM_ROCM_USE_AITER", "0").lower() in ("1", "true")
    if platform == "rocm" and "fused_moe" in kernels and aiter_on and "VLLM_ROCM_USE_AITER_MOE" not in env:
        return {"VLLM_ROCM_USE_AITER_MOE": "0"}
    return {}


def kernel_args(kernels: list[str], platform: str, extra_engine_args: list[str]) -> list[str]:
    """Flags that make vLLM take the path zoe's plugin patches.

    On CUDA, vLLM 0.32's `--moe-backend auto` may build DeepGEMM, CUTLASS or FlashInfer MoE experts, which zoe
    does not patch; `--moe-backend triton` builds `TritonExperts` (unquantized and FP8 block-scaled), whose
    `apply` the plugin routes by M (zoe below the crossover, vLLM's Triton MoE above). An explicit
    `--moe-backend` in the recipe's extra_engine_args wins. On ROCm `aiter_moe_env` keeps AITER's MoE off."""
    pinned = any(a.startswith("--moe-backend") for a in extra_engine_args)
    if platform == "cuda" and "fused_moe" in kernels and not pinned:
        return ["--moe-backend", "triton"]
    return []


class VllmAdapter(EngineAdapter):
    name = "vllm"
    metric_names = _METRICS
    places_own_workers = True  # multi-node: `vllm serve` on node 0 places its workers through Ray

    def command(self, recipe: Recipe, variant: str, ctx: LaunchContext) -> EngineCommand:
        from zoe_cluster.recipes import VllmVariant

        v = recipe.variant(variant)
        if not isinstance(v, VllmVariant):
            raise ValueError(f"{recipe.name}/{variant} is a {v.engine} variant, not vllm")
        par = v.parallelism
        env = {**v.env, **kernel_env(v.kernels), **visible_devices_env(ctx.platform, ctx.gpu_ids), **ctx.extra_env}
        env.update(aiter_moe_env(v.kernels, ctx.platform, env))
        if ctx.nnodes > 1 and ctx.node_rank > 0:
            # Multi-node vLLM runs one `vllm serve` on node 0 whose Ray executor places its workers in the
            # replica's placement group; the other nodes only hold GPUs for those workers.
            return EngineCommand(argv=[], env=env)
        launcher = list(ctx.launcher) if ctx.launcher else ["vllm"]
        argv = launcher + [
            "serve", ctx.model_path or v.weights.repo,
            "--host", ctx.host, "--port", str(ctx.port),
            "--served-model-name", ctx.served_model_name,
            "--tensor-parallel-size", str(par.tp),
            "--pipeline-parallel-size", str(par.pp),
            "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--kv-cache-dtype", _KV_DTYPE[v.kv_cache_dtype],
            "--gpu-memory-utilization", str(v.gpu_memory_utilization),
            "--max-num-seqs", str(v.max_num_seqs),
            "--max-num-batched-tokens", str(v.max_num_batched_tokens),
            "--max-model-len", str(ctx.max_model_len or recipe.architecture.max_context_tokens),
        ]
        if v.trust_remote_code:
            argv += ["--trust-remote-code"]
        if v.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
        if v.reasoning_parser:
            argv += ["--reasoning-parser", v.reasoning_parser]
        if par.dp > 1:
            argv += ["--data-parallel-size", str(par.dp)]
        if par.ep > 1:
            argv += ["--enable-expert-parallel"]
        if ctx.nnodes > 1:
            argv += ["--distributed-executor-backend", "ray"]
        if v.block_size:
            argv += ["--block-size", str(v.block_size)]
        if v.long_prefill_token_threshold:
            argv += ["--long-prefill-token-threshold", str(v.long_prefill_token_threshold)]
        if v.speculative:
            spec = {"method": v.speculative.method, "num_speculative_tokens": v.speculative.num_speculative_tokens}
            argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if ctx.host_kv_gb > 0:  # vLLM's native CPU offloading; its size is GiB summed over the replica's ranks
            argv += ["--kv-offloading-size", f"{ctx.host_kv_gb * 1e9 / 2**30:.1f}", "--kv-offloading-backend", "native"]
        if ctx.kv_events_port is not None:
            argv += ["--kv-events-config", kv_events_config(ctx.kv_events_port, par.dp, ctx.replica_id)]
        argv += kernel_args(v.kernels, ctx.platform, list(v.extra_engine_args))
        argv += list(v.extra_engine_args)
        return EngineCommand(argv=argv, env=env)

    def parse_metrics(self, text: str, scraped_at: float) -> EngineStats:
        return engine_stats(text, scraped_at, self.metric_names)
