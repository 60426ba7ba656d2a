"""The effect side of hung-replica detection: a deadline on one wait for a replica that also ends early when
`router.slowness.stall_verdict` finds the replica hung (the decision stays pure; this module only runs timers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from zoe_cluster.router.replicas import RoutedReplica
from zoe_cluster.router.slowness import next_stall_check_s, stall_verdict


class StallWatch:
    """A deadline on a wait for one replica (its response headers or first event) that also ends the wait early
    when `stall_verdict` finds the replica hung: `async with StallWatch(...) as w: ...`; on TimeoutError,
    `w.stalled` says which. Costs one timer per wait."""

    __slots__ = ("st", "stall_s", "limit_s", "clock", "since", "stalled", "_cm", "_handle", "_loop")

    def __init__(self, st: RoutedReplica, stall_s: float, limit_s: float, clock: Callable[[], float]) -> None:
        self.st, self.stall_s, self.limit_s, self.clock = st, stall_s, limit_s, clock
        self.stalled = False
        self._handle: asyncio.TimerHandle | None = None

    async def __aenter__(self) -> "StallWatch":
        self._loop = asyncio.get_running_loop()
        self.since = self.clock()
        self._cm = asyncio.timeout(self.limit_s)
        await self._cm.__aenter__()
        self._handle = self._loop.call_later(self.stall_s, self._check)
        return self

    def _check(self) -> None:
        now, st = self.clock(), self.st
        verdict = stall_verdict(now, self.since, st.last_byte_at, st.decoding_streams, self.stall_s, self.limit_s,
                                st.hung)
        if verdict == "stalled":
            self.stalled = True
            self._cm.reschedule(self._loop.time())  # the wait ends now with TimeoutError
            return
        if verdict == "wait":
            self._handle = self._loop.call_later(
                next_stall_check_s(now, self.since, st.last_byte_at, self.stall_s, self.limit_s), self._check)

    async def __aexit__(self, *exc: Any) -> bool | None:
        if self._handle is not None:
            self._handle.cancel()
        return await self._cm.__aexit__(*exc)
