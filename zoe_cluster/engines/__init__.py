"""Engine adapters, one per engine, registered under the engine's name: `get_adapter(name)`.

Importing the package registers every adapter (each module's class registers itself); none of them imports its
engine, so the simulated one needs neither vLLM nor SGLang.
"""

from __future__ import annotations

from zoe_cluster.engines import sglang as _sglang  # noqa: F401  (registers SglangAdapter)
from zoe_cluster.engines import sim as _sim  # noqa: F401  (registers SimAdapter)
from zoe_cluster.engines import vllm as _vllm  # noqa: F401  (registers VllmAdapter)
from zoe_cluster.engines.base import (
    ENGINE_NAMES,
    EngineAdapter,
    EngineCommand,
    EngineName,
    EngineStats,
    LaunchContext,
    adapter_class,
    visible_devices_env,
)


def get_adapter(name: str) -> EngineAdapter:
    """The adapter for engine `name` (one of ENGINE_NAMES); ValueError naming the known ones."""
    return adapter_class(name)()


def simulated_engine() -> str:
    """The name of the simulated engine (what `zoe deploy` serves on when the cluster has no GPUs)."""
    return next(n for n in ENGINE_NAMES if adapter_class(n).is_simulated)


__all__ = ["ENGINE_NAMES", "EngineAdapter", "EngineCommand", "EngineName", "EngineStats", "LaunchContext",
           "get_adapter", "simulated_engine", "visible_devices_env"]
