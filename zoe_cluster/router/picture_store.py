"""A router's picture of the replicas' caches, kept in a file beside its membership file so a restarted router
routes by what it knew instead of starting blind.

    keeper = PictureKeeper(router, picture_path(config.membership_file), save_every_s=2.0)
    keeper.restore()      # at start, after the membership file was applied; returns the replicas restored
    keeper.start()        # saves every save_every_s (written whole, then renamed into place)
    await keeper.stop()   # saves a last time

What the file holds, per replica of the current membership: the prefix index (both tiers' block hashes, least
recently used first, as 8-byte unsigned integers), the KV-event mirror (precise mode: blocks per data-parallel
rank, totals, gaps) and, per KV-event publisher, the next sequence number the router expected. A restarted router
restores the indexes and mirrors of the replicas its membership still lists (ids name the generation, so a
replaced engine's picture is not taken for its successor's) and asks each publisher's replay endpoint for the
batches from that sequence number on (`zoe_cluster.router.kv_events`): the evictions it missed while down are
applied to the restored index. What a SIGKILL loses is what happened since the last save (at most
`save_every_s` of routing decisions; evictions are replayed). A file that does not parse is logged and ignored.
The format is msgpack with a version number; an unknown version is ignored the same way.

A router that starts without a picture file (a new pod) can pull the picture from its peers instead
(`RouterConfig.picture_peers`): each peer answers `GET /admin/picture` (admin key) with the same document plus the
membership it applied. `pull_picture` asks every peer, and every address a peer's host name resolves to (a
headless Service names all router pods), at once, within `picture_peer_timeout_s` in all; a peer that fails or
is late is skipped with a log line. The answers are merged (`merge_pictures`: per replica, the union of the block
hashes; mirrors and sequence numbers from the first answer), and a router without membership adopts the newest
membership among the answers before the picture is applied, as from the file: only replicas this router lists.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import logging
import os
import socket
import time
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgpack

from zoe_cluster.router.loop_task import LoopTask
from zoe_cluster.routing.kv_events import RankCache, ReplicaCacheMirror
from zoe_cluster.routing.picture_sharing import indexing_policy
from zoe_cluster.routing.prefix_index import PrefixIndex

if TYPE_CHECKING:
    from zoe_cluster.router.app import Router

_log = logging.getLogger(__name__)
FORMAT_VERSION = 1
PICTURE_PATH = "/admin/picture"
"""The admin endpoint that answers a router's picture (msgpack, `PICTURE_MEDIA_TYPE`)."""
PICTURE_MEDIA_TYPE = "application/msgpack"


def picture_path(membership_file: str | Path) -> Path:
    """Where the picture of a router keeping its membership in `membership_file` lives."""
    p = Path(membership_file)
    return p.with_name(p.name + ".picture")


def _hashes(values: list[int]) -> bytes:
    return array("Q", values).tobytes()


def _unhash(raw: bytes) -> list[int]:
    a = array("Q")
    a.frombytes(raw)
    return a.tolist()


def picture_summary(router: "Router") -> dict[str, Any]:
    """Per replica, the blocks its prefix index holds (HBM, host tier): the admin API shows it."""
    policy = indexing_policy(router.policy)
    out: dict[str, Any] = {}
    for rid in router.replicas.by_id:
        idx = policy.index_of(rid) if policy is not None else None
        out[rid] = {"prefix_blocks": idx.hbm_blocks if idx is not None else 0,
                    "host_prefix_blocks": len(idx.snapshot()[1]) if idx is not None and idx.host_capacity_blocks else 0}
    return out


def capture_picture(router: "Router") -> dict[str, Any]:
    """The router's picture as a msgpack-able document (what the file and `GET /admin/picture` hold)."""
    r = router
    policy = indexing_policy(r.policy)
    sub = r.kv_events
    seqs = sub.next_seqs() if sub is not None else {}
    replicas: dict[str, Any] = {}
    for rid in r.replicas.by_id:
        entry: dict[str, Any] = {}
        idx: PrefixIndex | None = policy.index_of(rid) if policy is not None else None
        if idx is not None:
            hbm, host = idx.snapshot()
            entry["hbm"], entry["host"] = _hashes(hbm), _hashes(host)
        mirror = sub.mirrors.get(rid) if sub is not None else None
        if mirror is not None:
            entry["mirror"] = {"block_size": mirror.block_size, "gaps": mirror.gaps, "history": mirror.history,
                               "ranks": [[k, c.blocks, c.last_seq] for k, c in mirror.ranks.items()]}
        entry["next_seq"] = {ep: n for (rr, ep), n in seqs.items() if rr == rid}
        replicas[rid] = entry
    return {"format": FORMAT_VERSION, "block_tokens": r.config.block_tokens, "replicas": replicas}


def apply_picture(router: "Router", doc: dict[str, Any], source: str) -> int:
    """Restore `doc` into the router for the replicas it lists; returns how many were restored. `source` names
    where `doc` came from in log lines."""
    r = router
    if doc.get("format") != FORMAT_VERSION or doc.get("block_tokens") != r.config.block_tokens:
        _log.warning("%s has format %s / block_tokens %s, this router %s / %s: not used",
                     source, doc.get("format"), doc.get("block_tokens"), FORMAT_VERSION, r.config.block_tokens)
        return 0
    policy = indexing_policy(r.policy)
    sub = r.kv_events
    restored = 0
    for rid, entry in doc.get("replicas", {}).items():
        st = r.replicas.by_id.get(rid)
        if st is None:
            continue  # no longer a member (or another generation): its picture is not this replica's
        if policy is not None and "hbm" in entry:
            policy.index(st.view, r.config.block_tokens).restore(_unhash(entry["hbm"]), _unhash(entry["host"]))
        if sub is not None and "mirror" in entry:
            m = entry["mirror"]
            sub.mirrors[rid] = ReplicaCacheMirror(
                block_size=m["block_size"], gaps=m["gaps"], history=dict(m["history"]),
                ranks={k: RankCache(blocks, seq) for k, blocks, seq in m["ranks"]})
        if sub is not None:
            sub.resume_seq.update({(rid, ep): n for ep, n in entry.get("next_seq", {}).items()})
        restored += 1
    return restored


def _interleave(ours: list[int], theirs: list[int]) -> list[int]:
    """Two least-recently-used-first lists as one, most recent of each alternately (ours first), without repeats:
    neither router's recent blocks are the first cut when the union is trimmed to the replica's capacity."""
    out: dict[int, None] = {}
    for pair in itertools.zip_longest(reversed(ours), reversed(theirs)):
        for h in pair:
            if h is not None:
                out.setdefault(h)
    return list(reversed(out))


def merge_pictures(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One picture from several routers' (`docs[0]` first): per replica the union of the block hashes, recency
    interleaved (`_interleave`); the KV-event mirror and sequence numbers of the first document that has them.
    Documents of another format or block size than the first are left out."""
    first = docs[0]
    out = {**first, "replicas": {rid: dict(e) for rid, e in first.get("replicas", {}).items()}}
    for doc in docs[1:]:
        if doc.get("format") != first.get("format") or doc.get("block_tokens") != first.get("block_tokens"):
            continue
        for rid, entry in doc.get("replicas", {}).items():
            mine = out["replicas"].setdefault(rid, dict(entry))
            if mine is entry or mine == entry:
                continue
            for tier in ("hbm", "host"):
                if tier in entry:
                    mine[tier] = _hashes(_interleave(_unhash(mine.get(tier, b"")), _unhash(entry[tier])))
            for key in ("mirror", "next_seq"):
                if key not in mine and key in entry:
                    mine[key] = entry[key]
    return out


def _peer_addresses(url: str) -> list[tuple[str, str, int]]:
    """(peer url, address, port) for every address the peer's host resolves to (a headless Service: every pod)."""
    parts = urlsplit(url)
    port = parts.port or 80
    infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    return [(url, addr, port) for addr in dict.fromkeys(i[4][0] for i in infos)]


def _fetch(url: str, addr: str, port: int, admin_key: str | None, timeout_s: float) -> dict[str, Any]:
    conn = http.client.HTTPConnection(addr, port, timeout=timeout_s)
    try:
        headers = {"Host": urlsplit(url).netloc, "Accept": PICTURE_MEDIA_TYPE}
        if admin_key:
            headers["Authorization"] = f"Bearer {admin_key}"
        conn.request("GET", urlsplit(url).path.rstrip("/") + PICTURE_PATH, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {raw[:200].decode('utf-8', 'replace')}")
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if not isinstance(doc, dict):
            raise ValueError("not a map")
        return doc
    finally:
        conn.close()


async def pull_picture(peers: list[str], admin_key: str | None, timeout_s: float) -> dict[str, Any] | None:
    """The merged pictures of the peers that answered within `timeout_s` (in the order of `peers`), with the newest
    `membership` among the answers and, per (address, port) that answered, where its logs were (`shared_from`:
    `router.picture_sharing.share_position`); None when none did. Never raises: each failure is a log line."""
    deadline = time.monotonic() + timeout_s

    async def one(url: str) -> list[dict[str, Any]]:
        try:
            targets = await asyncio.to_thread(_peer_addresses, url)
        except OSError as e:
            _log.warning("picture peer %s: cannot resolve (%s): skipped", url, e)
            return []
        left = max(0.05, deadline - time.monotonic())
        answers = await asyncio.gather(*(asyncio.to_thread(_fetch, *t, admin_key, left) for t in targets),
                                       return_exceptions=True)
        docs = []
        for (_, addr, port), a in zip(targets, answers):
            if isinstance(a, BaseException):
                _log.warning("picture peer %s (%s:%s) failed: %s: skipped", url, addr, port, a)
            else:
                docs.append((addr, port, a))
        return docs

    tasks = [asyncio.ensure_future(one(u)) for u in peers]
    done, late = await asyncio.wait(tasks, timeout=timeout_s)
    for t in late:
        t.cancel()
        _log.warning("picture peer %s did not answer within %g s: skipped", peers[tasks.index(t)], timeout_s)
    answered = [d for t in tasks if t in done for d in t.result()]
    if not answered:
        return None
    docs = [d for _, _, d in answered]
    merged = merge_pictures(docs)
    merged["shared_from"] = {(addr, port): d["shared_from"] for addr, port, d in answered if "shared_from" in d}
    merged["membership"] = max((d["membership"] for d in docs if isinstance(d.get("membership"), dict)),
                               key=lambda m: m.get("version") if isinstance(m.get("version"), int) else -1, default=None)
    return merged


class PictureKeeper(LoopTask):
    """Saves and restores one router's picture (see the module docstring)."""

    def __init__(self, router: "Router", path: str | Path, save_every_s: float = 2.0) -> None:
        self.router = router
        self.path = Path(path)
        self.save_every_s = save_every_s
        self.saves = 0

    def capture(self) -> dict[str, Any]:
        """The picture as a msgpack-able document."""
        return capture_picture(self.router)

    def apply(self, doc: dict[str, Any]) -> int:
        """Restore `doc` into the router; returns the replicas whose picture was restored."""
        return apply_picture(self.router, doc, f"picture file {self.path}")

    # ------------------------------------------------------------------ files
    def save(self) -> None:
        """Write the picture atomically (a reader sees the old file or the new one)."""
        self._write(msgpack.packb(self.capture(), use_bin_type=True))

    def _write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)
        self.saves += 1

    def restore(self) -> int:
        """Read the file into the router (call after the membership and the KV-event subscriber exist); returns
        the replicas restored (0 without a usable file)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        try:
            doc = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            if not isinstance(doc, dict):
                raise ValueError("not a map")
            return self.apply(doc)
        except (ValueError, TypeError, KeyError, msgpack.exceptions.ExtraData) as e:
            _log.error("picture file %s is not a router picture (%s): starting without it", self.path, e)
            return 0

    def start(self) -> None:
        if self.save_every_s > 0:
            self._start_loop()

    async def stop(self) -> None:
        await self._stop_loop()
        try:
            self.save()
        except OSError as e:
            _log.warning("could not save the picture to %s: %s", self.path, e)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.save_every_s)
            try:
                data = msgpack.packb(self.capture(), use_bin_type=True)  # captured on the loop: one consistent state
                await asyncio.to_thread(self._write, data)
            except OSError as e:
                _log.warning("could not save the picture to %s: %s", self.path, e)
