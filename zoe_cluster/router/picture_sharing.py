"""Live routers that share one approximate picture: every `picture_share_s` a router takes from each of its
`picture_peers` the prefix-index chains that peer inserted since the last time (`routing.picture_sharing`, the same
bookkeeping `zoe sim replay --routers N --router-share-s` runs).

    sharer = PictureSharer(router)   # with RouterConfig.picture_peers and picture_share_s > 0
    sharer.start()
    await sharer.stop()

The exchange is `POST /admin/picture/delta` (admin key) with a msgpack body `{"since": {replica_id: number}}`, the
numbers this router took that peer's log up to; the answer (`delta_document`) is `{"format", "router",
"block_tokens", "replicas": {replica_id: {"next": number, "chains": [8-byte unsigned hashes, ...]}}}` for the
peer's members. Per peer address the sharer keeps those numbers, and starts over when the answering router id
changes (the peer restarted: its logs restarted, so the next ask is for all of them). Every address a peer's
host resolves to is asked (a headless Service names every router pod); an address that answers with this
router's own id is itself and is not asked again. A peer that fails or is late (each ask is bounded by the
period and `picture_peer_timeout_s`) is skipped with a log line at most once a minute per address, and asked
again next period.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgpack

from zoe_cluster.router.picture_store import FORMAT_VERSION, PICTURE_MEDIA_TYPE, _hashes, _peer_addresses, _unhash
from zoe_cluster.routing.picture_sharing import Delta, apply_picture_delta, picture_delta

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router

_log = logging.getLogger(__name__)
DELTA_PATH = "/admin/picture/delta"
"""The admin endpoint that answers the chains a router inserted since the numbers asked."""
_QUIET_S = 60.0


def delta_document(router: "Router", since: dict[str, int]) -> dict[str, Any]:
    """What `POST /admin/picture/delta` answers: the router's inserts since `since`, for its members."""
    delta = picture_delta(router.policy, since, router.replicas.by_id)
    return {"format": FORMAT_VERSION, "router": router.instance_id, "block_tokens": router.config.block_tokens,
            "replicas": {rid: {"next": n, "chains": [_hashes(list(c)) for c in chains]}
                         for rid, (n, chains) in delta.items()}}


def _parse_delta(doc: Any) -> tuple[str, int, Delta]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
        raise ValueError(f"not a picture delta of format {FORMAT_VERSION}")
    delta: Delta = {str(rid): (int(e["next"]), [tuple(_unhash(c)) for c in e["chains"]])
                    for rid, e in doc["replicas"].items()}
    return str(doc["router"]), int(doc["block_tokens"]), delta


def _ask(url: str, addr: str, port: int, admin_key: str | None, since: dict[str, int],
         timeout_s: float) -> tuple[str, int, Delta]:
    conn = http.client.HTTPConnection(addr, port, timeout=timeout_s)
    try:
        headers = {"Host": urlsplit(url).netloc, "Content-Type": PICTURE_MEDIA_TYPE, "Accept": PICTURE_MEDIA_TYPE}
        if admin_key:
            headers["Authorization"] = f"Bearer {admin_key}"
        conn.request("POST", urlsplit(url).path.rstrip("/") + DELTA_PATH,
                     body=msgpack.packb({"since": since}, use_bin_type=True), headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace')}")
        return _parse_delta(msgpack.unpackb(raw, raw=False, strict_map_key=False))
    finally:
        conn.close()


class PictureSharer:
    """Takes the peers' prefix-index inserts every `picture_share_s` (see the module docstring)."""

    def __init__(self, router: "Router") -> None:
        self.router = router
        self.every_s = router.config.picture_share_s
        self.chains_taken = 0
        self.rounds = 0
        self._cursors: dict[tuple[str, int], tuple[str, dict[str, int]]] = {}
        """(address, port) -> (the router id that answered there, per replica the number to ask from next)."""
        self._self: set[tuple[str, int]] = set()
        self._quiet_until: dict[tuple[str, int], float] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.every_s > 0 and self.router.config.picture_peers and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def describe(self) -> dict[str, Any]:
        return {"every_s": self.every_s, "rounds": self.rounds, "chains_taken": self.chains_taken,
                "peers": sorted(f"{a}:{p}" for a, p in self._cursors),
                "self": sorted(f"{a}:{p}" for a, p in self._self)}

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.share_once()

    async def share_once(self) -> int:
        """Ask every peer address once; returns the chains taken."""
        cfg = self.router.config
        timeout_s = min(self.every_s, cfg.picture_peer_timeout_s) if self.every_s > 0 else cfg.picture_peer_timeout_s
        targets: list[tuple[str, str, int]] = []
        for url in cfg.picture_peers:
            try:
                targets += [t for t in await asyncio.to_thread(_peer_addresses, url) if t[1:] not in self._self]
            except OSError as e:
                self._warn((url, 0), "picture peer %s: cannot resolve (%s)", url, e)
        answers = await asyncio.gather(
            *(asyncio.to_thread(_ask, *t, cfg.admin_key, self._since(t[1:]), timeout_s) for t in targets),
            return_exceptions=True)
        taken = 0
        views = {rid: st.view for rid, st in self.router.replicas.by_id.items()}
        for (url, addr, port), a in zip(targets, answers):
            key = (addr, port)
            if isinstance(a, BaseException):
                self._warn(key, "picture peer %s (%s:%s) did not answer: %s", url, addr, port, a)
                continue
            peer, block_tokens, delta = a
            if peer == self.router.instance_id:
                self._self.add(key)
                self._cursors.pop(key, None)
                continue
            if block_tokens != cfg.block_tokens:
                self._warn(key, "picture peer %s has block_tokens %s, this router %s: not used", url, block_tokens,
                           cfg.block_tokens)
                continue
            known = self._cursors.get(key, (peer, {}))[0]
            cursors = self._since(key)
            taken += apply_picture_delta(self.router.policy, views, cfg.block_tokens, delta, cursors)
            # another router at this address (the peer restarted, its numbers too): ask for its whole log next
            self._cursors[key] = (peer, cursors if known == peer else {})
        self.rounds += 1
        self.chains_taken += taken
        return taken

    def _since(self, key: tuple[str, int]) -> dict[str, int]:
        """The numbers to ask the peer at `key` from, for the replicas still members (a removed replica's go)."""
        return {rid: n for rid, n in self._cursors.get(key, ("", {}))[1].items() if rid in self.router.replicas.by_id}

    def _warn(self, key: tuple[str, int], msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now >= self._quiet_until.get(key, 0.0):
            self._quiet_until[key] = now + _QUIET_S
            _log.warning(msg, *args)
