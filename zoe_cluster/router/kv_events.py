"""The router's KV-event subscriber (precise mode): ZMQ SUB sockets on the engines' KV-event publishers.

Every router subscribes to every replica, so routers behind one Service receive the same events: how much each
engine holds and forgets (which prompts those blocks belong to, each router still learns from its own traffic). vLLM (0.29-0.33) and SGLang (0.5.19-0.5.23) bind their PUB socket when the endpoint's host is a wildcard
(`tcp://*:5557`) and connect it otherwise; the replay endpoint, a ROUTER socket, is always bound. zoe starts the
engines binding (`zoe_cluster.engines.base.kv_events_config`), the membership lists each replica's publishers
(`MemberReplica.kv_events`, one per data-parallel rank: the engines offset the port by the rank), and `follow`
connects one SUB socket per publisher and closes those of replicas that left.

Catching up: on connecting, and whenever a sequence number is skipped, the subscriber asks the publisher's replay
endpoint for every batch from the next one it expects (request `[b"", start_seq]`, answers `[b"", topic, seq,
payload]`, or `[b"", seq, payload]` from SGLang 0.5.19, ended by seq -1). A router that starts fresh asks from 0
and so learns every block the engine stored and removed while the engine's replay buffer (`buffer_steps`, 10,000
batches by default) still holds them; a restarted router resumes from the sequence numbers kept in its saved
picture (`zoe_cluster.router.picture_store`). Batches the buffer no longer holds count as gaps in the mirror.

One more socket exists for engines configured to connect rather than bind: with `bind_endpoint` the subscriber
binds a SUB socket they publish to, and takes the replica from the message's topic (only one router can bind
it, so this serves a single router).

An engine restarted under the same replica id (zoe never does this: a restart is a new generation, so a new id)
starts its sequence from 0 with an empty cache; a live sequence number lower than the last one seen is taken for
that, and the replica's picture is forgotten. A restarted engine that has published more batches than the old one
had before the router's socket reconnects (about 0.1 s) is not detected: give it a new id.

Batches are decoded by `zoe_cluster.routing.kv_events`; evictions go to the policy (`on_cache_evicted`), and
per-replica totals are kept for the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from zoe_cluster.router.membership import KvEventSource, MemberReplica
from zoe_cluster.routing.kv_events import KvEventDecodeError, ReplicaCacheMirror, summarize_batch

log = logging.getLogger(__name__)

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
"""The sequence frame that ends a replay answer (vLLM and SGLang)."""


@dataclass
class _Source:
    replica_id: str
    source: KvEventSource
    task: asyncio.Task | None = None
    next_seq: int | None = None
    """The sequence number expected next from this publisher (None: nothing received or replayed yet)."""
    live_last: int | None = None
    """The last sequence number received live: a publisher's live sequence only rises, so a lower one means the
    engine restarted (new process, sequence from 0, empty cache)."""


class KvEventSubscriber:
    """SUB sockets on the replicas' KV-event publishers, following membership (see the module docstring)."""

    def __init__(self, on_evicted: Callable[[str, int | None], None],
                 known: Callable[[str], bool] = lambda rid: True, *, bind_endpoint: str | None = None,
                 replay_timeout_s: float = 2.0) -> None:
        self.on_evicted = on_evicted
        self.known = known
        self.bind_endpoint = bind_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.mirrors: dict[str, ReplicaCacheMirror] = {}
        self.bad_messages = 0
        self.replayed_batches = 0
        self.resume_seq: dict[tuple[str, str], int] = {}
        """(replica id, endpoint) -> the first sequence number to ask a replay for (from a saved picture)."""
        self._sources: dict[tuple[str, str], _Source] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._bound: zmq.asyncio.Socket | None = None
        self._bound_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        if self.bind_endpoint:
            self._bound = self._sub_socket()
            self._bound.bind(self.bind_endpoint)
            self._bound_task = asyncio.get_running_loop().create_task(self._bound_loop())

    async def stop(self) -> None:
        tasks = [s.task for s in self._sources.values() if s.task is not None]
        if self._bound_task is not None:
            tasks.append(self._bound_task)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._sources.clear()
        if self._bound is not None:
            self._bound.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._bound = self._bound_task = self._ctx = None

    def follow(self, replicas: Iterable[MemberReplica]) -> None:
        """Subscribe to the publishers of `replicas` (the whole membership) and drop the others'."""
        assert self._ctx is not None, "start() first"
        wanted = {(r.id, s.endpoint): (r.id, s) for r in replicas for s in r.kv_events}
        for key in list(self._sources):
            if key not in wanted:
                src = self._sources.pop(key)
                if src.task is not None:
                    src.task.cancel()
        live = {rid for rid, _ in wanted.values()}
        for rid in list(self.mirrors):
            if rid not in live and not self.bind_endpoint:
                del self.mirrors[rid]
        loop = asyncio.get_running_loop()
        for key, (rid, source) in wanted.items():
            if key not in self._sources:
                src = self._sources[key] = _Source(rid, source, next_seq=self.resume_seq.get(key))
                src.task = loop.create_task(self._source_loop(src))

    def next_seqs(self) -> dict[tuple[str, str], int]:
        """(replica id, endpoint) -> the next sequence number expected, for every publisher heard from."""
        return {k: s.next_seq for k, s in self._sources.items() if s.next_seq is not None}

    # ------------------------------------------------------------------ one batch
    def apply(self, rid: str, seq: int | None, payload: bytes) -> None:
        """Fold one batch of replica `rid` into its mirror and pass its evictions to the policy."""
        try:
            summary = summarize_batch(payload)  # keeps the batch's DP rank: the mirror keys streams by it
        except KvEventDecodeError as e:
            self.bad_messages += 1
            log.warning("bad KV event batch from %s: %s", rid, e)
            return
        mirror = self.mirrors.setdefault(rid, ReplicaCacheMirror())
        forget = mirror.apply(summary, seq)
        if forget is None or forget > 0:
            self.on_evicted(rid, forget)

    def handle(self, frames: list[bytes]) -> None:
        """One multipart message [topic, seq, payload] (or [topic, payload]) on the bound socket: the topic names
        the replica."""
        parsed = _split(frames)
        if parsed is None:
            self.bad_messages += 1
            return
        topic, seq, payload = parsed
        rid = topic.decode("utf-8", "replace")
        if not self.known(rid):
            self.bad_messages += 1
            return
        self.apply(rid, seq, payload)

    # ------------------------------------------------------------------ sockets
    def _sub_socket(self) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.setsockopt(zmq.LINGER, 0)
        return sock

    async def _bound_loop(self) -> None:
        assert self._bound is not None
        while True:
            self.handle(await self._bound.recv_multipart())

    async def _source_loop(self, src: _Source) -> None:
        """Follow one publisher: catch up through its replay endpoint, then apply live batches in order."""
        sock = self._sub_socket()
        sock.connect(src.source.endpoint)  # connect is asynchronous: ZMQ reconnects by itself while it is down
        try:
            if src.source.replay_endpoint:
                await self._replay(src, src.next_seq or 0)
            while True:
                parsed = _split(await sock.recv_multipart())
                if parsed is None:
                    self.bad_messages += 1
                    continue
                _, seq, payload = parsed
                if seq is not None and src.live_last is not None and seq <= src.live_last:
                    self._restarted(src)
                src.live_last = seq if seq is not None else src.live_last
                if seq is not None and src.next_seq is not None:
                    if seq < src.next_seq:
                        continue  # already applied from a replay
                    if seq > src.next_seq and src.source.replay_endpoint:
                        await self._replay(src, src.next_seq)
                        if seq < src.next_seq:
                            continue
                self._take(src, seq, payload)
        finally:
            sock.close(linger=0)

    def _restarted(self, src: _Source) -> None:
        """The publisher's engine restarted under the same replica id: its cache is empty, its sequence starts over
        (a batch missed before this one is fetched from replay as from a new publisher)."""
        log.warning("KV-event publisher %s (%s) restarted: forgetting its cache", src.source.endpoint, src.replica_id)
        self.mirrors[src.replica_id] = ReplicaCacheMirror()
        self.on_evicted(src.replica_id, None)
        src.next_seq = 0

    def _take(self, src: _Source, seq: int | None, payload: bytes) -> None:
        self.apply(src.replica_id, seq, payload)  # the mirror counts skipped sequence numbers as gaps
        if seq is not None:
            src.next_seq = seq + 1

    async def _replay(self, src: _Source, start: int) -> None:
        """Apply the publisher's buffered batches from `start` on; gives up after `replay_timeout_s` of silence
        (an engine without a replay socket, or one that is down), leaving the live stream to go on."""
        assert self._ctx is not None and src.source.replay_endpoint
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(src.source.replay_endpoint)
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while await sock.poll(int(self.replay_timeout_s * 1000)):
                frames = await sock.recv_multipart()
                parsed = _split(frames[1:] if frames and frames[0] == b"" else frames, seq_first=True)
                if parsed is None:
                    self.bad_messages += 1
                    continue
                _, seq, payload = parsed
                if seq is None:  # the end marker
                    if src.next_seq is None:
                        src.next_seq = start  # nothing buffered: a later live batch above it is a skip to fill
                    return
                if seq >= start and (src.next_seq is None or seq >= src.next_seq):
                    if src.next_seq is None and seq > start:  # the buffer no longer held the first ones
                        self.mirrors.setdefault(src.replica_id, ReplicaCacheMirror()).gaps += seq - start
                    self._take(src, seq, payload)
                    self.replayed_batches += 1
            log.warning("no replay answer from %s (%s) within %.1f s; following live batches only",
                        src.source.replay_endpoint, src.replica_id, self.replay_timeout_s)
        finally:
            sock.close(linger=0)


def _split(frames: list[bytes], seq_first: bool = False) -> tuple[bytes, int | None, bytes] | None:
    """(topic, seq, payload) of a message `[topic, seq, payload]`, or of a two-frame one: `[seq, payload]` with
    `seq_first` (SGLang 0.5.19's replay answers), else `[topic, payload]`. seq is None for the end-of-replay marker
    and for messages without one; None for anything else."""
    if len(frames) == 3:
        topic, seq_b, payload = frames
    elif len(frames) == 2 and seq_first:
        (seq_b, payload), topic = frames, b""
    elif len(frames) == 2:
        (topic, payload), seq_b = frames, b""
    else:
        return None
    if seq_b == END_OF_REPLAY:
        return topic, None, b""
    return topic, (int.from_bytes(seq_b, "big") if len(seq_b) == 8 else None), payload
