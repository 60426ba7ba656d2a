"""The contract every engine adapter (vllm, sglang, sim) fulfils.

An adapter turns (recipe, variant, where it runs) into the exact argv and env of the engine process, names
the health endpoint, and parses the engine's Prometheus text into `EngineStats`. Engine differences live in
the adapters and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from zoe_cluster.recipes import Recipe

Platform = Literal["rocm", "cuda", "cpu"]


@dataclass(frozen=True)
class LaunchContext:
    """Where and how one engine process of a replica runs."""

    gpu_ids: tuple[int, ...]
    """Device ids Ray assigned to this process (`ray.get_gpu_ids()`), exported per platform."""
    platform: Platform
    host: str
    port: int
    served_model_name: str
    node_rank: int = 0
    nnodes: int = 1
    dist_init_addr: str | None = None
    """host:port of node rank 0, for engines that join nodes themselves (SGLang)."""
    model_path: str | None = None
    """Overrides the recipe's weights repo (a local checkpoint; a tiny model in tests)."""
    max_model_len: int | None = None
    launcher: tuple[str, ...] | None = None
    """argv prefix that starts the engine (default: `vllm` / `python3 -m sglang.launch_server` on PATH)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    host_kv_gb: float = 0.0
    """Host memory for a second KV tier, GB per replica (0: HBM only); each adapter turns it into its engine's
    flags: vLLM's CPU offloading, SGLang's HiCache, the simulated engine's host tier."""


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class EngineStats:
    """What the router and switcher read from an engine's /metrics, with when it was scraped."""

    scraped_at: float
    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    zoe_kernels_active: tuple[str, ...] = ()
    """Kernels the zoe plugin reports as patched in (metric `zoe_kernel_active`), not what the recipe asks."""


class EngineAdapter(Protocol):
    name: str
    health_path: str

    def command(self, recipe: Recipe, variant: str, ctx: LaunchContext) -> EngineCommand: ...

    def parse_metrics(self, text: str, scraped_at: float) -> EngineStats: ...


def visible_devices_env(platform: Platform, gpu_ids: tuple[int, ...]) -> dict[str, str]:
    """The variable that pins a process to its GPUs: HIP_VISIBLE_DEVICES on ROCm, CUDA_VISIBLE_DEVICES on NVIDIA."""
    if platform == "cpu" or not gpu_ids:
        return {}
    ids = ",".join(str(i) for i in gpu_ids)
    return {"HIP_VISIBLE_DEVICES": ids} if platform == "rocm" else {"CUDA_VISIBLE_DEVICES": ids}
