"""A new router pulls its picture (and, without one, its membership) from peer routers at start: two real routers
on loopback in front of fake engines; a dead peer costs at most the pull's timeout."""

from __future__ import annotations

import socket
import time

import httpx

from tests.conftest import free_port
from tests.router.fake_backend import FakeBackend, ServerThread
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership
from zoe_cluster.router.picture_store import _hashes, _unhash, merge_pictures

PROMPTS = [f"session {i} " + f"topic{i} " * 300 for i in range(8)]


def _placements(client: httpx.Client) -> list[str]:
    out = []
    for p in PROMPTS:
        r = client.post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 3})
        assert r.status_code == 200, r.text
        out.append(r.json()["backend"])
    return out


def _matched_tokens(router) -> int:
    return router._matched_tokens


def test_a_new_router_routes_by_the_picture_its_peer_learned(tmp_path):
    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(3)]
    members = [MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    try:
        a = build_router(RouterConfig(models=["m"], health_interval_s=0, admin_key="k"),
                         membership=Membership(version=7, replicas=members))
        with ServerThread(a.app) as sa:
            with httpx.Client(base_url=sa.url, timeout=10) as c:
                learned = _placements(c)
                assert httpx.get(sa.url + "/admin/picture", timeout=5).status_code == 401
            assert len(set(learned)) > 1  # spread by load at first sight: the picture is what pins them
            # B starts with no membership and no picture file: both come from A (the dead peer is skipped)
            b = build_router(RouterConfig(models=["m"], health_interval_s=0, admin_key="k",
                                          membership_file=str(tmp_path / "b.json"), picture_peers=[dead, sa.url]))
            with ServerThread(b.app) as sb, httpx.Client(base_url=sb.url, timeout=10) as c:
                assert b.replicas.version == 7 and set(b.replicas.by_id) == {m.id for m in members}
                again = _placements(c)
                assert again == learned
                assert _matched_tokens(b) > 0.9 * b._prompt_tokens
            # the control: a router of the same membership without peers places the prompts blind
            blind = build_router(RouterConfig(models=["m"], health_interval_s=0, admin_key="k"),
                                 membership=Membership(version=7, replicas=members))
            with ServerThread(blind.app) as sc, httpx.Client(base_url=sc.url, timeout=10) as c:
                _placements(c)
                assert _matched_tokens(blind) == 0
    finally:
        for s in backends:
            s.stop()


def test_a_dead_peer_delays_the_start_by_the_timeout_at_most_and_the_router_serves():
    backend = ServerThread(FakeBackend("b0").app).start()
    hung = socket.create_server(("127.0.0.1", 0))  # a peer whose kernel accepts connections it never answers
    try:
        cfg = RouterConfig(models=["m"], health_interval_s=0, admin_key="k", picture_peer_timeout_s=1.0,
                           picture_peers=[f"http://127.0.0.1:{free_port()}",
                                          f"http://127.0.0.1:{hung.getsockname()[1]}"])
        r = build_router(cfg, membership=Membership(version=1, replicas=[MemberReplica(id="d/0/1", url=backend.url)]))
        t0 = time.monotonic()
        with ServerThread(r.app) as s, httpx.Client(base_url=s.url, timeout=10) as c:
            started_s = time.monotonic() - t0
            assert c.post("/v1/completions", json={"model": "m", "prompt": "hello", "max_tokens": 2}).status_code == 200
        assert 0.9 < started_s < 3.0  # waited for the hung peer, and no longer than the timeout
    finally:
        backend.stop()
        hung.close()


def test_merged_pictures_keep_every_routers_blocks():
    a = {"format": 1, "block_tokens": 16, "replicas": {"r/0/1": {"hbm": _hashes([1, 2]), "host": _hashes([])}}}
    b = {"format": 1, "block_tokens": 16, "replicas": {"r/0/1": {"hbm": _hashes([2, 3]), "host": _hashes([9])},
                                                         "r/1/1": {"hbm": _hashes([5]), "host": _hashes([])}}}
    m = merge_pictures([a, b])
    # least recently used first; the most recent of each router's alternately, so a cut keeps some of each
    assert _unhash(m["replicas"]["r/0/1"]["hbm"]) == [1, 3, 2]
    assert _unhash(m["replicas"]["r/0/1"]["host"]) == [9]
    assert _unhash(m["replicas"]["r/1/1"]["hbm"]) == [5]
    assert _unhash(a["replicas"]["r/0/1"]["hbm"]) == [1, 2]  # inputs untouched


def test_routers_behind_a_random_front_share_what_they_learn(tmp_path):
    """Two routers that list each other (and themselves, as a headless Service's name would) with picture_share_s:
    each prompt is placed by one of them, and after a period the other routes it to the same replica with its
    whole prefix matched."""
    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(3)]
    members = Membership(version=3, replicas=[MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)])
    ports = [free_port(), free_port()]
    peers = [f"http://127.0.0.1:{p}" for p in ports]
    routers = [build_router(RouterConfig(models=["m"], health_interval_s=0, admin_key="k", picture_peers=peers,
                                         picture_share_s=0.2, picture_peer_timeout_s=0.5), membership=members)
               for _ in ports]
    try:
        with ServerThread(routers[0].app, ports[0]) as sa, ServerThread(routers[1].app, ports[1]) as sb:
            clients = [httpx.Client(base_url=s.url, timeout=10) for s in (sa, sb)]
            first = []
            for i, p in enumerate(PROMPTS):  # alternately, as a random front would
                r = clients[i % 2].post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 3})
                first.append(r.json()["backend"])
            assert len(set(first)) > 1
            time.sleep(0.8)  # a few periods
            before = [(r._matched_tokens, r._prompt_tokens) for r in routers]
            for i, p in enumerate(PROMPTS):  # now each prompt through the router that did not place it
                r = clients[(i + 1) % 2].post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 3})
                assert r.json()["backend"] == first[i]
            for (m0, p0), r in zip(before, routers):
                assert r._matched_tokens - m0 > 0.9 * (r._prompt_tokens - p0)
                d = r.sharer.describe()
                assert d["chains_taken"] >= len(PROMPTS) // 2 and len(d["self"]) == 1 and len(d["peers"]) == 1
            shown = httpx.get(sa.url + "/admin/membership", headers={"Authorization": "Bearer k"}, timeout=5).json()
            assert shown["picture_sharing"]["every_s"] == 0.2 and shown["picture_sharing"]["rounds"] >= 2
            # the exchange needs the admin key and a well-formed body
            assert httpx.post(sa.url + "/admin/picture/delta", content=b"", timeout=5).status_code == 401
            bad = httpx.post(sa.url + "/admin/picture/delta", content=b"\x93\x01", timeout=5,
                             headers={"Authorization": "Bearer k"})
            assert bad.status_code == 400 and "picture delta" in bad.json()["error"]["message"]
            for c in clients:
                c.close()
    finally:
        for s in backends:
            s.stop()


def test_a_restarted_peer_is_asked_for_its_whole_log():
    """A peer that restarts at the same address numbers its log from 1 again: the sharer sees a new router id,
    and its next ask is from the start, so nothing the new process inserted is skipped."""
    import asyncio

    from zoe_cluster.router.picture_sharing import PictureSharer
    from zoe_cluster.routing.context import context_from_openai
    from zoe_cluster.routing.picture_sharing import indexing_policy

    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(2)]
    members = Membership(version=1, replicas=[MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)])
    port = free_port()
    cfg = dict(models=["m"], health_interval_s=0, admin_key="k")
    a = build_router(RouterConfig(**cfg, picture_peers=[f"http://127.0.0.1:{port}"], picture_share_s=1.0),
                     membership=members)
    sharer = PictureSharer(a)

    def place(prompts):
        b = build_router(RouterConfig(**cfg), membership=members)
        server = ServerThread(b.app, port).start()
        with httpx.Client(base_url=server.url, timeout=10) as c:
            for p in prompts:
                assert c.post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 2}).status_code == 200
        return server

    def known(prompt):
        ctx = context_from_openai("completions", {"model": "m", "prompt": prompt}, request_id="q",
                                  block_tokens=a.config.block_tokens)
        pol = indexing_policy(a.policy)
        return max((pol.index_of(r).match(ctx.block_hashes) if pol.index_of(r) else 0) for r in a.replicas.by_id)

    try:
        first = place(PROMPTS[:4])
        assert asyncio.run(sharer.share_once()) == 4
        first.stop()
        second = place(PROMPTS[4:8])  # a new process at the same address: 4 inserts, numbered from 1 again
        try:
            taken = asyncio.run(sharer.share_once()) + asyncio.run(sharer.share_once())
            assert taken >= 4 and all(known(p) > 0 for p in PROMPTS[4:8])
        finally:
            second.stop()
    finally:
        for s in backends:
            s.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{"):
            got = ",".join(sorted(line[len(name) + 1:line.index("}")].split(",")))
            if got == want:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_peers_sessions_are_shared_and_sharing_is_measured():
    """Sessions a router placed are bound to the same replicas in its peer's session table after one round (their
    next turns keep affinity there), and the peer's /metrics count what it took per peer, a dead peer's failed asks,
    and that peer's lag."""
    import asyncio

    from zoe_cluster.router.picture_sharing import PictureSharer
    from zoe_cluster.routing.picture_sharing import session_table

    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(3)]
    members = Membership(version=1, replicas=[MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)])
    cfg = dict(models=["m"], health_interval_s=0, admin_key="k")
    a = build_router(RouterConfig(**cfg), membership=members)
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        with ServerThread(a.app) as sa, httpx.Client(base_url=sa.url, timeout=10) as c:
            placed = {}
            for i, p in enumerate(PROMPTS[:6]):
                r = c.post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 2, "user": f"s{i}"})
                placed[f"s{i}"] = r.json()["backend"]
            b = build_router(RouterConfig(**cfg, picture_peers=[sa.url, dead], picture_share_s=1.0,
                                          picture_peer_timeout_s=0.5), membership=members)
            sharer = PictureSharer(b)
            assert asyncio.run(sharer.share_once()) == 12  # each chain inserted when routed and when it finished
            table = session_table(b.policy)
            for s, backend in placed.items():
                st = table.get(s)
                assert st is not None and st.replica_id == f"d/{backend[1:]}/1" and st.in_flight == 0
            assert sharer.sessions_taken == 6 and len(table) == 6
            assert asyncio.run(sharer.share_once()) == 0 and sharer.sessions_taken == 6  # nothing new
            with ServerThread(b.app) as sb:
                text = httpx.get(sb.url + "/metrics", timeout=5).text
            peer = sa.url.removeprefix("http://")
            assert _metric(text, "zoe_router_picture_shared_total", peer=peer, kind="chains") == 12
            assert _metric(text, "zoe_router_picture_shared_total", peer=peer, kind="sessions") == 6
            down = dead.removeprefix("http://")
            assert _metric(text, "zoe_router_picture_share_failures_total", peer=down) == 2
            assert _metric(text, "zoe_router_picture_share_lag_seconds", peer=down) > 0
            assert 0 < _metric(text, "zoe_router_picture_share_lag_seconds", peer=peer) < 5
    finally:
        for s in backends:
            s.stop()


def test_a_router_that_pulled_its_picture_asks_its_peers_from_there():
    """After the pull at start, the first round asks each peer from the numbers its picture was taken at: nothing
    the pull held comes again (without the seed the first round took the peer's whole log, 4 chains), and what the
    peer inserts afterwards does."""
    import asyncio

    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(2)]
    members = Membership(version=1, replicas=[MemberReplica(id=f"d/{i}/1", url=s.url) for i, s in enumerate(backends)])
    cfg = dict(models=["m"], health_interval_s=0, admin_key="k")
    a = build_router(RouterConfig(**cfg), membership=members)
    try:
        with ServerThread(a.app) as sa, httpx.Client(base_url=sa.url, timeout=10) as c:
            for p in PROMPTS[:4]:
                assert c.post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 2}).status_code == 200
            b = build_router(RouterConfig(**cfg, picture_peers=[sa.url], picture_share_s=3600.0))
            with ServerThread(b.app):
                assert b.sharer is not None and b.replicas.version == 1  # membership and picture pulled from a
                assert asyncio.run(b.sharer.share_once()) == 0
                for p in PROMPTS[4:7]:
                    assert c.post("/v1/completions",
                                  json={"model": "m", "prompt": p, "max_tokens": 2}).status_code == 200
                assert asyncio.run(b.sharer.share_once()) == 3
    finally:
        for s in backends:
            s.stop()
