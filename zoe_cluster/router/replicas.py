"""The router's replicas: membership applied to `ReplicaView`s, health facts, ejection and recovery.

Facts are stored (consecutive failures, last health check, ejected_until); whether a replica receives new
requests is derived (`routable`). The controller is the single writer of membership (`apply`); the router's
own observations only eject and recover replicas, never add or remove them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace

from zoe_cluster.router.membership import MemberReplica, Membership
from zoe_cluster.router.slowness import LatencyFacts, judge_due, mark_slow, probe_due, record_sample, slow_replicas
from zoe_cluster.routing.context import ReplicaView
from zoe_cluster.routing.policy import Policy


class StaleMembership(ValueError):
    """A membership push not newer than the one applied."""


@dataclass
class RoutedReplica:
    """The router's record of one member replica: its membership entry, its load view, and its health and
    latency bookkeeping (the lifecycle state of a replica is `zoe_cluster.replica_state.ReplicaState`)."""

    member: MemberReplica
    view: ReplicaView
    consecutive_failures: int = 0
    """Upstream failures in a row (passive health)."""
    health_failures: int = 0
    """Failed active /health checks in a row."""
    last_health_at: float | None = None
    last_health_ok: bool | None = None
    ejected_until: float = 0.0
    """Monotonic time until which a passive ejection holds."""
    removed: bool = False
    """Left membership (in-flight requests may still hold this object)."""
    served: frozenset[str] = field(default_factory=frozenset)
    latency: LatencyFacts = field(default_factory=LatencyFacts.empty)
    """Its latest times per output token, and since when it is judged slow (`router.slowness`)."""
    last_byte_at: float = 0.0
    """Monotonic time any of its streams last sent a byte (stall detection)."""
    decoding_streams: int = 0
    """Streams through the router past their first event (stall detection needs at least one)."""
    hung: bool = False
    """A request found it hung (`router.slowness.stall_verdict`); cleared by its next stream event or a passed
    /health check. Requests still waiting on it give up at their next check."""
    slow_reason: str | None = None

    @property
    def id(self) -> str:
        return self.member.id

    def routable(self, now: float) -> bool:
        return not self.removed and self.view.routable and now >= self.ejected_until


def _serves(st: RoutedReplica, model: str, default_models: frozenset[str]) -> bool:
    """Whether the replica serves `model`: its declared models, else the router's list (empty: any)."""
    return model in st.served if st.served else (not default_models or model in default_models)


def _view(m: MemberReplica) -> ReplicaView:
    return ReplicaView(
        replica_id=m.id,
        url=m.url,
        pool=m.pool,
        variant=m.variant,
        draining=m.state == "draining",
        kv_capacity_tokens=m.kv_capacity_tokens,
        host_kv_capacity_tokens=m.host_kv_capacity_tokens,
        max_active_requests=m.max_active_requests,
    )


class ReplicaSet:
    """Replicas by id, with the policy told when one leaves."""

    def __init__(
        self,
        policy: Policy,
        metrics: SimpleNamespace,
        *,
        passive_failures: int,
        eject_s: float,
        unhealthy_after: int,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
        slow_factor: float | None = None,
        slow_min_samples: int = 5,
        slow_probe_s: float = 2.0,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.passive_failures = passive_failures
        self.eject_s = eject_s
        self.unhealthy_after = unhealthy_after
        self.clock = clock
        self.on_change = on_change
        self.slow_factor, self.slow_min_samples = slow_factor, slow_min_samples
        self.slow_probe_s = slow_probe_s
        self._judged_at = float("-inf")
        self.version: int | None = None
        self.membership: Membership | None = None
        self.by_id: dict[str, RoutedReplica] = {}

    def __iter__(self):
        return iter(list(self.by_id.values()))

    def apply(self, membership: Membership) -> dict[str, list[str]]:
        """Make the replica set equal `membership`; returns the ids added, updated and removed."""
        if self.version is not None and membership.version <= self.version:
            if membership.version == self.version and membership == self.membership:
                return {"added": [], "updated": [], "removed": []}
            raise StaleMembership(
                f"membership version {membership.version} is not newer than the applied version {self.version}"
            )
        added, updated, removed = [], [], []
        wanted = {m.id: m for m in membership.replicas}
        for rid, st in list(self.by_id.items()):
            m = wanted.get(rid)
            if m is None or m.url != st.member.url:
                self._remove(st)
                removed.append(rid)
        for rid, m in wanted.items():
            st = self.by_id.get(rid)
            if st is None:
                self.by_id[rid] = RoutedReplica(member=m, view=_view(m), served=frozenset(m.models))
                added.append(rid)
            elif st.member != m:
                v = st.view
                v.pool, v.variant, v.draining = m.pool, m.variant, m.state == "draining"
                v.kv_capacity_tokens, v.max_active_requests = m.kv_capacity_tokens, m.max_active_requests
                v.host_kv_capacity_tokens = m.host_kv_capacity_tokens
                st.member, st.served = m, frozenset(m.models)
                updated.append(rid)
        self.version, self.membership = membership.version, membership
        self.metrics.membership_version.set(membership.version)
        self.metrics.replica_info.clear()
        for m in membership.replicas:
            self.metrics.replica_info.labels(replica=m.id, variant=m.variant, pool=m.pool, state=m.state).set(1)
        self.refresh_gauges()
        self.on_change()
        return {"added": added, "updated": updated, "removed": removed}

    def _remove(self, st: RoutedReplica) -> None:
        st.removed = True
        del self.by_id[st.id]
        self.policy.on_replica_removed(st.id)
        for g in (self.metrics.replica_healthy, self.metrics.active_requests):
            try:
                g.remove(st.id)
            except KeyError:
                pass

    def set_draining(self, replica_id: str, draining: bool) -> RoutedReplica:
        st = self.by_id[replica_id]  # KeyError: unknown replica
        st.view.draining = draining
        self.refresh_gauges()
        self.on_change()
        return st

    def candidates(self, model: str, default_models: frozenset[str], exclude: Iterable[str] = ()) -> list[RoutedReplica]:
        """Replicas that take new requests for `model` now (exclude: ids already tried for this request). Replicas
        judged slow are left out while others remain."""
        now = self.clock()
        ex = set(exclude)
        out = [st for st in self.by_id.values() if st.routable(now) and st.id not in ex
               and _serves(st, model, default_models)]
        fast = [st for st in out if st.slow_reason is None]
        return fast or out

    def probe_target(self, model: str, default_models: frozenset[str], exclude: Iterable[str] = ()
                     ) -> RoutedReplica | None:
        """A slow replica whose recovery probe is due (it gets the next request), or None."""
        now = self.clock()
        ex = set(exclude)
        for st in self.by_id.values():
            if (st.slow_reason is not None and st.routable(now) and st.id not in ex
                    and _serves(st, model, default_models) and probe_due(st.latency, now, self.slow_probe_s)):
                st.latency.last_probe_at = now
                return st
        return None

    # --- latency: slow replicas ---
    def record_latency(self, st: RoutedReplica, measure: str, sample_s: float, probe: bool) -> None:
        """One finished request's time per output token (`measure` of `router.slowness.MEASURES`), then the
        slow set judged again."""
        if st.removed or self.slow_factor is None:
            return
        record_sample(st.latency, measure, sample_s, self.slow_min_samples, probe=probe)
        now = self.clock()
        if judge_due(self._judged_at, now, probe):
            self.judge_slow()

    def judge_slow(self) -> None:
        """Apply `slow_replicas` to the current facts, replicas compared with peers of the same pool and variant
        (a long-context pool or another variant may be slower by design): mark new slow replicas, clear
        recovered ones."""
        if self.slow_factor is None:
            return
        now = self.clock()
        self._judged_at = now
        groups: dict[tuple[str, str], dict] = {}
        for rid, st in self.by_id.items():
            groups.setdefault((st.view.pool, st.member.variant), {})[rid] = st.latency
        slow: dict[str, str] = {}
        for group in groups.values():
            slow.update(slow_replicas(group, self.slow_factor, self.slow_min_samples))
        was_slow = [rid for rid, st in self.by_id.items() if st.slow_reason is not None]
        newly, recovered = mark_slow({rid: st.latency for rid, st in self.by_id.items()}, was_slow, slow, now)
        for rid in newly:
            self.metrics.ejections.labels(replica=rid, cause="slow").inc()
        for rid, st in self.by_id.items():
            st.slow_reason = slow.get(rid)
        if newly or recovered:
            self.on_change()

    def models(self) -> set[str]:
        out: set[str] = set()
        for st in self.by_id.values():
            out |= st.served
        return out

    # --- passive health ---
    def record_success(self, st: RoutedReplica) -> None:
        st.consecutive_failures = 0

    def record_failure(self, st: RoutedReplica, kind: str) -> None:
        """Count an upstream failure; `passive_failures` in a row eject the replica for `eject_s`. A stall (the
        whole replica silent, `router.slowness.stall_verdict`) ejects at once."""
        if st.removed:  # it left membership while the request ran: no series for a replica that is gone
            return
        self.metrics.upstream_errors.labels(replica=st.id, kind=kind).inc()
        st.consecutive_failures += 1
        now = self.clock()
        if kind == "stall":
            st.hung = True
        if (kind == "stall" or st.consecutive_failures >= self.passive_failures) and now >= st.ejected_until:
            st.ejected_until = now + self.eject_s
            st.consecutive_failures = 0
            self.metrics.ejections.labels(replica=st.id, cause="stall" if kind == "stall" else "passive").inc()
            self.refresh_gauges()

    # --- active health ---
    def record_health(self, st: RoutedReplica, ok: bool) -> None:
        st.last_health_at, st.last_health_ok = time.time(), ok
        was = st.view.healthy
        if ok:
            st.health_failures = 0
            st.hung = False
            if not was:
                st.view.healthy = True
                st.ejected_until = 0.0
                st.consecutive_failures = 0
                self.refresh_gauges()
                self.on_change()
        else:
            st.health_failures += 1
            if was and st.health_failures >= self.unhealthy_after:
                st.view.healthy = False
                self.metrics.ejections.labels(replica=st.id, cause="active").inc()
                self.refresh_gauges()

    def refresh_gauges(self) -> None:
        now = self.clock()
        for st in self.by_id.values():
            self.metrics.replica_healthy.labels(replica=st.id).set(1 if st.routable(now) else 0)

    def describe(self) -> list[dict]:
        now = self.clock()
        out = []
        for st in self.by_id.values():
            v = st.view
            out.append(
                {
                    **st.member.model_dump(),
                    "draining": v.draining,
                    "healthy": v.healthy,
                    "routable": st.routable(now),
                    "slow": st.slow_reason,
                    "tpot_ms": None if st.latency.tpot_s.value is None else round(st.latency.tpot_s.value * 1e3, 3),
                    "ejected_for_s": max(0.0, round(st.ejected_until - now, 3)),
                    "active_requests": v.active_requests,
                    "queued_prefill_tokens": v.queued_prefill_tokens,
                    "active_decode_tokens": v.active_decode_tokens,
                    "last_health_ok": st.last_health_ok,
                    "engine_stats_at": v.stats.scraped_at if v.stats else None,
                }
            )
        return out
