"""Class-aware routing for mixed fleets: the `slo` policy, a filter in front of the configured policy.

Requests carry a service class (`RequestContext.slo_class`, from the `x-zoe-slo` header; None means
`default_class`). Each class lists, in order of preference, the variants that can serve it within its objective
and for each the most requests a replica of that variant may hold while the objective still holds:

    classes = {"interactive": {"fp8-tp8-nightly": 6},                      # only lightly loaded FP8 is fast enough
               "standard":    {"mxfp4-tp8": 38, "fp8-tp8-nightly": 35}}    # MXFP4 first, FP8 when MXFP4 is full

(`zoe_cluster.switching.classes.slo_policy_config` derives these limits from the recipe's measured profiles.)
For a request of class c the filter tries c's variants in order; a replica is open for it when it runs that
variant, holds fewer than the limit, is not saturated, and taking one more request keeps every class it already
serves within that class's own limit on this replica (so bulk traffic does not pile onto a replica that holds
latency-sensitive requests). The inner policy (`inner`, default `prefix`) chooses among the open replicas of the
first variant that has any. When none is open the request spills over: to the replicas that stay within the
limits of the classes they serve, else to all; the decision then says `slo_spill`. A class with no entry routes
as the inner policy would. One implementation serves the live router and `zoe sim replay`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import Field, model_validator

from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.routing.policy import Policy, PolicyConfig, get_policy, validate_policy_config

SLO_HEADER = b"x-zoe-slo"
"""Request header naming the service class (e.g. `x-zoe-slo: interactive`)."""


def slo_class_from_headers(headers: Mapping[bytes, bytes]) -> str | None:
    """The service class a live request asks for (`x-zoe-slo`), or None."""
    value = headers.get(SLO_HEADER)
    return value.decode("latin-1").strip() or None if value else None


class SloConfig(PolicyConfig):
    inner: str = Field(default="prefix", description="Policy that chooses among the replicas the filter leaves.")
    inner_config: dict[str, Any] = Field(default_factory=dict, description="Tunables of the inner policy.")
    classes: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description="Class -> {variant: most requests a replica of that variant holds while the class's objective "
        "holds}, variants in order of preference.",
    )
    default_class: str = Field(default="standard", min_length=1, description="Class of requests that name none.")

    @model_validator(mode="after")
    def _valid(self) -> "SloConfig":
        if self.inner == "slo":
            raise ValueError("inner: the slo filter cannot wrap itself")
        validate_policy_config(self.inner, self.inner_config)
        for name, limits in self.classes.items():
            bad = [v for v, n in limits.items() if n < 1]
            if bad:
                raise ValueError(f"classes.{name}: limits must be at least 1 (drop the variant instead): {bad}")
        return self


class SloPolicy(Policy, name="slo"):
    """Prefer replicas whose variant suits the request's class; spill over when they are full."""

    Config = SloConfig
    config: SloConfig

    def __init__(self, config: SloConfig | None = None) -> None:
        super().__init__(config)
        self.inner = get_policy(self.config.inner, **self.config.inner_config)
        self._active: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        """Requests in flight per replica and class (this policy's own count, what `_keeps_limits` reads; the
        fleet-wide per-class load is the router's `routing.accounting.LoadLedger`'s)."""

    def class_of(self, ctx: RequestContext) -> str:
        """The class a request counts in: the one it names when this filter knows it, else the default class."""
        return ctx.slo_class if ctx.slo_class in self.config.classes else self.config.default_class

    def _keeps_limits(self, r: ReplicaView) -> bool:
        """One more request on r keeps every class r serves within its limit for r's variant."""
        after = r.active_requests + 1
        for cls, n in self._active.get(r.replica_id, {}).items():
            limit = self.config.classes.get(cls, {}).get(r.variant)
            if n > 0 and limit is not None and after > limit:
                return False
        return True

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        tiers = self.config.classes.get(self.class_of(ctx))
        if not tiers:
            return self.inner.select(ctx, replicas)
        for variant, limit in tiers.items():
            home = [r for r in replicas if r.variant == variant and r.active_requests < limit and not r.saturated
                    and self._keeps_limits(r)]
            if home:
                return self.inner.select(ctx, home)
        others = [r for r in replicas if not r.saturated and self._keeps_limits(r)] or replicas
        return replace(self.inner.select(ctx, others), reason="slo_spill", spilled=True)

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        self._active[decision.replica_id][self.class_of(ctx)] += 1
        self.inner.on_routed(ctx, decision)

    def on_finished(self, ctx: RequestContext, replica_id: str, ok: bool) -> None:
        counts = self._active.get(replica_id)
        if counts is not None:
            cls = self.class_of(ctx)
            counts[cls] = max(0, counts[cls] - 1)
        self.inner.on_finished(ctx, replica_id, ok)

    def on_replica_removed(self, replica_id: str) -> None:
        self._active.pop(replica_id, None)
        self.inner.on_replica_removed(replica_id)

    def on_cache_evicted(self, replica_id: str, tokens: int | None) -> None:
        self.inner.on_cache_evicted(replica_id, tokens)

    def active_by_class(self, replica_id: str) -> dict[str, int]:
        """Requests in flight on `replica_id` per class, as this policy counted them."""
        return {c: n for c, n in self._active.get(replica_id, {}).items() if n > 0}

    def describe(self) -> dict[str, Any]:
        """Debug output (`GET /admin/membership`); the load the switcher reads is `GET /admin/load`."""
        return {**super().describe(), "inner_policy": self.inner.describe(),
                "active_by_class": {rid: self.active_by_class(rid) for rid in self._active}}
