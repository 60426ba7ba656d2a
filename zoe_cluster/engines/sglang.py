"""SGLang adapter: `python -m sglang.launch_server` argv/env from a recipe variant, and `sglang:` metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoe_cluster.engines.base import (EngineAdapter, EngineCommand, EngineStats, LaunchContext, kv_events_config,
                                      visible_devices_env)
from zoe_cluster.engines.metrics_text import engine_stats
from zoe_cluster.engines.vllm import kernel_env

if TYPE_CHECKING:  # recipes load only where a command is built
    from zoe_cluster.recipes import Recipe

_KV_DTYPE = {"fp8": "fp8_e4m3", "bf16": "bf16", "auto": "auto"}
# SGLang's names for the drafting methods; NEXTN is its name for DeepSeek/GLM-style MTP (run by EAGLE's worker).
_SPEC_ALGO = {"mtp": "NEXTN", "eagle": "EAGLE", "dspark": "DSPARK"}

_METRICS = {
    "running": "sglang:num_running_reqs",
    "waiting": "sglang:num_queue_reqs",
    "kv_cache_usage": "sglang:token_usage",
    "prompt_tokens": "sglang:prompt_tokens_total",
    "generation_tokens": "sglang:generation_tokens_total",
    # SGLang counts prefix-cache use in tokens: every prompt token is a query, cached ones are hits.
    "prefix_cache_queries": "sglang:prompt_tokens_total",
    "prefix_cache_hits": "sglang:cached_tokens_total",
    # SGLang's name for vLLM's preemptions: requests retracted from the running batch when the KV cache runs out.
    "preemptions": "sglang:num_retracted_requests_total",
}


class SglangAdapter(EngineAdapter):
    name = "sglang"
    metric_names = _METRICS

    def command(self, recipe: Recipe, variant: str, ctx: LaunchContext) -> EngineCommand:
        from zoe_cluster.recipes import SglangVariant

        v = recipe.variant(variant)
        if not isinstance(v, SglangVariant):
            raise ValueError(f"{recipe.name}/{variant} is a {v.engine} variant, not sglang")
        par = v.parallelism
        launcher = list(ctx.launcher) if ctx.launcher else ["python3", "-m", "sglang.launch_server"]
        argv = launcher + [
            "--model-path", ctx.model_path or v.weights.repo,
            "--host", ctx.host, "--port", str(ctx.port),
            "--served-model-name", ctx.served_model_name,
            "--tp-size", str(par.tp),
            "--enable-metrics",
            "--kv-cache-dtype", _KV_DTYPE[v.kv_cache_dtype],
            "--mem-fraction-static", str(v.gpu_memory_utilization),
            "--max-running-requests", str(v.max_num_seqs),
            "--chunked-prefill-size", str(v.max_num_batched_tokens),
            "--context-length", str(ctx.max_model_len or recipe.architecture.max_context_tokens),
        ]
        if v.trust_remote_code:
            argv += ["--trust-remote-code"]
        if v.tool_call_parser:  # SGLang offers tools whenever a tool-call parser is set
            argv += ["--tool-call-parser", v.tool_call_parser]
        if v.reasoning_parser:
            argv += ["--reasoning-parser", v.reasoning_parser]
        if par.dp > 1:
            argv += ["--dp-size", str(par.dp)]
        if par.pp > 1:
            argv += ["--pp-size", str(par.pp)]
        if par.ep > 1:
            argv += ["--ep-size", str(par.ep)]
        if v.enable_dp_attention:
            argv += ["--enable-dp-attention"]
        if v.attention_backend:
            argv += ["--attention-backend", v.attention_backend]
        if v.speculative:
            s = v.speculative
            argv += ["--speculative-algorithm", _SPEC_ALGO[s.method],
                     "--speculative-num-draft-tokens", str(s.num_speculative_tokens + 1)]
            if s.method in ("mtp", "eagle"):
                argv += ["--speculative-num-steps", str(s.num_speculative_tokens), "--speculative-eagle-topk", "1"]
        if ctx.nnodes > 1:
            if not ctx.dist_init_addr:
                raise ValueError("a multi-node SGLang replica needs dist_init_addr (host:port of node rank 0)")
            argv += ["--nnodes", str(ctx.nnodes), "--node-rank", str(ctx.node_rank),
                     "--dist-init-addr", ctx.dist_init_addr]
        if ctx.host_kv_gb > 0:  # HiCache: --hicache-size is whole GB per rank (each TP rank keeps its own pool)
            per_rank = max(1, int(ctx.host_kv_gb // (par.tp * par.pp * par.dp)))
            argv += ["--enable-hierarchical-cache", "--hicache-size", str(per_rank)]
        if ctx.kv_events_port is not None:  # every node gets it: the scheduler owning a KV cache publishes
            argv += ["--kv-events-config", kv_events_config(ctx.kv_events_port, par.dp, ctx.replica_id)]
        argv += list(v.extra_engine_args)
        env = {**v.env, **kernel_env(v.kernels), **visible_devices_env(ctx.platform, ctx.gpu_ids), **ctx.extra_env}
        return EngineCommand(argv=argv, env=env)

    def parse_metrics(self, text: str, scraped_at: float) -> EngineStats:
        return engine_stats(text, scraped_at, self.metric_names)
