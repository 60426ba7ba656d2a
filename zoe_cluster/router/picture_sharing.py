"""Live routers that share one approximate picture: every `picture_share_s` a router takes from each of its
`picture_peers` the prefix-index chains that peer inserted and the sessions it routed since the last time
(`routing.picture_sharing`, the same bookkeeping `zoe sim replay --routers N --router-share-s` runs).

    sharer = PictureSharer(router)   # with RouterConfig.picture_peers and picture_share_s > 0
    sharer.seed(pulled["shared_from"])   # after pulling the picture at start: ask from where the pull left off
    sharer.start()
    await sharer.stop()

The exchange is `POST /admin/picture/delta` (admin key) with a msgpack body `{"since": {replica_id: number},
"sessions": number}`, the numbers this router took that peer's index logs and session table up to; the answer
(`delta_document`) is `{"format", "router", "block_tokens", "replicas": {replica_id: {"next": number, "chains":
[8-byte unsigned hashes, ...]}}, "sessions": {"next": number, "entries": [[session, replica_id, context tokens,
seconds since active], ...]}}` for the peer's members. Per peer address the sharer keeps those numbers, and starts
over when the answering router id changes (the peer restarted: its logs restarted, so the next ask is for all of
them). A router that pulled its picture at start (`GET /admin/picture`, which carries `share_position`: the
answering router's id and its logs' numbers at that moment) asks each peer address from those numbers, not for the
whole log the pull already held; sessions are not in the pull, so the first round takes each peer's live ones.
Every address a peer's host resolves to is asked (a headless Service names every router pod); an address that
answers with this router's own id is itself and is not asked again. A peer that fails or is late (each ask is
bounded by the period and `picture_peer_timeout_s`) is skipped with a log line at most once a minute per address,
and asked again next period.

Metrics (`zoe_cluster.metrics`, label `peer` = address:port): `zoe_router_picture_shared_total{peer, kind}` (chains
and sessions taken), `zoe_router_picture_share_failures_total{peer}` (asks that failed or were late) and
`zoe_router_picture_share_lag_seconds{peer}` (set every round: the time from the peer's previous answer to this
one, or to now when it did not answer; about the period while it answers, growing while it does not).
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgpack

from zoe_cluster.router.loop_task import LoopTask
from zoe_cluster.router.picture_store import FORMAT_VERSION, PICTURE_MEDIA_TYPE, _hashes, _peer_addresses, _unhash
from zoe_cluster.routing.picture_sharing import (
    Delta,
    SessionDelta,
    apply_picture_delta,
    apply_session_delta,
    indexing_policy,
    picture_delta,
    session_delta,
)

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router

_log = logging.getLogger(__name__)
DELTA_PATH = "/admin/picture/delta"
"""The admin endpoint that answers the chains a router inserted since the numbers asked."""
_QUIET_S = 60.0


def parse_delta_request(raw: bytes) -> tuple[dict[str, int], int]:
    """The numbers a `POST /admin/picture/delta` body asks from (per replica, and of the session table: 0 when
    absent); ValueError, TypeError, KeyError or msgpack's ExtraData when it is not such a body."""
    body = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    since, sessions = body["since"], body.get("sessions", 0)
    if not isinstance(since, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in since.items()):
        raise ValueError("since must map replica ids to numbers")
    if not isinstance(sessions, int):
        raise ValueError("sessions must be a number")
    return since, sessions


def delta_document(router: "Router", since: dict[str, int], sessions_since: int = 0) -> dict[str, Any]:
    """What `POST /admin/picture/delta` answers: the router's inserts and session routings since the numbers
    asked, for its members."""
    delta = picture_delta(router.policy, since, router.replicas.by_id)
    next_session, entries = session_delta(router.policy, sessions_since, time.monotonic())
    return {"format": FORMAT_VERSION, "router": router.instance_id, "block_tokens": router.config.block_tokens,
            "replicas": {rid: {"next": n, "chains": [_hashes(list(c)) for c in chains]}
                         for rid, (n, chains) in delta.items()},
            "sessions": {"next": next_session,
                         "entries": [list(e) for e in entries if e[1] in router.replicas.by_id]}}


def share_position(router: "Router") -> dict[str, Any]:
    """The router's id and the numbers its index logs are at (`shared_from` of `GET /admin/picture`): a peer that
    pulls the picture asks deltas from there."""
    pol = indexing_policy(router.policy)
    chains = {rid: idx.next_seq for rid in router.replicas.by_id
              if pol is not None and (idx := pol.index_of(rid)) is not None}
    return {"router": router.instance_id, "chains": chains}


def _parse_delta(doc: Any) -> tuple[str, int, Delta, SessionDelta]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
        raise ValueError(f"not a picture delta of format {FORMAT_VERSION}")
    delta: Delta = {str(rid): (int(e["next"]), [tuple(_unhash(c)) for c in e["chains"]])
                    for rid, e in doc["replicas"].items()}
    s = doc.get("sessions") or {"next": 0, "entries": []}
    sessions: SessionDelta = (int(s["next"]), [(str(k), str(rid), int(n), float(age)) for k, rid, n, age in
                                               s["entries"]])
    return str(doc["router"]), int(doc["block_tokens"]), delta, sessions


def _ask(url: str, addr: str, port: int, admin_key: str | None, since: dict[str, int], sessions_since: int,
         timeout_s: float) -> tuple[str, int, Delta, SessionDelta]:
    conn = http.client.HTTPConnection(addr, port, timeout=timeout_s)
    try:
        headers = {"Host": urlsplit(url).netloc, "Content-Type": PICTURE_MEDIA_TYPE, "Accept": PICTURE_MEDIA_TYPE}
        if admin_key:
            headers["Authorization"] = f"Bearer {admin_key}"
        conn.request("POST", urlsplit(url).path.rstrip("/") + DELTA_PATH,
                     body=msgpack.packb({"since": since, "sessions": sessions_since}, use_bin_type=True),
                     headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace')}")
        return _parse_delta(msgpack.unpackb(raw, raw=False, strict_map_key=False))
    finally:
        conn.close()


@dataclass
class _Peer:
    """What the sharer knows of the router at one address."""

    router: str
    """The id that answered there (another id: the peer restarted)."""
    chains: dict[str, int] = field(default_factory=dict)
    """Per replica, the number of the peer's index log to ask from next."""
    sessions: int = 0
    """The number of the peer's session table to ask from next."""


class PictureSharer(LoopTask):
    """Takes the peers' prefix-index inserts and session routings every `picture_share_s` (module docstring)."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.every_s = router.config.picture_share_s
        self.chains_taken = 0
        self.sessions_taken = 0
        self.rounds = 0
        self._peers: dict[tuple[str, int], _Peer] = {}
        self._self: set[tuple[str, int]] = set()
        self._quiet_until: dict[tuple[str, int], float] = {}
        self._last_answer: dict[tuple[str, int], float] = {}
        self._started = time.monotonic()

    def seed(self, shared_from: dict[tuple[str, int], dict[str, Any]]) -> None:
        """Ask each address from the numbers its picture was pulled at (`picture_store.pull_picture`'s
        `shared_from`: (address, port) -> `share_position`), not for the whole log the pull already held."""
        for key, pos in shared_from.items():
            try:
                self._peers[key] = _Peer(str(pos["router"]), {str(r): int(n) for r, n in pos["chains"].items()})
            except (KeyError, TypeError, ValueError, AttributeError):
                continue  # a peer that did not say where its logs were: asked for all of them

    def start(self) -> None:
        if self.every_s > 0 and self.router.config.picture_peers:
            self._start_loop()

    async def stop(self) -> None:
        await self._stop_loop()

    def describe(self) -> dict[str, Any]:
        return {"every_s": self.every_s, "rounds": self.rounds, "chains_taken": self.chains_taken,
                "sessions_taken": self.sessions_taken, "peers": sorted(f"{a}:{p}" for a, p in self._peers),
                "self": sorted(f"{a}:{p}" for a, p in self._self)}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.share_once()

    async def share_once(self) -> int:
        """Ask every peer address once; returns the chains taken."""
        cfg = self.router.config
        m = self.router.metrics
        timeout_s = min(self.every_s, cfg.picture_peer_timeout_s) if self.every_s > 0 else cfg.picture_peer_timeout_s
        targets: list[tuple[str, str, int]] = []
        for url in cfg.picture_peers:
            try:
                targets += [t for t in await asyncio.to_thread(_peer_addresses, url) if t[1:] not in self._self]
            except OSError as e:
                self._warn((url, 0), "picture peer %s: cannot resolve (%s)", url, e)
                m.picture_share_failures.labels(url).inc()
        asks = [(t, self._peers.get(t[1:])) for t in targets]
        answers = await asyncio.gather(
            *(asyncio.to_thread(_ask, *t, cfg.admin_key, self._since(p), p.sessions if p else 0, timeout_s)
              for t, p in asks), return_exceptions=True)
        taken = 0
        views = {rid: st.view for rid, st in self.router.replicas.by_id.items()}
        now = time.monotonic()
        for ((url, addr, port), known), a in zip(asks, answers):
            key, label = (addr, port), f"{addr}:{port}"
            if isinstance(a, BaseException):
                self._warn(key, "picture peer %s (%s:%s) did not answer: %s", url, addr, port, a)
                m.picture_share_failures.labels(label).inc()
                m.picture_share_lag.labels(label).set(now - self._last_answer.get(key, self._started))
                continue
            peer, block_tokens, delta, sessions = a
            if peer == self.router.instance_id:
                self._self.add(key)
                self._peers.pop(key, None)
                continue
            m.picture_share_lag.labels(label).set(now - self._last_answer.get(key, self._started))
            self._last_answer[key] = now
            if block_tokens != cfg.block_tokens:
                self._warn(key, "picture peer %s has block_tokens %s, this router %s: not used", url, block_tokens,
                           cfg.block_tokens)
                continue
            if known is None or known.router != peer:
                # another router at this address (the peer restarted, its numbers too): ask for its whole log next
                self._peers[key] = _Peer(peer)
                if known is not None:
                    continue
            p = self._peers[key]
            p.chains = self._since(p)
            chains = apply_picture_delta(self.router.policy, views, cfg.block_tokens, delta, p.chains)
            bound = apply_session_delta(self.router.policy, views, sessions, now)
            p.sessions = sessions[0]
            m.picture_shared.labels(label, "chains").inc(chains)
            m.picture_shared.labels(label, "sessions").inc(bound)
            taken += chains
            self.sessions_taken += bound
        self.rounds += 1
        self.chains_taken += taken
        return taken

    def _since(self, peer: _Peer | None) -> dict[str, int]:
        """The numbers to ask `peer` from, for the replicas still members (a removed replica's go)."""
        return {rid: n for rid, n in (peer.chains if peer else {}).items() if rid in self.router.replicas.by_id}

    def _warn(self, key: tuple[str, int], msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now >= self._quiet_until.get(key, 0.0):
            self._quiet_until[key] = now + _QUIET_S
            _log.warning(msg, *args)
