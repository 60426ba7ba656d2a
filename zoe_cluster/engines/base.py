"""The contract every engine adapter fulfils, and the registry that finds an adapter by its engine's name.

An adapter turns (recipe, variant, where it runs) into the exact argv and env of the engine process, names
the health endpoint and the metric names it reads, parses the engine's Prometheus text into `EngineStats`, and
answers what the rest of zoe asks of an engine (is it simulated, does it place its own workers, which variants
can it serve, what KV capacity does a replica report). Engine differences live in the adapters and nowhere
else: code outside `zoe_cluster.engines` asks an adapter, it never compares an engine's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, get_args

if TYPE_CHECKING:  # recipes (pydantic schema) load only where a command is built: the router needs none
    from zoe_cluster.recipes import Recipe

Platform = Literal["rocm", "cuda", "cpu"]

EngineName = Literal["vllm", "sglang", "sim"]
"""The engines zoe runs: the one list of names (each has an adapter registered under it)."""
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)


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
    kv_events_port: int | None = None
    """Precise routing: the engine binds its KV-event publishers from this port on (`kv_event_ports`), topic
    `replica_id`; None: no KV events."""
    replica_id: str = ""
    """The replica's id ("deployment/index/generation"), the topic of its KV events."""


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


_ADAPTERS: dict[str, type["EngineAdapter"]] = {}


class EngineAdapter:
    """One engine's adapter. A subclass registers itself under its `name` (one of `EngineName`)."""

    name: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    """Path of the engine's liveness/readiness endpoint (200 when it serves)."""
    metric_names: ClassVar[dict[str, str]] = {}
    """`EngineStats` field -> the Prometheus sample name this engine exposes it under (summed over labels)."""
    is_simulated: ClassVar[bool] = False
    """A simulated engine: needs no GPU, device platform or engine image, and may serve any variant of a recipe."""
    places_own_workers: ClassVar[bool] = False
    """A multi-node replica's engine reserves its other nodes' GPUs itself (through Ray); zoe starts one launcher."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name not in ENGINE_NAMES:
            raise TypeError(f"{cls.__name__}.name {cls.name!r} is not one of EngineName {ENGINE_NAMES}")
        if cls.name in _ADAPTERS:
            raise TypeError(f"two adapters for engine {cls.name!r}: {_ADAPTERS[cls.name].__name__}, {cls.__name__}")
        _ADAPTERS[cls.name] = cls

    def command(self, recipe: Recipe, variant: str, ctx: LaunchContext) -> EngineCommand:
        raise NotImplementedError

    def parse_metrics(self, text: str, scraped_at: float) -> EngineStats:
        """`EngineStats` from the engine's /metrics text (a pure function of the text)."""
        raise NotImplementedError

    def serves(self, variant_engine: str) -> bool:
        """Whether this engine runs a recipe variant written for `variant_engine`."""
        return self.is_simulated or variant_engine == self.name

    def kv_capacity_tokens(self, recipe: Recipe, variant: str, engine_env: dict[str, str]) -> int:
        """KV-cache tokens one replica of `variant` holds (what the router sizes its prefix index to)."""
        from zoe_cluster.recipes.profile import kv_capacity_tokens

        return max(1, kv_capacity_tokens(recipe, variant))


def adapter_class(name: str) -> type[EngineAdapter]:
    """The adapter class registered for engine `name`; ValueError naming the known engines."""
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown engine '{name}'; known: {', '.join(ENGINE_NAMES)}") from None


def kv_event_ports(base_port: int, dp_size: int) -> list[tuple[int, int]]:
    """(publisher port, replay port) of each data-parallel rank of an engine given `base_port`: vLLM and SGLang
    offset both endpoints' ports by the rank, so the publishers take base..base+dp-1 and the replay sockets the dp
    ports after them. Routers connect to these (`MemberReplica.kv_events`)."""
    return [(base_port + r, base_port + dp_size + r) for r in range(dp_size)]


def kv_events_config(base_port: int, dp_size: int, topic: str) -> str:
    """The `--kv-events-config` JSON both vLLM (0.29-0.33) and SGLang (0.5.19-0.5.23) take: a ZMQ publisher the
    engine binds on every interface (a wildcard host makes both bind rather than connect), with a replay socket so
    a router that (re)connects catches up. vLLM reads `enable_kv_cache_events`; SGLang ignores it."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{base_port}",
                       "replay_endpoint": f"tcp://*:{base_port + dp_size}", "topic": topic},
                      separators=(",", ":"))


def visible_devices_env(platform: Platform, gpu_ids: tuple[int, ...]) -> dict[str, str]:
    """The variable that pins a process to its GPUs: HIP_VISIBLE_DEVICES on ROCm, CUDA_VISIBLE_DEVICES on NVIDIA."""
    if platform == "cpu" or not gpu_ids:
        return {}
    ids = ",".join(str(i) for i in gpu_ids)
    return {"HIP_VISIBLE_DEVICES": ids} if platform == "rocm" else {"CUDA_VISIBLE_DEVICES": ids}
