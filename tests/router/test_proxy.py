"""The router's proxy mechanics against FAKE loopback backends (tests/router/fake_backend.py)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.router.fake_backend import FakeBackend, ServerThread
from zoe_cluster.router.app import build_router, static_membership
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.http_server import hardened_http
from zoe_cluster.router.membership import MemberReplica, Membership

ADMIN = {"Authorization": "Bearer adm"}


class Cluster:
    """N fake backends behind one router, all on loopback threads."""

    def __init__(self, n=2, modes=None, membership=True, **cfg):
        self.backends = [FakeBackend(f"b{i}", (modes or {}).get(i, "ok")) for i in range(n)]
        self.servers = [ServerThread(b.app).start() for b in self.backends]
        cfg.setdefault("health_interval_s", 0)
        cfg.setdefault("admin_key", "adm")
        self.config = RouterConfig(models=["m"], **cfg)
        m = static_membership([s.url for s in self.servers]) if membership else None
        self.router = build_router(self.config, membership=m)
        self.server = ServerThread(self.router.app, http=hardened_http(self.config.header_timeout_s,
                                                                       self.config.body_timeout_s)).start()
        self.url = self.server.url
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def close(self):
        self.client.close()
        self.server.stop()
        for s in self.servers:
            s.stop()

    def metric(self, name, **labels):
        text = self.client.get("/metrics").text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
                if line.split("{")[0].split(" ")[0] == name:
                    total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def cluster(request):
    c = Cluster(**getattr(request, "param", {}))
    yield c
    c.close()


def completion(client, stream=False, prompt="hello " * 50, **extra):
    return client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 5, "stream": stream,
                                                **extra})


def sse_events(text):
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_completions_chat_and_streaming_pass_through(cluster):
    r = completion(cluster.client)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hi"
    assert r.headers["x-zoe-replica"].startswith("static/")
    chat = cluster.client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 200
    s = completion(cluster.client, stream=True)
    assert s.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(s.text)
    assert ev[-1] == "[DONE]" and [json.loads(e)["i"] for e in ev[:-1]] == [0, 1, 2]
    models = cluster.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["m"]
    assert cluster.client.get("/health").json()["routable"] == 2
    assert cluster.metric("zoe_router_requests_total") == 3
    assert cluster.metric("zoe_router_ttft_seconds_count") == 1


def test_same_prefix_goes_to_the_same_replica(cluster):
    long_prompt = "You are a careful assistant. " * 200
    first = completion(cluster.client, prompt=long_prompt + "Q1").headers["x-zoe-replica"]
    for q in range(2, 6):
        r = completion(cluster.client, prompt=long_prompt + f"Q{q}")
        assert r.headers["x-zoe-replica"] == first and r.headers["x-zoe-route-reason"] == "prefix"
    assert cluster.metric("zoe_router_prefix_matched_tokens_total") > 4 * 1000
    assert 0 < cluster.metric("zoe_router_estimated_hit_rate") < 1


@pytest.mark.parametrize(
    "body,status,needle",
    [
        (b"{not json", 400, "malformed JSON"),
        (b"[1, 2]", 400, "must be an object"),
        (json.dumps({"model": "nope", "prompt": "x"}).encode(), 404, "model 'nope'"),
        (json.dumps({"model": "m"}).encode(), 400, "prompt"),
        (json.dumps({"model": "m", "prompt": "x" * 5000}).encode(), 400, "context of 1000 tokens"),
        (b"x" * 3000, 413, "limit"),
    ],
)
def test_bad_requests_get_clear_errors(body, status, needle):
    c = Cluster(n=1, max_body_bytes=2048 * 4, max_context_tokens=1000)
    try:
        if status == 413:
            body = json.dumps({"model": "m", "prompt": "x" * 9000}).encode()
        r = c.client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status and needle in r.json()["error"]["message"]
    finally:
        c.close()


def test_api_keys_and_admin_are_separate():
    c = Cluster(n=1, api_keys=["k1"])
    try:
        assert completion(c.client).status_code == 401
        ok = c.client.post("/v1/completions", json={"model": "m", "prompt": "x"}, headers={"Authorization": "Bearer k1"})
        assert ok.status_code == 200
        assert c.client.get("/v1/models").status_code == 401
        # the client key does not open the admin API, and the admin key is required
        assert c.client.get("/admin/membership", headers={"Authorization": "Bearer k1"}).status_code == 401
        assert c.client.get("/admin/membership", headers=ADMIN).status_code == 200
    finally:
        c.close()
    c = Cluster(n=1, admin_key=None)
    try:
        assert c.client.get("/admin/membership", headers=ADMIN).status_code == 403
    finally:
        c.close()


@pytest.mark.parametrize("cluster", [{"modes": {0: "fail503"}, "policy": "round_robin"}], indirect=True)
def test_retry_on_another_replica_before_any_byte(cluster):
    for _ in range(4):
        r = completion(cluster.client, stream=True)
        assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]"
        assert r.headers["x-zoe-replica"] == "static/1/0"
    assert cluster.metric("zoe_router_retries_total") >= 1
    assert cluster.metric("zoe_router_ejections_total", cause="passive") >= 1


@pytest.mark.parametrize("cluster", [{"modes": {0: "die", 1: "die"}, "migration_limit": 0}], indirect=True)
def test_replica_dying_mid_stream_ends_with_an_error_event(cluster):
    r = completion(cluster.client, stream=True)
    ev = sse_events(r.text)
    assert r.status_code == 200 and ev[-1] == "[DONE]"
    assert "error" in json.loads(ev[-2]) and "mid-stream" in json.loads(ev[-2])["error"]["message"]
    assert [json.loads(e)["i"] for e in ev[:-2]] == [0, 1]
    assert cluster.metric("zoe_router_upstream_errors_total", kind="midstream") == 1


@pytest.mark.parametrize("cluster", [{"modes": {0: "hang"}, "first_byte_timeout_s": 0.5, "max_retries": 1, "policy": "round_robin"}],
                         indirect=True)
def test_hung_replica_times_out_and_the_request_moves(cluster):
    t = time.time()
    for _ in range(2):
        r = completion(cluster.client, stream=True)
        assert r.status_code == 200 and r.headers["x-zoe-replica"] == "static/1/0"
    assert time.time() - t < 5
    assert cluster.metric("zoe_router_upstream_errors_total", kind="timeout") >= 1


def test_dead_replica_is_retried_and_ejected():
    c = Cluster(n=2, passive_failures=1, eject_s=60, policy="round_robin")
    try:
        c.servers[0].stop()  # replica 0 is gone: connection refused
        for _ in range(3):
            assert completion(c.client).headers["x-zoe-replica"] == "static/1/0"
        assert c.metric("zoe_router_ejections_total", replica="static/0/0", cause="passive") == 1
        assert c.metric("zoe_router_replica_healthy", replica="static/0/0") == 0
    finally:
        c.close()


def test_client_disconnect_cancels_the_upstream_stream():
    c = Cluster(n=1)
    c.backends[0].chunks, c.backends[0].interval_s = 200, 0.02
    try:
        with c.client.stream("POST", "/v1/completions", json={"model": "m", "prompt": "x", "stream": True}) as r:
            it = r.iter_lines()
            assert next(it).startswith("data: ")
        deadline = time.time() + 5
        while c.backends[0].cancelled == 0 and time.time() < deadline:
            time.sleep(0.05)
        assert c.backends[0].cancelled == 1
        deadline = time.time() + 5
        while c.router.replicas.by_id["static/0/0"].view.active_requests and time.time() < deadline:
            time.sleep(0.05)
        assert c.router.replicas.by_id["static/0/0"].view.active_requests == 0
    finally:
        c.close()


def test_saturation_queues_then_429_and_503_with_retry_after():
    c = Cluster(n=1, max_queue=0, retry_after_s=3)
    c.router.replicas.by_id["static/0/0"].view.max_active_requests = 0  # saturated at once
    try:
        r = completion(c.client)
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
    finally:
        c.close()
    c = Cluster(n=1, max_queue=5, queue_timeout_s=0.3)
    c.router.replicas.by_id["static/0/0"].view.max_active_requests = 0
    try:
        r = completion(c.client)
        assert r.status_code == 503 and "retry-after" in r.headers and "within" in r.json()["error"]["message"]
    finally:
        c.close()


def test_membership_push_drain_and_stale_versions():
    c = Cluster(n=2, membership=False)
    try:
        assert completion(c.client).status_code == 503  # nothing to route to yet
        urls = [s.url for s in c.servers]
        m = Membership(version=1, replicas=[MemberReplica(id=f"glm/{i}/1", url=u, kv_capacity_tokens=2_000_000,
                                                          host_kv_capacity_tokens=5_000_000 * i)
                                            for i, u in enumerate(urls)])
        r = c.client.put("/admin/membership", json=m.model_dump(), headers=ADMIN)
        assert r.status_code == 200 and r.json()["added"] == ["glm/0/1", "glm/1/1"]
        # the prefix index is sized to the larger KV tier: HBM on glm/0/1, the host tier on glm/1/1
        views = c.router.replicas.by_id
        assert [views[f"glm/{i}/1"].view.cache_capacity_tokens for i in (0, 1)] == [2_000_000, 5_000_000]
        assert c.client.put("/admin/membership", json=m.model_dump(), headers=ADMIN).status_code == 200  # idempotent
        stale = Membership(version=1, replicas=m.replicas[:1])
        assert c.client.put("/admin/membership", json=stale.model_dump(), headers=ADMIN).status_code == 409
        bad = c.client.put("/admin/membership", json={"version": 2, "replicas": [{"id": "x", "url": "u"}]}, headers=ADMIN)
        assert bad.status_code == 400 and "replicas.0.id" in bad.json()["error"]["message"]
        assert c.client.post("/admin/replicas/glm/0/1/drain", headers=ADMIN).json()["draining"] is True
        for _ in range(3):
            assert completion(c.client).headers["x-zoe-replica"] == "glm/1/1"
        assert c.client.post("/admin/replicas/glm/9/9/drain", headers=ADMIN).status_code == 404
        c.client.post("/admin/replicas/glm/0/1/undrain", headers=ADMIN)
        m2 = Membership(version=2, replicas=[MemberReplica(id="glm/0/2", url=urls[0], state="draining")])
        r = c.client.put("/admin/membership", json=m2.model_dump(), headers=ADMIN)
        assert r.json()["removed"] == ["glm/0/1", "glm/1/1"]
        assert completion(c.client).status_code == 503
        assert c.metric("zoe_router_membership_version") == 2
    finally:
        c.close()


def test_active_health_ejects_and_recovers():
    c = Cluster(n=2, modes={0: "unhealthy"}, health_interval_s=0.1, unhealthy_after=1)
    try:
        deadline = time.time() + 5
        while c.metric("zoe_router_replica_healthy", replica="static/0/0") != 0 and time.time() < deadline:
            time.sleep(0.05)
        assert all(completion(c.client).headers["x-zoe-replica"] == "static/1/0" for _ in range(3))
        c.backends[0].mode = "ok"
        deadline = time.time() + 5
        while time.time() < deadline and (  # the health check and the /metrics scrape of a cycle land apart
            c.metric("zoe_router_replica_healthy", replica="static/0/0") != 1
            or c.router.replicas.by_id["static/0/0"].view.stats is None
        ):
            time.sleep(0.05)
        assert c.metric("zoe_router_replica_healthy", replica="static/0/0") == 1
        assert c.router.replicas.by_id["static/0/0"].view.stats is not None  # /metrics scraped via the vllm adapter
    finally:
        c.close()


def test_saturated_replica_queues_requests_until_one_finishes():
    c = Cluster(n=1)
    c.backends[0].chunks, c.backends[0].interval_s = 5, 0.05
    c.router.replicas.by_id["static/0/0"].view.max_active_requests = 1
    try:
        import concurrent.futures as cf

        with cf.ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(completion, c.client, True) for _ in range(3)]
            time.sleep(0.1)
            assert c.metric("zoe_router_queue_depth") >= 1
            results = [f.result() for f in futs]
        assert all(r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]" for r in results)
        assert c.metric("zoe_router_queue_depth") == 0
    finally:
        c.close()


def test_precise_mode_applies_kv_events_published_over_zmq():
    import msgpack
    import zmq

    from tests.conftest import free_port

    ep = f"tcp://127.0.0.1:{free_port()}"
    c = Cluster(n=1, kv_events_endpoint=ep)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        completion(c.client, prompt="z" * 256 * 10)  # 10 blocks of 64 tokens in the router's index
        idx = c.router.policy.index_of("static/0/0")
        assert len(idx) == 10
        pub.connect(ep)
        payload = msgpack.packb([0.0, [{"type": "BlockRemoved", "block_hashes": list(range(8)), "medium": None}], 0])
        stored = msgpack.packb([0.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                       "token_ids": [0] * 32, "block_size": 32}], 0])
        deadline = time.time() + 5
        while len(idx) == 10 and time.time() < deadline:  # PUB/SUB joins asynchronously: resend until seen
            pub.send_multipart([b"static/0/0", (0).to_bytes(8, "big"), stored])
            pub.send_multipart([b"static/0/0", (1).to_bytes(8, "big"), payload])
            time.sleep(0.1)
        assert len(idx) < 10  # 8 blocks of 32 tokens = 256 tokens = 4 router blocks per batch
        pub.send_multipart([b"nobody/0/0", (0).to_bytes(8, "big"), payload])  # unknown replica: ignored
        info = c.client.get("/admin/membership", headers=ADMIN).json()
        assert info["kv_events"]["static/0/0"]["block_size"] == 32
    finally:
        pub.close(linger=0)
        ctx.term()
        c.close()
