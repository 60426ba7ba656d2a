"""Adapter for `--engine sim`: launch `zoe sim serve` for a recipe variant and parse its vLLM-style /metrics.

The simulated engine needs no GPUs; it keeps the variant's GPU count for placement. Its knobs travel as
environment variables (`ZOE_SIM_TIME_SCALE`, `ZOE_SIM_SEED`, `ZOE_SIM_LOAD_TIME`, `ZOE_SIM_STARTUP_S`, `ZOE_SIM_CRASH_AFTER`,
`ZOE_SIM_HANG_AFTER`, `ZOE_SIM_ERROR_AFTER`, `ZOE_SIM_ERROR_RATE`, `ZOE_SIM_SLOWDOWN`, `ZOE_SIM_METRICS`,
`ZOE_SIM_KV_TOKENS`, `ZOE_SIM_MAX_MODEL_LEN`, `ZOE_SIM_HOST_KV_GB`) from `LaunchContext.extra_env`, which `zoe sim serve` reads as
option defaults.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from zoe_cluster.engines.base import EngineAdapter, EngineCommand, EngineStats, LaunchContext
from zoe_cluster.engines.sglang import SglangAdapter
from zoe_cluster.engines.vllm import VllmAdapter

if TYPE_CHECKING:  # recipes load only where a command is built
    from zoe_cluster.recipes import Recipe


class SimAdapter(EngineAdapter):
    name = "sim"
    metric_names = VllmAdapter.metric_names  # the default `--metrics vllm`; SGLang's with `--metrics sglang`
    is_simulated = True

    def command(self, recipe: Recipe, variant: str, ctx: LaunchContext) -> EngineCommand:
        recipe.variant(variant)  # KeyError naming the known variants
        argv = [
            sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve",
            "--model", recipe.name, "--variant", variant,
            "--host", ctx.host, "--port", str(ctx.port),
            "--served-model-name", ctx.served_model_name,
        ]
        if ctx.max_model_len is not None:
            argv += ["--max-model-len", str(ctx.max_model_len)]
        env = {k: v for k, v in ctx.extra_env.items()}
        if ctx.host_kv_gb > 0:
            env["ZOE_SIM_HOST_KV_GB"] = str(ctx.host_kv_gb)
        return EngineCommand(argv=argv, env=env)

    def parse_metrics(self, text: str, scraped_at: float) -> EngineStats:
        """vLLM V1 names (the default), or SGLang's when the sim runs with `--metrics sglang`: the same parsers
        the real engines' adapters use."""
        if "sglang:" in text and "vllm:" not in text:
            return SglangAdapter().parse_metrics(text, scraped_at)
        return VllmAdapter().parse_metrics(text, scraped_at)

    def kv_capacity_tokens(self, recipe: Recipe, variant: str, engine_env: dict[str, str]) -> int:
        """`ZOE_SIM_KV_TOKENS` when the deployment sets it (the simulated engine's own capacity), else the recipe's."""
        override = engine_env.get("ZOE_SIM_KV_TOKENS")
        return int(override) if override else super().kv_capacity_tokens(recipe, variant, engine_env)
