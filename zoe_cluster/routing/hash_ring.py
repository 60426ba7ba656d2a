"""A consistent-hash ring over replica ids: the placement behind the `session_hash` policy.

Every replica owns `points_per_replica` points on a 64-bit ring, at blake2b hashes of "<replica id>#<k>" (stable
across processes and hosts, unlike Python's salted `hash`). A key (a session id, or a prompt's first block hash)
belongs to the first point clockwise from its own hash. Adding a replica takes over only the arcs its new points
cover; removing one hands only its arcs to their clockwise neighbours: every other key keeps its replica. With
100 points a replica's share of the keys is within about 10-20% of 1/N.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable


def ring_hash(key: str | bytes | int) -> int:
    """Stable 64-bit hash of a key (str, bytes, or an int such as a block's chain hash)."""
    if isinstance(key, int):
        data = key.to_bytes(16, "little", signed=True)
    elif isinstance(key, str):
        data = key.encode("utf-8", "surrogatepass")
    else:
        data = key
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """Replica ids placed on a ring; `owners(key)` walks it clockwise from the key."""

    __slots__ = ("points_per_replica", "_points", "_owner", "_members")

    def __init__(self, points_per_replica: int = 100, replicas: Iterable[str] = ()) -> None:
        if points_per_replica <= 0:
            raise ValueError(f"points_per_replica must be positive, got {points_per_replica}")
        self.points_per_replica = points_per_replica
        self._points: list[int] = []
        self._owner: list[str] = []
        self._members: set[str] = set()
        for r in replicas:
            self.add(r)

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def add(self, replica_id: str) -> None:
        if replica_id in self._members:
            return
        self._members.add(replica_id)
        for k in range(self.points_per_replica):
            p = ring_hash(f"{replica_id}#{k}")
            i = bisect.bisect_left(self._points, p)
            # equal points (a 2^-64 chance) are ordered by id, so the ring does not depend on insertion order
            while i < len(self._points) and self._points[i] == p and self._owner[i] < replica_id:
                i += 1
            self._points.insert(i, p)
            self._owner.insert(i, replica_id)

    def remove(self, replica_id: str) -> None:
        if replica_id not in self._members:
            return
        self._members.discard(replica_id)
        keep = [(p, o) for p, o in zip(self._points, self._owner) if o != replica_id]
        self._points = [p for p, _ in keep]
        self._owner = [o for _, o in keep]

    def lookup(self, key: str | bytes | int, accept: Callable[[str], bool] = lambda r: True) -> str | None:
        """The first replica clockwise from `key` that `accept`s, or None when none does."""
        n = len(self._points)
        if not n:
            return None
        start = bisect.bisect_right(self._points, ring_hash(key))
        seen: set[str] = set()
        for j in range(n):
            owner = self._owner[(start + j) % n]
            if owner in seen:
                continue
            if accept(owner):
                return owner
            seen.add(owner)
            if len(seen) == len(self._members):
                break
        return None
