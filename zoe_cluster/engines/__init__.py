"""Engine adapters, one per engine, found by name: `get_adapter("vllm" | "sglang" | "sim")`."""

from __future__ import annotations

from zoe_cluster.engines.base import EngineAdapter, EngineCommand, EngineStats, LaunchContext, visible_devices_env

ENGINE_NAMES = ("vllm", "sglang", "sim")


def get_adapter(name: str) -> EngineAdapter:
    """The adapter for engine `name`; imports are local so `sim` needs neither vLLM nor SGLang."""
    if name == "vllm":
        from zoe_cluster.engines.vllm import VllmAdapter

        return VllmAdapter()
    if name == "sglang":
        from zoe_cluster.engines.sglang import SglangAdapter

        return SglangAdapter()
    if name == "sim":
        from zoe_cluster.engines.sim import SimAdapter

        return SimAdapter()
    raise ValueError(f"unknown engine '{name}'; known: {', '.join(ENGINE_NAMES)}")


__all__ = ["ENGINE_NAMES", "EngineAdapter", "EngineCommand", "EngineStats", "LaunchContext", "get_adapter",
           "visible_devices_env"]
