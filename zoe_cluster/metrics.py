"""Every Prometheus metric zoe exports, defined once.

Dashboards, alert rules and tests read `METRICS`; components create their collectors on a registry they are
given (no module-level collectors, so tests build as many routers as they like):

    registry = prometheus_client.CollectorRegistry()
    m = build_metrics("router", registry)
    m.requests.labels(replica="glm/0/1", reason="prefix").inc()

To add metrics for another area, append `MetricSpec`s with that `area` and call `build_metrics(area, registry)`.
Names are prefixed `zoe_`; units are in names (`_seconds`, `_tokens`); counters end in `_total`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MetricKind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


@dataclass(frozen=True)
class MetricSpec:
    area: str
    """Component that exports it: "router", ..."""
    attr: str
    """Attribute name on the object `build_metrics` returns."""
    name: str
    """Exposed name (for counters, without the `_total` suffix prometheus-client appends)."""
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    @property
    def exposed_name(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name


METRICS: list[MetricSpec] = [
    # --- router (zoe_cluster.router) ---
    MetricSpec("router", "requests", "zoe_router_requests", "counter",
               "Requests sent to a replica, by routing reason (retries count again).", ("replica", "reason")),
    MetricSpec("router", "responses", "zoe_router_responses", "counter",
               "Responses the router returned to clients, by HTTP status code.", ("code",)),
    MetricSpec("router", "prompt_tokens", "zoe_router_prompt_tokens", "counter",
               "Prompt tokens routed (estimated from text), by replica.", ("replica",)),
    MetricSpec("router", "prefix_matched_tokens", "zoe_router_prefix_matched_tokens", "counter",
               "Prompt tokens the policy expected to hit the replica's prefix cache, by replica.", ("replica",)),
    MetricSpec("router", "estimated_hit_rate", "zoe_router_estimated_hit_rate", "gauge",
               "Prefix tokens matched / prompt tokens routed since start (the router's estimate)."),
    MetricSpec("router", "ttft", "zoe_router_ttft_seconds", "histogram",
               "Time from request arrival to the first streamed byte sent to the client.", ("model",),
               LATENCY_BUCKETS_S),
    MetricSpec("router", "e2e", "zoe_router_e2e_seconds", "histogram",
               "Time from request arrival to the end of the response.", ("model",), LATENCY_BUCKETS_S),
    MetricSpec("router", "upstream_errors", "zoe_router_upstream_errors", "counter",
               "Upstream failures by replica and kind (connect, timeout, status, midstream, stall, error_event).",
               ("replica", "kind")),
    MetricSpec("router", "retries", "zoe_router_retries", "counter",
               "Requests retried on another replica after a failure before any byte was sent.", ("replica",)),
    MetricSpec("router", "migrations", "zoe_router_migrations", "counter",
               "Streams continued on another replica after theirs failed mid-stream, by outcome "
               "(zoe_cluster.router.migration.OUTCOMES).", ("outcome",)),
    MetricSpec("router", "ejections", "zoe_router_ejections", "counter",
               "Replicas taken out of rotation, by cause (passive: errors; active: /health; stall: no bytes "
               "mid-request; slow: slower than its peers).",
               ("replica", "cause")),
    MetricSpec("router", "replica_healthy", "zoe_router_replica_healthy", "gauge",
               "1 when the replica receives new requests (healthy, not ejected, not draining).", ("replica",)),
    MetricSpec("router", "active_requests", "zoe_router_active_requests", "gauge",
               "Requests in flight on the replica as counted by the router.", ("replica",)),
    MetricSpec("router", "queue_depth", "zoe_router_queue_depth", "gauge",
               "Requests waiting in the router because every replica is saturated."),
    MetricSpec("router", "pool_spillovers", "zoe_router_pool_spillovers", "counter",
               "Requests routed outside their context pool (pool empty or saturated), by target pool.", ("pool",)),
    MetricSpec("router", "membership_version", "zoe_router_membership_version", "gauge",
               "Version of the membership the router applies."),
    MetricSpec("router", "replica_info", "zoe_router_replica_info", "gauge",
               "1 per replica in membership, labelled with its variant, context pool and state (ready/draining): "
               "the variant mix of the fleet as the router sees it.", ("replica", "variant", "pool", "state")),
    MetricSpec("router", "picture_shared", "zoe_router_picture_shared", "counter",
               "Picture sharing: prefix-index chains (kind=chains) and session routings (kind=sessions) taken from "
               "each peer router (address:port).", ("peer", "kind")),
    MetricSpec("router", "picture_share_failures", "zoe_router_picture_share_failures", "counter",
               "Picture sharing: asks of a peer router that failed or were late (that peer is skipped until the next period).",
               ("peer",)),
    MetricSpec("router", "picture_share_lag", "zoe_router_picture_share_lag_seconds", "gauge",
               "Picture sharing: time from the peer's previous answer to its latest, or to now when it did not "
               "answer (about the sharing period while it answers, growing while it does not).", ("peer",)),
    # --- recipe switching (zoe_cluster.switching, run by the deployment controller) ---
    MetricSpec("switching", "decisions", "zoe_switch_decisions", "counter",
               "Switching decisions by action (swap/hold); holds are counted once per evaluation.", ("action",)),
    MetricSpec("switching", "swaps", "zoe_switch_swaps", "counter",
               "Variant swaps by outcome: started, completed (the new variant is ready), failed.", ("outcome",)),
    MetricSpec("switching", "concurrency_estimate", "zoe_switch_concurrency_estimate", "gauge",
               "Mean requests in flight per replica over the switching window, as the switcher sees it.",
               ("replica",)),
    MetricSpec("switching", "predicted_tok_s", "zoe_switch_predicted_tok_s", "gauge",
               "Predicted decode tok/s of the replica's current variant at its concurrency (seed-table "
               "interpolation).", ("replica", "variant")),
]


def build_metrics(area: str, registry: CollectorRegistry) -> SimpleNamespace:
    """Create the collectors of `area` on `registry`; attributes are the specs' `attr` names."""
    out = SimpleNamespace()
    for spec in METRICS:
        if spec.area != area:
            continue
        if spec.kind == "counter":
            c = Counter(spec.name, spec.help, spec.labels, registry=registry)
        elif spec.kind == "gauge":
            c = Gauge(spec.name, spec.help, spec.labels, registry=registry)
        else:
            c = Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=spec.buckets or LATENCY_BUCKETS_S)
        setattr(out, spec.attr, c)
    return out


def metric_names(area: str | None = None) -> list[str]:
    """Exposed names (counters with `_total`), for dashboards and tests."""
    return [s.exposed_name for s in METRICS if area is None or s.area == area]
