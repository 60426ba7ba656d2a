"""The deployment's load as its routers count it, and the live side of the switcher's fleet control.

`FleetLoadReader` sums the deployment's own router and, under the Helm chart, every router pod of the release
(each counts only the traffic it routed) into one `FleetLoad`. `LiveFleet` is the `LiveFleetControl` the
switching loop drives: the replicas the supervisor runs, that load, and the controller's drain-first swap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from zoe_cluster.cluster.router_link import RouterLink
from zoe_cluster.switching.actuator import FleetReplica
from zoe_cluster.switching.vocabulary import FleetLoad

log = logging.getLogger(__name__)


def summed(*parts: dict[str, float] | None) -> dict[str, float] | None:
    """Counts of several routers added key by key; None when none of them counts."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    out: dict[str, float] = {}
    for p in given:
        for k, n in p.items():
            out[k] = out.get(k, 0.0) + n
    return out


class FleetLoadReader:
    """Reads the routers' counts: `router()` is the deployment's own router (None when it runs none), `fanout`
    the Helm release's router pods (`zoe_cluster.k8s.MembershipFanout`, None off Kubernetes)."""

    def __init__(self, router: Callable[[], RouterLink | None], fanout=None):
        self.router, self.fanout = router, fanout

    async def read(self) -> FleetLoad:
        router = self.router()
        own = await router.load() if router is not None else None
        pods = await self._pods()
        return FleetLoad(
            in_flight=summed(own.in_flight if own else None, pods.in_flight if pods else None) or {},
            in_flight_by_class=summed(own.in_flight_by_class if own else None,
                                      pods.in_flight_by_class if pods else None),
            prefill_tokens_by_class=summed(own.prefill_tokens_by_class if own else None,
                                           pods.prefill_tokens_by_class if pods else None),
        )

    async def _pods(self) -> FleetLoad | None:
        if self.fanout is None:
            return None
        try:
            counts = await asyncio.to_thread(self.fanout.load)
        except Exception:  # noqa: BLE001 - the Kubernetes API or a pod may be away; the own router's counts stand
            log.warning("router pods' load could not be read", exc_info=True)
            return None
        return FleetLoad(counts["active_by_replica"] or {}, counts["in_flight_by_class"],
                         counts["prefill_tokens_by_class"])


class LiveFleet:
    """The switching loop's `LiveFleetControl` for a running deployment."""

    def __init__(self, replicas: Callable[[], list[FleetReplica]], load: FleetLoadReader,
                 swap: Callable[[int, str, str], Awaitable[object]]):
        self._replicas, self._load, self._swap = replicas, load, swap

    def replicas(self) -> list[FleetReplica]:
        return self._replicas()

    async def load(self) -> FleetLoad:
        return await self._load.read()

    async def swap(self, index: int, variant: str, reason: str) -> None:
        await self._swap(index, variant, reason)
