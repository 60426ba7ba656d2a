"""Replica lifecycle as facts with timestamps; the state is derived from them, never stored.

One `ReplicaFacts` describes one incarnation of a replica: `(deployment, index, generation)`. A restart after a
crash or hang, and a swap to another variant, start a new generation (the new engine's caches are empty, so
the router must not mix it with the old one). What happened is recorded (placed_at, started_at, ready_at,
exit_code, last health check, ...) and `state()` derives one of pending/starting/loading/ready/draining/
stopped/failed from it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from zoe_cluster.replica_state import ReplicaState


def replica_id(deployment: str, index: int, generation: int) -> str:
    """The replica identity every part of zoe uses: "deployment/index/generation"."""
    return f"{deployment}/{index}/{generation}"


@dataclass
class Event:
    at: float
    what: str
    detail: str = ""


@dataclass
class ReplicaFacts:
    """What happened to one incarnation of a replica. Times are Unix seconds (time.time())."""

    deployment: str
    index: int
    generation: int
    variant: str
    pool: str
    created_at: float
    placed_at: float | None = None
    started_at: float | None = None
    ready_at: float | None = None
    drain_requested_at: float | None = None
    stopped_at: float | None = None
    failed_at: float | None = None
    failure: str | None = None
    exit_code: int | None = None
    last_health_ok_at: float | None = None
    last_health_error: str | None = None
    health_failures_in_a_row: int = 0
    url: str | None = None
    kv_events_port: int | None = None
    """First port of the engine's KV-event publishers (`engines.base.kv_event_ports`); None: it publishes none."""
    nodes: list[str] = field(default_factory=list)
    gpu_ids: list[list[int]] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    """Pids of the engine processes (one per node that runs one): `kill PID` ends that engine, which is healed."""
    process_groups: list[int] = field(default_factory=list)
    """Process-group ids of those engines (the group holds the engine, its children and the process supervisor;
    its id is the pid of a launcher that exited): `kill -- -PGID` ends them all."""
    member_pids: list[int] = field(default_factory=list)
    """Pids of the gang's node actors, one per node."""
    restarts: int = 0
    """How many earlier generations of this replica index ended in failure."""
    kernels_active: list[str] | None = None
    """zoe kernels the engine's plugin reports patched in (`zoe_kernel_active` on its /metrics); None before the
    first scrape. Reported by the engine, never inferred from the recipe."""
    metrics_scraped_at: float | None = None
    events: list[Event] = field(default_factory=list)

    @property
    def id(self) -> str:
        return replica_id(self.deployment, self.index, self.generation)

    def state(self) -> ReplicaState:
        if self.failed_at is not None:
            return ReplicaState.FAILED
        if self.stopped_at is not None:
            return ReplicaState.STOPPED
        if self.drain_requested_at is not None:
            return ReplicaState.DRAINING
        if self.ready_at is not None:
            return ReplicaState.READY
        if self.started_at is not None:
            return ReplicaState.LOADING
        if self.placed_at is not None:
            return ReplicaState.STARTING
        return ReplicaState.PENDING

    def state_since(self) -> float:
        """When the current state began."""
        s = self.state()
        return {
            ReplicaState.FAILED: self.failed_at,
            ReplicaState.STOPPED: self.stopped_at,
            ReplicaState.DRAINING: self.drain_requested_at,
            ReplicaState.READY: self.ready_at,
            ReplicaState.LOADING: self.started_at,
            ReplicaState.STARTING: self.placed_at,
        }.get(s) or self.created_at

    def note(self, what: str, detail: str = "", at: float | None = None, keep: int = 50) -> None:
        self.events.append(Event(at if at is not None else time.time(), what, detail))
        del self.events[:-keep]

    def to_dict(self, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        d = asdict(self)
        d["id"] = self.id
        d["state"] = self.state().value
        d["state_since"] = self.state_since()
        d["uptime_s"] = (now - self.ready_at) if self.state() in (ReplicaState.READY, ReplicaState.DRAINING) else 0.0
        return d


def backoff_s(failures_in_a_row: int, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Delay before the next start after `failures_in_a_row` failures: 0, base, 2*base, 4*base, ... up to cap."""
    if failures_in_a_row <= 0:
        return 0.0
    return min(cap_s, base_s * 2 ** (failures_in_a_row - 1))
