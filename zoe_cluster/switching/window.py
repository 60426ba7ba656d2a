"""Sliding-window concurrency estimate per replica, from periodic samples of the router's in-flight counts."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


class ConcurrencyWindow:
    """Time-weighted mean of in-flight requests per replica over the last `window_s` seconds.

    Each sample holds until the next one (a step function), so irregular sampling is weighted correctly.
    """

    def __init__(self, window_s: float):
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, now: float, in_flight: Mapping[str, float]) -> None:
        for replica, value in in_flight.items():
            q = self._samples.setdefault(replica, deque())
            if q and now < q[-1][0]:
                raise ValueError(f"sample at {now} is older than the last one ({q[-1][0]})")
            q.append((now, float(value)))
            while len(q) > 1 and q[1][0] <= now - self.window_s:
                q.popleft()
        for replica in set(self._samples) - set(in_flight):
            del self._samples[replica]  # gone from membership: a new generation starts a new window

    def mean(self, replica: str, now: float) -> float:
        q = self._samples.get(replica)
        if not q:
            return 0.0
        start = now - self.window_s
        total = span = 0.0
        for (t0, v), nxt in zip(q, list(q)[1:] + [(now, 0.0)]):
            lo, hi = max(t0, start), min(nxt[0], now)
            if hi > lo:
                total += v * (hi - lo)
                span += hi - lo
        return total / span if span > 0 else q[-1][1]


class RateWindow:
    """Per-key rate of cumulative counters (e.g. prompt tokens admitted per class) over the last `window_s`."""

    def __init__(self, window_s: float):
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, totals: Mapping[str, float]) -> None:
        if self._samples and now < self._samples[-1][0]:
            raise ValueError(f"sample at {now} is older than the last one ({self._samples[-1][0]})")
        self._samples.append((now, dict(totals)))
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.window_s:
            self._samples.popleft()

    def rates(self) -> dict[str, float]:
        """Increase per second of each counter between the oldest kept sample and the newest (0 with one)."""
        if len(self._samples) < 2:
            return {k: 0.0 for k in (self._samples[-1][1] if self._samples else {})}
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        span = t1 - t0
        return {k: max(0.0, v - first.get(k, 0.0)) / span if span > 0 else 0.0 for k, v in last.items()}
