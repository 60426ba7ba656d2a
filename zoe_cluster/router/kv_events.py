"""The router's KV-event subscriber (precise mode): a ZMQ SUB socket the engines publish to.

The router binds `kv_events_endpoint` (e.g. tcp://0.0.0.0:5557); each vLLM replica is started with
`--kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://<router>:5557",
"topic":"<replica id>"}'` and connects to it. Batches are decoded by `zoe_cluster.routing.kv_events`; evictions
are passed to the policy (`on_cache_evicted`), and per-replica totals are kept for the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from zoe_cluster.routing.kv_events import KvEventDecodeError, ReplicaCacheMirror, summarize_batch

log = logging.getLogger(__name__)


class KvEventSubscriber:
    def __init__(self, endpoint: str, on_evicted: Callable[[str, int | None], None],
                 known: Callable[[str], bool] = lambda rid: True) -> None:
        self.endpoint = endpoint
        self.on_evicted = on_evicted
        self.known = known
        self.mirrors: dict[str, ReplicaCacheMirror] = {}
        self.bad_messages = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.endpoint)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        self._task = self._sock = self._ctx = None

    def handle(self, frames: list[bytes]) -> None:
        """One multipart message [topic, seq, payload] (or [topic, payload])."""
        if len(frames) == 3:
            topic, seq_b, payload = frames
            seq = int.from_bytes(seq_b, "big") if len(seq_b) == 8 else None
        elif len(frames) == 2:
            (topic, payload), seq = frames, None
        else:
            self.bad_messages += 1
            return
        rid = topic.decode("utf-8", "replace")
        if not self.known(rid):
            self.bad_messages += 1
            return
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

    async def _loop(self) -> None:
        assert self._sock is not None
        while True:
            frames = await self._sock.recv_multipart()
            self.handle(frames)
