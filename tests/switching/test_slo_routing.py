"""The router's `slo` filter: class-preferred variants, limits that protect tight classes, spill-over."""

from __future__ import annotations

import pytest

from zoe_cluster.routing import PolicyConfigError, ReplicaView, RequestContext, get_policy
from zoe_cluster.routing.slo import SloPolicy, slo_class_from_headers

A, B = "fp8-tp8-nightly", "mxfp4-tp8"
LIMITS = {"interactive": {A: 2}, "standard": {B: 3, A: 3}}


def ctx(i, cls=None):
    return RequestContext(f"r{i}", "glm", (1000 + i,), 512, 64, slo_class=cls)


def fleet():
    return [ReplicaView("d/0/0", "http://a", variant=A), ReplicaView("d/1/0", "http://b", variant=B),
            ReplicaView("d/2/0", "http://c", variant=B)]


def route(pol, views, c):
    d = pol.select(c, [v for v in views if v.routable])
    pol.on_routed(c, d)
    view = next(v for v in views if v.replica_id == d.replica_id)
    view.admit(c)
    return d, view


def test_classes_go_to_their_variants_then_spill():
    pol = get_policy("slo", classes=LIMITS)
    assert isinstance(pol, SloPolicy)
    views = fleet()
    for i in range(2):
        d, v = route(pol, views, ctx(i, "interactive"))
        assert v.variant == A and d.reason != "slo_spill"
    # the FP8 replica is at its interactive limit: the next interactive request spills off it
    d, v = route(pol, views, ctx(2, "interactive"))
    assert d.reason == "slo_spill" and d.spilled and v.variant == B
    # standard fills MXFP4 first (3 each, one slot already taken by the spilled request) ...
    placed = [route(pol, views, ctx(10 + i))[1].variant for i in range(5)]
    assert placed == [B] * 5
    # ... then would take FP8, but that replica serves interactive at its limit of 2: protected, so it spills
    d, v = route(pol, views, ctx(20, "standard"))
    assert d.reason == "slo_spill"


def test_finished_requests_free_the_limit_and_removal_forgets():
    pol = get_policy("slo", classes=LIMITS)
    views = fleet()
    reqs = [ctx(i, "interactive") for i in range(2)]
    for c in reqs:
        route(pol, views, c)
    assert pol.active_by_class("d/0/0") == {"interactive": 2}
    views[0].finish(reqs[0])
    pol.on_finished(reqs[0], "d/0/0", True)
    d, v = route(pol, views, ctx(5, "interactive"))
    assert v.replica_id == "d/0/0" and d.reason != "slo_spill"
    pol.on_replica_removed("d/0/0")
    assert pol.active_by_class("d/0/0") == {}


def test_unknown_class_uses_the_default_and_no_classes_passes_through():
    pol = get_policy("slo", classes=LIMITS, default_class="standard")
    views = fleet()
    _, v = route(pol, views, ctx(0, "gold"))
    assert v.variant == B and pol.class_of(ctx(0, "gold")) == "standard"
    plain = get_policy("slo", inner="least_load")
    d = plain.select(ctx(1, "interactive"), fleet())
    assert d.reason == "least_load"


def test_spill_goes_everywhere_when_every_replica_is_full():
    pol = get_policy("slo", classes={"interactive": {A: 1}})
    views = [ReplicaView("d/0/0", "http://a", variant=A)]
    route(pol, views, ctx(0, "interactive"))
    d, v = route(pol, views, ctx(1, "interactive"))
    assert d.reason == "slo_spill" and v.active_requests == 2


def test_config_is_validated():
    with pytest.raises(PolicyConfigError, match="wrap itself"):
        get_policy("slo", inner="slo")
    with pytest.raises(PolicyConfigError, match="at least 1"):
        get_policy("slo", classes={"interactive": {A: 0}})
    with pytest.raises(PolicyConfigError):
        get_policy("slo", inner="nope")


def test_header_parsing():
    assert slo_class_from_headers({b"x-zoe-slo": b" interactive "}) == "interactive"
    assert slo_class_from_headers({b"x-zoe-slo": b""}) is None
    assert slo_class_from_headers({}) is None


def test_live_router_reads_the_class_header_and_routes_by_variant():
    """The router app parses `x-zoe-slo` and its `slo` policy sends each class to its variant (FAKE backends)."""
    import httpx

    from tests.router.fake_backend import FakeBackend, ServerThread
    from zoe_cluster.router.app import build_router
    from zoe_cluster.router.config import RouterConfig
    from zoe_cluster.router.membership import MemberReplica, Membership

    backends = [FakeBackend("fast"), FakeBackend("bulk")]
    servers = [ServerThread(b.app).start() for b in backends]
    members = Membership(version=0, replicas=[MemberReplica(id=f"d/{i}/0", url=s.url, variant=v)
                                              for i, (s, v) in enumerate(zip(servers, (A, B)))])
    config = RouterConfig(models=["m"], health_interval_s=0, policy="slo",
                          policy_config={"classes": {"interactive": {A: 4}, "standard": {B: 32}}})
    router = ServerThread(build_router(config, membership=members).app).start()
    try:
        with httpx.Client(base_url=router.url, timeout=10) as client:
            for i in range(3):
                body = {"model": "m", "prompt": f"question {i} " * 20, "max_tokens": 4}
                assert client.post("/v1/completions", json=body, headers={"x-zoe-slo": "interactive"}).status_code == 200
                assert client.post("/v1/completions", json=body).status_code == 200
        assert len(backends[0].seen) == 3 and len(backends[1].seen) == 3
    finally:
        router.stop()
        for s in servers:
            s.stop()
