"""Precise routing through the controller: a replica whose engine publishes KV events is listed with its
publishers (one per data-parallel rank) in the membership every router follows."""

from __future__ import annotations

from tests.cluster.conftest import sim_spec
from zoe_cluster.cluster.lifecycle import ReplicaFacts
from zoe_cluster.cluster.membership_publisher import build_membership, kv_event_sources
from zoe_cluster.cluster.spec import DeploymentRouter


def _ready(index: int, kv_port: int | None) -> ReplicaFacts:
    f = ReplicaFacts("m", index, 2, "fp8-tp8", "default", created_at=1.0, started_at=2.0, ready_at=3.0)
    f.url = f"http://10.0.0.{index + 5}:8000"
    f.kv_events_port = kv_port
    return f


def test_membership_lists_each_replicas_kv_event_publishers_at_its_host():
    spec = sim_spec("m")
    m = build_membership(spec, 1, [_ready(0, 7000), _ready(1, None)])
    (src,) = m.replicas[0].kv_events  # the recipe variant runs one data-parallel rank
    assert (src.endpoint, src.replay_endpoint) == ("tcp://10.0.0.5:7000", "tcp://10.0.0.5:7001")
    assert m.replicas[1].kv_events == []
    two = kv_event_sources(_ready(3, 9000), dp_size=2)
    assert [(s.endpoint, s.replay_endpoint) for s in two] == [
        ("tcp://10.0.0.8:9000", "tcp://10.0.0.8:9002"), ("tcp://10.0.0.8:9001", "tcp://10.0.0.8:9003")]


def test_precise_routing_is_off_unless_the_deployment_asks():
    assert DeploymentRouter().kv_events is False
    assert DeploymentRouter(kv_events=True).kv_events is True
