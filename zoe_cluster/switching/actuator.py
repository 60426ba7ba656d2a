"""The switching actuator: samples load, calls `decide`, and applies swaps through the controller.

It owns no policy: `decide` (pure) makes every choice. The controller gives it a `FleetControl` that reports the
replicas (variant, state, last swap) and the router's load (`LoadReport`), and performs a drain-first swap (mark
draining in the router, wait bounded for in-flight requests, stop, start the new variant on the same GPUs, wait
ready, return it to the router). The actuator keeps the recent decisions for `zoe status` and the metrics.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Protocol

from zoe_cluster.recipes import Recipe
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.switching.decide import decide
from zoe_cluster.switching.vocabulary import ReplicaObservation, SwitchConfig, SwitchDecision
from zoe_cluster.switching.window import ConcurrencyWindow, RateWindow


@dataclass(frozen=True)
class FleetReplica:
    index: int
    replica_id: str
    """'deployment/index/generation': the router's key for the replica's counts."""
    variant: str
    state: str
    last_swap_at: float | None


class FleetControl(Protocol):
    def replicas(self) -> list[FleetReplica]: ...

    def load(self) -> LoadReport:
        """The router's counts now: in flight per replica id and, read when the config names classes, in flight and
        uncached prompt tokens admitted so far per service class."""
        ...

    def swap(self, index: int, variant: str, reason: str) -> None:
        """Start a drain-first swap of replica `index` to `variant` (returns once it has begun)."""
        ...


@dataclass(frozen=True)
class DecisionRecord:
    at: float
    decision: SwitchDecision
    concurrency: float


class SwitchActuator:
    def __init__(self, recipe: Recipe, config: SwitchConfig, control: FleetControl | None = None,
                 clock: Callable[[], float] = time.time, history: int = 100):
        self.recipe, self.config, self.control, self.clock = recipe, config, control, clock
        self.window = ConcurrencyWindow(config.window_s)
        self.class_window = ConcurrencyWindow(config.window_s)
        self.prefill_window = RateWindow(config.window_s)
        self.prefill_tok_s: dict[str, float] | None = None
        """The latest uncached prompt tokens/s per class (fleet-wide), when the driver counts them."""
        self.demand: dict[str, float] | None = None
        """The latest per-class concurrency estimate (fleet-wide), when classes are configured."""
        self.history: deque[DecisionRecord] = deque(maxlen=history)
        """Swap decisions, newest last."""
        self.latest: dict[int, DecisionRecord] = {}
        """The latest decision for each replica (holds included), for `zoe status`."""
        self.swaps_started = 0

    def step(self) -> list[SwitchDecision]:
        """Sample, decide, apply through `control`. Returns every decision of this step (holds included)."""
        load = self.control.load()
        by_class = load.in_flight_by_class if self.config.classes else None
        prefill = load.prefill_tokens_by_class if by_class is not None else None
        decisions = self.observe(self.control.replicas(), load.in_flight, by_class, prefill)
        for d in decisions:
            if d.action == "swap":
                self.control.swap(d.replica, d.variant, d.reason)
        return decisions

    def observe(self, fleet: list[FleetReplica], in_flight: Mapping[str, float],
                in_flight_by_class: Mapping[str, float] | None = None,
                prefill_tokens_by_class: Mapping[str, float] | None = None) -> list[SwitchDecision]:
        """Sample `in_flight` (and the per-class counts and prompt-token counters, when given), decide over
        `fleet`, and record; the caller applies the swaps (async drivers)."""
        now = self.clock()
        self.window.add(now, in_flight)
        conc = {r.index: self.window.mean(r.replica_id, now) for r in fleet}
        if in_flight_by_class is not None:
            sample = {c.name: float(in_flight_by_class.get(c.name, 0.0)) for c in self.config.classes}
            self.class_window.add(now, sample)
            self.demand = {c: self.class_window.mean(c, now) for c in sample}
        if prefill_tokens_by_class is not None:
            self.prefill_window.add(now, prefill_tokens_by_class)
            self.prefill_tok_s = self.prefill_window.rates()
        obs = [ReplicaObservation(r.index, r.variant, r.state, conc[r.index], r.last_swap_at) for r in fleet]  # type: ignore[arg-type]
        decisions = decide(self.recipe, obs, self.config, now,
                           self.demand if in_flight_by_class is not None else None,
                           self.prefill_tok_s if prefill_tokens_by_class is not None else None)
        for d in decisions:
            record = DecisionRecord(now, d, conc[d.replica])
            self.latest[d.replica] = record
            if d.action == "swap":
                self.history.append(record)
                self.swaps_started += 1
        return decisions

    def report(self) -> dict:
        """What `zoe status` shows: the config, each replica's latest decision with its reason, recent swaps."""
        row = lambda r: {"at": r.at, "replica": r.decision.replica, "action": r.decision.action,  # noqa: E731
                         "variant": r.decision.variant, "concurrency": round(r.concurrency, 2),
                         "reason": r.decision.reason}
        return {"config": self.config.model_dump(), "swaps_started": self.swaps_started, "demand": self.demand,
                "latest": [row(self.latest[i]) for i in sorted(self.latest)],
                "recent_swaps": [row(r) for r in list(self.history)[-10:]]}
