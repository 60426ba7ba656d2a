"""The deployment's load as its routers count it, and the live side of the switcher's fleet control.

`FleetLoadReader` sums the `LoadReport` of the deployment's own router and, under the Helm chart, of every router
pod of the release (each counts only the traffic it routed) into the fleet's report. `LiveFleet` is the
`LiveFleetControl` the switching loop drives: the replicas the supervisor runs, that load, and the controller's
drain-first swap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from zoe_cluster.cluster.router_link import RouterLink
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.switching.actuator import FleetReplica

log = logging.getLogger(__name__)


class FleetLoadReader:
    """Reads the routers' counts: `router()` is the deployment's own router (None when it runs none), `fanout`
    the Helm release's router pods (`zoe_cluster.k8s.MembershipFanout`, None off Kubernetes)."""

    def __init__(self, router: Callable[[], RouterLink | None], fanout=None):
        self.router, self.fanout = router, fanout

    async def read(self) -> LoadReport | None:
        """The sum of the reports of the routers that answered; None when none did."""
        router = self.router()
        own = await router.load() if router is not None else None
        answered = [r for r in (own, await self._pods()) if r is not None]
        return LoadReport.summed(answered) if answered else None

    async def _pods(self) -> LoadReport | None:
        if self.fanout is None:
            return None
        try:
            return await asyncio.to_thread(self.fanout.load)
        except Exception:  # noqa: BLE001 - the Kubernetes API may be away; the own router's counts stand
            log.warning("router pods' load could not be read", exc_info=True)
            return None


class LiveFleet:
    """The switching loop's `LiveFleetControl` for a running deployment."""

    def __init__(self, replicas: Callable[[], list[FleetReplica]], load: FleetLoadReader,
                 swap: Callable[[int, str, str], Awaitable[object]]):
        self._replicas, self._load, self._swap = replicas, load, swap

    def replicas(self) -> list[FleetReplica]:
        return self._replicas()

    async def load(self) -> LoadReport | None:
        return await self._load.read()

    async def swap(self, index: int, variant: str, reason: str) -> None:
        await self._swap(index, variant, reason)
