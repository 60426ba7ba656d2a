"""The switching actuator: samples load, calls `decide`, and applies swaps through the controller.

It owns no policy: `decide` (pure) makes every choice. The controller gives it a `FleetControl` that reports the
replicas (variant, state, last swap) and the router's in-flight counts, and performs a drain-first swap (mark
draining in the router, wait bounded for in-flight requests, stop, start the new variant on the same GPUs, wait
ready, return it to the router). The actuator keeps the recent decisions for `zoe status` and the metrics.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from zoe_cluster.recipes import Recipe
from zoe_cluster.switching.decide import ReplicaObservation, SwitchConfig, SwitchDecision, decide
from zoe_cluster.switching.window import ConcurrencyWindow


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

    def in_flight(self) -> dict[str, float]:
        """Requests in flight per replica id, as the router counts them now."""
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
    def __init__(self, recipe: Recipe, config: SwitchConfig, control: FleetControl,
                 clock: Callable[[], float] = time.time, history: int = 100):
        self.recipe, self.config, self.control, self.clock = recipe, config, control, clock
        self.window = ConcurrencyWindow(config.window_s)
        self.history: deque[DecisionRecord] = deque(maxlen=history)
        """Swap decisions, newest last."""
        self.latest: dict[int, DecisionRecord] = {}
        """The latest decision for each replica (holds included), for `zoe status`."""
        self.swaps_started = 0

    def sample(self) -> None:
        self.window.add(self.clock(), self.control.in_flight())

    def step(self) -> list[SwitchDecision]:
        """Sample, decide, apply. Returns every decision of this step (holds included)."""
        self.sample()
        now = self.clock()
        fleet = self.control.replicas()
        conc = {r.index: self.window.mean(r.replica_id, now) for r in fleet}
        obs = [ReplicaObservation(r.index, r.variant, r.state, conc[r.index], r.last_swap_at) for r in fleet]  # type: ignore[arg-type]
        decisions = decide(self.recipe, obs, self.config, now)
        for d in decisions:
            record = DecisionRecord(now, d, conc[d.replica])
            self.latest[d.replica] = record
            if d.action == "swap":
                self.history.append(record)
                self.control.swap(d.replica, d.variant, d.reason)
                self.swaps_started += 1
        return decisions

    def estimate(self) -> dict[int, float]:
        now = self.clock()
        return {r.index: self.window.mean(r.replica_id, now) for r in self.control.replicas()}
