"""The switching loop the deployment controller runs: every `interval_s` it asks the controller for its fleet and
the router's in-flight counts, lets the `SwitchActuator` (and so `decide`) choose, starts the chosen drain-first
swaps through `controller.swap_replica`, and exports the switching metrics (zoe_cluster.metrics, area
"switching") on the registry it is given.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from zoe_cluster.metrics import build_metrics
from zoe_cluster.recipes import Recipe
from zoe_cluster.switching.actuator import FleetReplica, SwitchActuator
from zoe_cluster.switching.predict import replica_tok_s
from zoe_cluster.switching.vocabulary import SwitchConfig, SwitchDecision

log = logging.getLogger(__name__)


class SwitchableController(Protocol):
    def fleet(self) -> list[dict[str, Any]]: ...

    async def in_flight(self) -> dict[str, float]: ...

    async def swap_replica(self, index: int, variant: str, wait: bool = True, timeout_s: float | None = None,
                           reason: str = "") -> dict: ...


class SwitchLoop:
    def __init__(self, recipe: Recipe, config: SwitchConfig, controller: SwitchableController,
                 registry: CollectorRegistry):
        self.recipe, self.config, self.controller = recipe, config, controller
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
        fleet = [FleetReplica(d["index"], d["replica_id"], d["variant"], d["state"], d["last_swap_at"])
                 for d in self.controller.fleet()]
        by_class = prefill = None  # per-class counts steer a mix (switching.mix); without them: per replica
        if self.config.classes and hasattr(self.controller, "in_flight_by_class"):
            by_class = await self.controller.in_flight_by_class()
            if by_class is not None and hasattr(self.controller, "prefill_tokens_by_class"):
                prefill = await self.controller.prefill_tokens_by_class()
        decisions = self.actuator.observe(fleet, await self.controller.in_flight(), by_class, prefill)
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
            await self.controller.swap_replica(d.replica, d.variant, wait=True, reason=d.reason)
        except Exception as e:
            log.warning("swap of replica %s to %s failed: %s", d.replica, d.variant, e)
            self.metrics.swaps.labels(outcome="failed").inc()
        else:
            self.metrics.swaps.labels(outcome="completed").inc()

    def report(self) -> dict:
        return self.actuator.report()
