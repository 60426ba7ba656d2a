"""Sliding-window concurrency estimate per replica, from periodic samples of the router's in-flight counts."""

from __future__ import annotations

from collections import deque


class ConcurrencyWindow:
    """Time-weighted mean of in-flight requests per replica over the last `window_s` seconds.

    Each sample holds until the next one (a step function), so irregular sampling is weighted correctly.
    """

    def __init__(self, window_s: float):
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, now: float, in_flight: dict[str, float]) -> None:
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
