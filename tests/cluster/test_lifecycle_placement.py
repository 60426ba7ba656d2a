"""Pure parts of the cluster module: state derived from facts, backoff, gang shapes, spec validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.cluster.conftest import glm
from zoe_cluster.cluster.lifecycle import ReplicaFacts, backoff_s, replica_id
from zoe_cluster.cluster.placement import GangShape, accelerator_resource, fits_cluster
from zoe_cluster.cluster.spec import DeploymentSpec
from zoe_cluster.engines import get_adapter
from zoe_cluster.recipes.schema import Parallelism
from zoe_cluster.replica_state import ReplicaState


def facts(**kw) -> ReplicaFacts:
    return ReplicaFacts("glm", 0, 1, "fp8-tp8", "default", created_at=100.0, **kw)


@pytest.mark.parametrize(
    "kw, state, since",
    [
        ({}, ReplicaState.PENDING, 100.0),
        ({"placed_at": 101.0}, ReplicaState.STARTING, 101.0),
        ({"placed_at": 101.0, "started_at": 102.0}, ReplicaState.LOADING, 102.0),
        ({"placed_at": 101.0, "started_at": 102.0, "ready_at": 130.0}, ReplicaState.READY, 130.0),
        ({"started_at": 102.0, "ready_at": 130.0, "drain_requested_at": 200.0}, ReplicaState.DRAINING, 200.0),
        ({"ready_at": 130.0, "drain_requested_at": 200.0, "stopped_at": 210.0}, ReplicaState.STOPPED, 210.0),
        ({"started_at": 102.0, "ready_at": 130.0, "failed_at": 150.0}, ReplicaState.FAILED, 150.0),
        ({"started_at": 102.0, "failed_at": 103.0, "stopped_at": 104.0}, ReplicaState.FAILED, 103.0),
    ],
)
def test_state_is_derived_from_facts(kw, state, since):
    f = facts(**kw)
    assert f.state() is state
    assert f.state_since() == since
    assert f.state().terminal == (state in (ReplicaState.STOPPED, ReplicaState.FAILED))


def test_identity_and_uptime():
    f = facts(started_at=102.0, ready_at=130.0)
    assert f.id == replica_id("glm", 0, 1) == "glm/0/1"
    d = f.to_dict(now=190.0)
    assert d["state"] == "ready" and d["uptime_s"] == 60.0 and d["id"] == "glm/0/1"
    assert facts(started_at=102.0).to_dict(now=190.0)["uptime_s"] == 0.0


def test_events_are_bounded():
    f = facts()
    for i in range(80):
        f.note("x", str(i), at=float(i))
    assert len(f.events) == 50 and f.events[-1].detail == "79"


def test_backoff_doubles_up_to_the_cap():
    assert [backoff_s(n, 1.0, 10.0) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff_s(3, 0.5, 60) == 2.0


def test_one_node_gang_packs_and_multi_node_gang_spreads():
    one = GangShape.of(Parallelism(tp=8, nodes=1, gpus_per_node=8), "AMD-Instinct-MI355X-OAM", get_adapter("vllm").places_own_workers)
    assert one.strategy == "STRICT_PACK" and one.gpus == 8
    assert one.bundles() == [{"GPU": 8.0, "accelerator_type:AMD-Instinct-MI355X-OAM": 0.001}]
    two = GangShape.of(Parallelism(tp=8, pp=2, nodes=2, gpus_per_node=8), None, get_adapter("sglang").places_own_workers)
    assert two.strategy == "STRICT_SPREAD" and two.bundles() == [{"GPU": 8.0}, {"GPU": 8.0}]


def test_fits_cluster_names_what_is_missing():
    shape = GangShape(1, 8, "AMD-Instinct-MI355X-OAM")
    res = {"GPU": 16.0, accelerator_resource("AMD-Instinct-MI355X-OAM"): 2.0}
    assert fits_cluster(shape, 2, res) is None
    assert "24 GPUs" in fits_cluster(shape, 3, res)
    assert "has 0" in fits_cluster(shape, 1, {"CPU": 4.0})
    why = fits_cluster(shape, 1, {"GPU": 16.0})
    assert "AMD-Instinct-MI355X-OAM" in why and "--engine sim" in why
    assert fits_cluster(GangShape(1, 8, None), 2, {"GPU": 16.0}) is None


def test_spec_sim_drops_accelerator_type_but_keeps_gpu_count():
    spec = DeploymentSpec(name="glm-5.3", recipe=glm(), variant="fp8-tp8", engine="sim")
    assert spec.shape("fp8-tp8") == GangShape(1, 8, None)
    real = DeploymentSpec(name="glm-5.3", recipe=glm(), variant="fp8-tp8", engine="vllm")
    assert real.shape("fp8-tp8").accelerator_type == "AMD-Instinct-MI355X-OAM"


def test_spec_rejects_unknown_variant_and_wrong_engine():
    with pytest.raises(ValidationError, match="no variant 'nope'"):
        DeploymentSpec(name="glm-5.3", recipe=glm(), variant="nope", engine="sim")
    with pytest.raises(ValidationError, match="runs on vllm, not sglang"):
        DeploymentSpec(name="glm-5.3", recipe=glm(), variant="fp8-tp8", engine="sglang")
    with pytest.raises(ValidationError):
        DeploymentSpec(name="Bad Name", recipe=glm(), variant="fp8-tp8", engine="sim")
    spec = DeploymentSpec(name="g", recipe=glm(), variant="fp8-tp8", engine="sim", replica_variants={1: "mxfp4-tp8"})
    assert spec.variant_of(0) == "fp8-tp8" and spec.variant_of(1) == "mxfp4-tp8"
    assert DeploymentSpec.model_validate_json(spec.model_dump_json()) == spec


def test_multi_node_vllm_leaves_gpu_placement_to_its_ray_executor():
    par = Parallelism(tp=8, pp=2, nodes=2, gpus_per_node=8)
    vllm = GangShape.of(par, "AMD-Instinct-MI355X-OAM", get_adapter("vllm").places_own_workers)
    assert vllm.engine_places_workers and vllm.members == 1 and vllm.member_gpus == 0 and vllm.gpus == 16
    assert vllm.bundles() == [{"CPU": 0.01, "accelerator_type:AMD-Instinct-MI355X-OAM": 0.001}]
    assert "16 GPUs" in fits_cluster(vllm, 1, {"GPU": 8.0, accelerator_resource("AMD-Instinct-MI355X-OAM"): 1})
    sglang = GangShape.of(par, "AMD-Instinct-MI355X-OAM", get_adapter("sglang").places_own_workers)
    assert not sglang.engine_places_workers and sglang.members == 2 and sglang.member_gpus == 8
    assert sglang.strategy == "STRICT_SPREAD" and len(sglang.bundles()) == 2
    assert not GangShape.of(Parallelism(tp=8), None, get_adapter("vllm").places_own_workers).engine_places_workers
