"""Membership built from replica facts (pure) and pushed as the typed model (a FAKE router link records pushes)."""

from __future__ import annotations

import asyncio

from tests.cluster.conftest import sim_spec
from zoe_cluster.cluster.lifecycle import ReplicaFacts
from zoe_cluster.cluster.membership_publisher import MembershipPublisher, build_membership
from zoe_cluster.router.membership import Membership


def _facts(index: int, **times) -> ReplicaFacts:
    f = ReplicaFacts("m", index, 1, "fp8-tp8", "default", created_at=1.0, **times)
    f.url = f"http://127.0.0.1:{9000 + index}"
    return f


def test_only_ready_and_draining_replicas_with_their_capacities_are_members():
    spec = sim_spec("m", engine_env={"ZOE_SIM_KV_TOKENS": "5000"})
    replicas = [_facts(0, started_at=2.0), _facts(1, started_at=2.0, ready_at=3.0),
                _facts(2, started_at=2.0, ready_at=3.0, drain_requested_at=4.0),
                _facts(3, started_at=2.0, ready_at=3.0, failed_at=5.0)]
    m = build_membership(spec, 7, replicas)
    assert isinstance(m, Membership) and m.version == 7
    assert [(r.id, r.state) for r in m.replicas] == [("m/1/1", "ready"), ("m/2/1", "draining")]
    r = m.replicas[0]
    assert r.engine == "sim" and r.models == [spec.recipe.served_model_name]
    assert r.kv_capacity_tokens == 5000  # the simulated engine's own capacity, asked of its adapter
    assert r.max_active_requests == spec.recipe.variant("fp8-tp8").max_num_seqs


def test_each_publish_is_a_newer_version_pushed_as_the_model():
    pushed: list[Membership] = []

    class Link:
        async def push(self, membership):
            pushed.append(membership)
            return True

    link, facts = Link(), [_facts(0, started_at=2.0, ready_at=3.0)]
    pub = MembershipPublisher(lambda: sim_spec("m"), lambda: facts, lambda: link)
    asyncio.run(pub.publish())
    facts[0].drain_requested_at = 4.0
    asyncio.run(pub.publish())
    assert [type(m) for m in pushed] == [Membership, Membership] and pushed[1].version == pushed[0].version + 1
    assert [r.state for m in pushed for r in m.replicas] == ["ready", "draining"]
    assert pub.current() == Membership(version=pub.version, replicas=pushed[1].replicas)
