"""The switching loop the deployment controller runs: every `interval_s` it asks its `LiveFleetControl` for the
replicas and the routers' load (`routing.load_report.LoadReport`), lets the `SwitchActuator` (and so `decide`)
choose, starts the chosen drain-first swaps through the fleet control, and exports the switching metrics
(zoe_cluster.metrics, area "switching") on the registry it is given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from prometheus_client import CollectorRegistry

from zoe_cluster.metrics import build_metrics
from zoe_cluster.recipes import Recipe
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.switching.actuator import FleetReplica, SwitchActuator
from zoe_cluster.switching.predict import replica_tok_s
from zoe_cluster.switching.vocabulary import SwitchConfig, SwitchDecision

log = logging.getLogger(__name__)


class LiveFleetControl(Protocol):
    """What the loop asks of a live deployment (`zoe_cluster.cluster.fleet_load.LiveFleet` is the one)."""

    def replicas(self) -> list[FleetReplica]: ...

    async def load(self) -> LoadReport | None:
        """The routers' counts now, summed over the routers that answered; None when none did."""
        ...

    async def swap(self, index: int, variant: str, reason: str) -> None:
        """A drain-first swap of replica `index` to `variant`; returns once the new generation is ready, raises
        when it failed or timed out."""
        ...


class SwitchLoop:
    def __init__(self, recipe: Recipe, config: SwitchConfig, fleet: LiveFleetControl, registry: CollectorRegistry):
        self.recipe, self.config, self.fleet = recipe, config, fleet
        self.actuator = SwitchActuator(recipe, config)
        self.metrics = build_metrics("switching", registry)
        self._swaps: set[asyncio.Task] = set()

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.tick()
            except Exception:  # a bad tick must not end switching for the deployment's lifetime
                log.exception("switching tick failed")

    async def tick(self) -> list[SwitchDecision]:
        fleet = self.fleet.replicas()
        load = await self.fleet.load()
        # per-class counts steer a mix (switching.mix); without them (no classes, or no router answered): per replica
        by_class = prefill = None
        if load is not None and self.config.classes:
            by_class, prefill = load.in_flight_by_class, load.prefill_tokens_by_class
        decisions = self.actuator.observe(fleet, load.in_flight if load is not None else {}, by_class, prefill)
        by_index = {r.index: r for r in fleet}
        self.metrics.concurrency_estimate.clear()
        self.metrics.predicted_tok_s.clear()
        for d in decisions:
            self.metrics.decisions.labels(action=d.action).inc()
            r = by_index[d.replica]
            conc = self.actuator.latest[d.replica].concurrency
            self.metrics.concurrency_estimate.labels(replica=r.replica_id).set(conc)
            self.metrics.predicted_tok_s.labels(replica=r.replica_id, variant=r.variant).set(
                replica_tok_s(self.recipe, r.variant, conc))
            if d.action == "swap":
                self.metrics.swaps.labels(outcome="started").inc()
                task = asyncio.create_task(self._swap(d))
                self._swaps.add(task)
                task.add_done_callback(self._swaps.discard)
        return decisions

    async def _swap(self, d: SwitchDecision) -> None:
        try:
            await self.fleet.swap(d.replica, d.variant, d.reason)
        except Exception as e:
            log.warning("swap of replica %s to %s failed: %s", d.replica, d.variant, e)
            self.metrics.swaps.labels(outcome="failed").inc()
        else:
            self.metrics.swaps.labels(outcome="completed").inc()

    def report(self) -> dict:
        return self.actuator.report()
