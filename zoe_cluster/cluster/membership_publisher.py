"""Who serves, as the router sees it: build the typed `Membership` and push it to every router of the deployment.

The controller is membership's single writer. Each change of who serves (a replica ready, draining, gone) is a
new version, pushed to the deployment's own router and, under the Helm chart, to every router pod of the release
(`zoe_cluster.k8s.MembershipFanout`, which also catches up pods that missed a push: `resync`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from zoe_cluster.cluster.lifecycle import ReplicaFacts
from zoe_cluster.engines.base import kv_event_ports
from zoe_cluster.cluster.router_link import RouterLink
from zoe_cluster.cluster.spec import DeploymentSpec
from zoe_cluster.recipes.profile import host_kv_tokens
from zoe_cluster.replica_state import ReplicaState
from zoe_cluster.router.membership import KvEventSource, MemberReplica, Membership

log = logging.getLogger(__name__)

RESYNC_S = 5.0
"""How often router pods that do not hold the latest membership are caught up."""
ROUTED = (ReplicaState.READY, ReplicaState.DRAINING)


def build_membership(spec: DeploymentSpec, version: int, replicas: Iterable[ReplicaFacts]) -> Membership:
    """The router's view of `replicas`: every ready or draining one with an engine URL, with its variant, pool and
    the capacities the router sizes its admission and prefix index to."""
    adapter = spec.adapter()
    members = []
    for f in replicas:
        state = f.state()
        if f.url is None or state not in ROUTED:
            continue
        members.append(MemberReplica(
            id=f.id, url=f.url, pool=f.pool, variant=f.variant, state=state.value, engine=spec.engine,
            models=[spec.recipe.served_model_name],
            max_active_requests=spec.recipe.variant(f.variant).max_num_seqs,
            kv_capacity_tokens=adapter.kv_capacity_tokens(spec.recipe, f.variant, spec.engine_env),
            host_kv_capacity_tokens=host_kv_tokens(spec.recipe, f.variant, spec.host_kv_gb),
            max_context_tokens=spec.max_model_len or spec.recipe.architecture.max_context_tokens,
            kv_events=kv_event_sources(f, spec.recipe.variant(f.variant).parallelism.dp),
        ))
    return Membership(version=version, replicas=members)


def kv_event_sources(f: ReplicaFacts, dp_size: int) -> list[KvEventSource]:
    """The KV-event publishers replica `f`'s engine binds (one per data-parallel rank), as routers reach them."""
    if f.kv_events_port is None or f.url is None:
        return []
    host = urlsplit(f.url).hostname
    return [KvEventSource(endpoint=f"tcp://{host}:{pub}", replay_endpoint=f"tcp://{host}:{replay}")
            for pub, replay in kv_event_ports(f.kv_events_port, dp_size)]


class MembershipPublisher:
    """Pushes membership versions: `spec()` and `replicas()` are read at each build, `router()` is the deployment's
    own router (None without one), `fanout` the release's router pods (None off Kubernetes)."""

    def __init__(self, spec: Callable[[], DeploymentSpec], replicas: Callable[[], Iterable[ReplicaFacts]],
                 router: Callable[[], RouterLink | None], fanout=None):
        self.spec, self.replicas, self.router, self.fanout = spec, replicas, router, fanout
        # Versions stay monotonic across controller restarts (a router that outlived us rejects older pushes).
        self.version = int(time.time() * 1000)
        self._lock = asyncio.Lock()
        self._last_resync = 0.0

    def current(self) -> Membership:
        return build_membership(self.spec(), self.version, self.replicas())

    async def publish(self) -> None:
        """A new version of who serves now, to the release's router pods and the own router (3 tries)."""
        self.version += 1
        if self.fanout is not None:
            try:
                await asyncio.to_thread(self.fanout.publish, self.current())
            except Exception:  # noqa: BLE001 - a pod that cannot be reached now is caught up by resync()
                log.exception("pushing membership to the release's router pods failed")
        await self.push_to_router()

    async def push_to_router(self) -> None:
        """The current version to the own router (again, after it restarted)."""
        router = self.router()
        if router is None:
            return
        async with self._lock:
            for attempt in range(3):
                if await router.push(self.current()):
                    return
                await asyncio.sleep(0.2 * (attempt + 1))

    async def resync(self) -> None:
        """Catch up router pods that missed a push (new or restarted pods), at most every RESYNC_S."""
        if self.fanout is None or time.monotonic() - self._last_resync <= RESYNC_S:
            return
        self._last_resync = time.monotonic()
        await asyncio.to_thread(self.fanout.resync)


def k8s_fanout():
    """The membership fan-out to the Helm release's router pods when running under the chart (ZOE_K8S_*), else
    None."""
    try:
        from zoe_cluster.k8s import fanout_from_env

        return fanout_from_env()
    except Exception:  # noqa: BLE001 - no in-cluster credentials: not under the chart after all
        log.exception("ZOE_K8S_* is set but the Kubernetes API is not reachable; router pods get no membership")
        return None
