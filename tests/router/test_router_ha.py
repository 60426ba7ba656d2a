"""Router HA: every router subscribes to the engines' KV-event publishers listed in membership and catches up
through their replay socket; a restarted router gets its picture back from the file beside its membership; SIGTERM
drains. The publisher here speaks vLLM's wire protocol (PUB `[topic, seq, payload]`, ROUTER replay answering
`[id, b"", topic, seq, payload]` ... and seq -1); the real vLLM engine is tests/router/test_vllm_kv_events.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import msgpack
import pytest
import zmq

from tests.conftest import free_port
from tests.router.fake_backend import FakeBackend, ServerThread
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.kv_events import END_OF_REPLAY, KvEventSubscriber
from zoe_cluster.router.membership import KvEventSource, MemberReplica, Membership
from zoe_cluster.router.picture_store import picture_path


def _stored(n: int, block_size: int = 16) -> bytes:
    return msgpack.packb([time.time(), [{"type": "BlockStored", "block_hashes": list(range(n)),
                                         "parent_block_hash": None, "token_ids": [1] * (n * block_size),
                                         "block_size": block_size}], 0])


def _removed(n: int) -> bytes:
    return msgpack.packb([time.time(), [{"type": "BlockRemoved", "block_hashes": list(range(n))}], 0])


class Publisher:
    """One engine's KV-event publisher on loopback: a bound PUB socket and a bound ROUTER replay socket that
    answers from a buffer, in a thread (vLLM's protocol)."""

    def __init__(self, topic: str, ports: tuple[int, int] | None = None) -> None:
        self.topic = topic.encode()
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        if ports is None:
            p, q = self.pub.bind_to_random_port("tcp://127.0.0.1"), self.replay.bind_to_random_port("tcp://127.0.0.1")
        else:
            (p, q), _ = ports, [self.pub.bind(f"tcp://127.0.0.1:{ports[0]}"), self.replay.bind(f"tcp://127.0.0.1:{ports[1]}")]
        self.source = KvEventSource(endpoint=f"tcp://127.0.0.1:{p}", replay_endpoint=f"tcp://127.0.0.1:{q}")
        self.buffer: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()
        self.replays = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish(self, payload: bytes, live: bool = True) -> None:
        """Buffer the next batch and (unless `live` is False: a batch lost on the wire) send it."""
        with self.lock:
            seq = len(self.buffer)
            self.buffer.append((seq, payload))
        if live:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])

    def _serve_replay(self) -> None:
        while not self._stop:
            if not self.replay.poll(50):
                continue
            ident, _, start = self.replay.recv_multipart()
            self.replays += 1
            with self.lock:
                batches = [b for b in self.buffer if b[0] >= int.from_bytes(start, "big")]
            for seq, payload in batches:
                self.replay.send_multipart([ident, b"", self.topic, seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([ident, b"", b"", END_OF_REPLAY, b""])

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.pub.close()
        self.replay.close()
        self.ctx.term()


def _member(rid: str, pub: Publisher | None, url: str = "http://127.0.0.1:9") -> MemberReplica:
    return MemberReplica(id=rid, url=url, kv_events=[pub.source] if pub else [])


async def _until(cond, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _totals(sub: KvEventSubscriber, rid: str) -> tuple:
    m = sub.mirrors.get(rid)
    return None if m is None else (m.blocks, m.history["stored"], m.history["removed"], m.gaps)


def test_every_subscriber_sees_the_same_blocks_and_a_late_one_replays_what_it_missed():
    pub = Publisher("glm/0/1")

    async def run() -> None:
        evicted: list[list] = [[], []]
        early = KvEventSubscriber(lambda rid, t: evicted[0].append((rid, t)))
        early.start()
        early.follow([_member("glm/0/1", pub)])
        await _until(lambda: pub.replays >= 1)  # the early one asked for history (none yet)
        for _ in range(40):  # SUB joins asynchronously: publish until the live stream is seen
            pub.publish(_stored(4))
            await asyncio.sleep(0.02)
            if early.mirrors:
                break
        pub.publish(_removed(3))
        pub.publish(_stored(2))
        late = KvEventSubscriber(lambda rid, t: evicted[1].append((rid, t)))
        late.start()
        late.follow([_member("glm/0/1", pub)])
        n = len(pub.buffer)
        await _until(lambda: _totals(early, "glm/0/1") == _totals(late, "glm/0/1")
                     and early.mirrors["glm/0/1"].history["stored"] == 4 * (n - 2) + 2)
        assert late.replayed_batches == n and early.mirrors["glm/0/1"].gaps == 0
        assert evicted[1] == [("glm/0/1", 3 * 16)]  # the late one forgot the removal it replayed, in tokens
        # a batch lost on the wire: both fill it from the replay buffer instead of counting a gap
        pub.publish(_removed(1), live=False)
        pub.publish(_stored(1))
        await _until(lambda: _totals(early, "glm/0/1") == _totals(late, "glm/0/1")
                     and early.mirrors["glm/0/1"].history["removed"] == 4)
        assert early.mirrors["glm/0/1"].gaps == 0 and late.mirrors["glm/0/1"].gaps == 0
        # a replica leaving membership: its socket and mirror go
        late.follow([])
        assert late.mirrors == {} and late.next_seqs() == {}
        await early.stop()
        await late.stop()

    try:
        asyncio.run(run())
    finally:
        pub.close()


def test_a_subscriber_resuming_from_a_saved_sequence_replays_only_the_rest():
    pub = Publisher("glm/0/1")

    async def run() -> None:
        for _ in range(3):
            pub.publish(_stored(2), live=False)
        pub.publish(_removed(2), live=False)
        evicted = []
        sub = KvEventSubscriber(lambda rid, t: evicted.append(t))
        sub.resume_seq[("glm/0/1", pub.source.endpoint)] = 3  # a saved picture had applied batches 0-2
        sub.start()
        sub.follow([_member("glm/0/1", pub)])
        await _until(lambda: sub.replayed_batches == 1)
        assert evicted == [2 * 16] and sub.next_seqs() == {("glm/0/1", pub.source.endpoint): 4}
        await sub.stop()

    try:
        asyncio.run(run())
    finally:
        pub.close()


def test_an_engine_restarted_under_the_same_id_is_taken_as_empty():
    pub = Publisher("glm/0/1")
    ports = (int(pub.source.endpoint.rsplit(":", 1)[1]), int(pub.source.replay_endpoint.rsplit(":", 1)[1]))
    evicted = []

    async def run() -> None:
        nonlocal pub
        sub = KvEventSubscriber(lambda rid, t: evicted.append(t))
        sub.start()
        sub.follow([_member("glm/0/1", pub)])
        await _until(lambda: pub.replays >= 1)
        for _ in range(40):
            pub.publish(_stored(5))
            await asyncio.sleep(0.02)
            if sub.mirrors:
                break
        for _ in range(100):  # a long-lived engine: its sequence is far ahead of a new process's
            pub.publish(_stored(1))
        await _until(lambda: sub.next_seqs().get(("glm/0/1", pub.source.endpoint)) == len(pub.buffer))
        pub.close()  # the engine restarts: same endpoints, sequence from 0, an empty cache
        pub = Publisher("glm/0/1", ports)
        pub.publish(_stored(2), live=False)  # published before the router's socket reconnected
        for _ in range(200):
            pub.publish(_stored(1))
            await asyncio.sleep(0.02)
            if None in evicted:
                break
        await _until(lambda: sub.mirrors["glm/0/1"].history["stored"] == 2 + len(pub.buffer) - 1)
        assert None in evicted and sub.mirrors["glm/0/1"].gaps == 0  # forgot everything, then refilled from 0
        await sub.stop()

    try:
        asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        pub.close()


def test_an_engine_without_replay_is_followed_live():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    member = MemberReplica(id="glm/0/1", url="http://127.0.0.1:9", kv_events=[{"endpoint": f"tcp://127.0.0.1:{port}"}])

    async def run() -> None:
        sub = KvEventSubscriber(lambda rid, t: None)
        sub.start()
        sub.follow([member])
        seq = 0
        while "glm/0/1" not in sub.mirrors:
            sock.send_multipart([b"anything", seq.to_bytes(8, "big"), _stored(1)])  # the socket names the replica
            seq += 1
            await asyncio.sleep(0.02)
        await sub.stop()

    try:
        asyncio.run(asyncio.wait_for(run(), 10))
    finally:
        sock.close(linger=0)
        ctx.term()


def test_replay_answers_of_both_wire_forms_are_read():
    from zoe_cluster.router.kv_events import _split

    payload = _stored(1)
    assert _split([b"glm/0/1", (7).to_bytes(8, "big"), payload], seq_first=True) == (b"glm/0/1", 7, payload)
    assert _split([(7).to_bytes(8, "big"), payload], seq_first=True) == (b"", 7, payload)  # SGLang 0.5.19
    assert _split([b"", END_OF_REPLAY, b""], seq_first=True)[1] is None
    assert _split([b"glm/0/1", payload]) == (b"glm/0/1", None, payload)  # live, without a sequence number
    assert _split([b"a", b"b", b"c", b"d"]) is None


def test_membership_refuses_a_kv_event_endpoint_routers_cannot_reach():
    with pytest.raises(ValueError, match="concrete host"):
        KvEventSource(endpoint="tcp://*:5557")
    with pytest.raises(ValueError, match="tcp://host:port"):
        KvEventSource(endpoint="ipc:///tmp/kv")


# ------------------------------------------------------------------------------------------- picture restore
def _routes(client: httpx.Client, n: int) -> None:
    for i in range(n):
        r = client.post("/v1/completions", json={"model": "m", "prompt": f"session {i} " + "word " * 300,
                                                 "max_tokens": 3})
        assert r.status_code == 200, r.text


def test_a_restarted_router_gets_its_prefix_indexes_back_from_the_picture_file(tmp_path):
    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(2)]
    mfile = tmp_path / "membership.json"
    members = [MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)]
    cfg = RouterConfig(models=["m"], health_interval_s=0, admin_key="a", membership_file=str(mfile),
                       picture_save_s=0)
    try:
        first = build_router(cfg, membership=Membership(version=1, replicas=members))
        with ServerThread(first.app) as s, httpx.Client(base_url=s.url, timeout=10) as c:
            _routes(c, 6)
        before = {m.id: first.policy.index_of(m.id).snapshot() for m in members}
        assert sum(len(h) for h, _ in before.values()) > 0
        assert picture_path(mfile).exists()  # saved at shutdown
        # started again from the files alone, one replica replaced by a new generation meanwhile
        second = build_router(cfg)
        with ServerThread(second.app):
            after = {rid: second.policy.index_of(rid).snapshot() for rid in before}
        assert after == before
        third = build_router(cfg, membership=Membership(version=9, replicas=[members[0], MemberReplica(
            id="d/1/2", url=backends[1].url)]))
        with ServerThread(third.app):
            assert third.policy.index_of("d/0/1").snapshot() == before["d/0/1"]
            assert third.policy.index_of("d/1/2") is None  # another generation: not the old one's picture
        picture_path(mfile).write_bytes(b"\x93not a picture")
        fourth = build_router(cfg)
        with ServerThread(fourth.app):
            assert fourth.policy.index_of("d/0/1") is None  # logged and ignored
    finally:
        for b in backends:
            b.stop()


# ------------------------------------------------------------------------------------------- SIGTERM drain
def test_sigterm_drains_then_exits(tmp_path):
    backend = ServerThread(FakeBackend("slow", chunks=50, interval_s=0.1).app).start()
    port = free_port()
    argv = [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--port", str(port), "--model", "m",
            "--replica", backend.url, "--config-json", '{"drain_delay_s": 3.0, "drain_timeout_s": 20}']
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "router did not start"
            time.sleep(0.1)
        with httpx.Client(timeout=30) as c, c.stream("POST", url + "/v1/completions", json={
                "model": "m", "prompt": "x", "max_tokens": 50, "stream": True}) as r:
            chunks = r.iter_text()
            first = next(chunks)
            os.kill(proc.pid, signal.SIGTERM)  # about 5 s of the stream are left: it outlives the 3 s delay
            t_term = time.monotonic()
            time.sleep(0.3)
            health = httpx.get(url + "/health", timeout=2)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            during = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "y", "max_tokens": 2},
                                timeout=10)
            assert during.status_code == 200  # still serving during the delay,
            assert during.headers["connection"] == "close"  # but clients stop reusing their connections
            time.sleep(max(0.0, 3.6 - (time.monotonic() - t_term)))
            with pytest.raises(httpx.ConnectError):  # the listener is closed now, the stream still runs
                httpx.get(url + "/health", timeout=2)
            rest = "".join(chunks)
        text = first + rest
        assert text.rstrip().endswith("data: [DONE]") and "error" not in text
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        backend.stop()
