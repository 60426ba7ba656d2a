"""The two clocks of the simulated engine.

- `VirtualClock`: discrete-event time. Nothing sleeps; time jumps from one event to the next, so a one-hour
  trace runs in seconds and a run is a pure function of its inputs and seed.
- `WallClock`: real time behind the HTTP server, scaled: one simulated second lasts `time_scale` real seconds
  (time_scale 0.01 runs 100x faster than the modelled hardware, for tests). Reported latencies (metrics, usage)
  are in simulated seconds, i.e. what the modelled MI355X would show.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any


class VirtualClock:
    """An event queue ordered by time (ties in insertion order)."""

    __slots__ = ("now", "_heap", "_seq")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = itertools.count()

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run fn(*args) at time t (never before now)."""
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self, until: float | None = None) -> None:
        """Run events in time order until none are left (or the next is after `until`)."""
        heap = self._heap
        pop = heapq.heappop
        while heap:
            if until is not None and heap[0][0] > until:
                self.now = until
                return
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)


class WallClock:
    """Simulated seconds mapped onto the event loop's real time by `time_scale` (real s per simulated s)."""

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        """Simulated seconds since the clock started."""
        return (time.monotonic() - self._t0) / self.time_scale

    async def sleep(self, sim_seconds: float) -> None:
        if sim_seconds > 0:
            await asyncio.sleep(sim_seconds * self.time_scale)

    async def sleep_until(self, sim_t: float) -> None:
        await self.sleep(sim_t - self.now())
