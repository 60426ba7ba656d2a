"""A replica runs only on nodes of its variant's worker image: the bundles ask for `zoe-image/<image>` when the
deployment has worker images (`zoe deploy --image-resource`, the Helm chart's RayJob), checked with plain values and
on a real two-worker Ray cluster (ray.cluster_utils.Cluster) whose nodes advertise one image each."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.cluster.conftest import MI355X, glm
from zoe_cluster.cluster.placement import IMAGE_SLICE, fits_cluster, image_resource
from zoe_cluster.cluster.spec import DeploymentSpec

RELEASE, NIGHTLY = "zoe-vllm-rocm", "zoe-vllm-rocm-nightly"


def worker_images() -> dict[str, str]:
    """Recipe image -> worker image for glm-5.3's two vLLM images, as the chart's RayJob passes them."""
    variants = glm().variants
    return {variants["fp8-tp8"].image: RELEASE, variants["mxfp4-tp8"].image: NIGHTLY}


def spec(variant: str = "mxfp4-tp8", engine: str = "vllm", **kw) -> DeploymentSpec:
    return DeploymentSpec(name="glm", recipe=glm(), variant=variant, engine=engine, **kw)


def test_bundles_ask_for_the_variants_image_only_with_worker_images():
    images = worker_images()
    assert "nightly" in glm().variants["mxfp4-tp8"].image  # the recipe's own image, not the release one
    (bundle,) = spec("mxfp4-tp8", worker_images=images).shape("mxfp4-tp8").bundles()
    assert bundle == {"GPU": 8.0, f"accelerator_type:{MI355X}": 0.001, "zoe-image/zoe-vllm-rocm-nightly": IMAGE_SLICE}
    (bundle,) = spec("fp8-tp8", worker_images=images).shape("fp8-tp8").bundles()
    assert bundle[image_resource(RELEASE)] == IMAGE_SLICE and image_resource(NIGHTLY) not in bundle
    # one deployment, replicas of both images (a switch): each shape asks for its own variant's image
    both = spec("fp8-tp8", worker_images=images, replica_variants={1: "mxfp4-tp8"})
    assert both.shape(both.variant_of(1)).image == NIGHTLY and both.shape(both.variant_of(0)).image == RELEASE
    # without worker images (a local Ray, a cluster of one image) or on the simulated engine: any node
    assert not any(k.startswith("zoe-image/") for k in spec().shape("mxfp4-tp8").bundles()[0])
    assert spec(engine="sim", worker_images=images).shape("mxfp4-tp8").image is None


def test_a_variant_no_worker_image_runs_is_refused_naming_it():
    only_release = {glm().variants["fp8-tp8"].image: RELEASE}
    with pytest.raises(ValidationError, match=r"variant 'mxfp4-tp8' of glm-5.3 runs on vllm/vllm-openai-rocm:nightly-"
                                              r".*no worker image of the cluster is built FROM it"):
        spec("mxfp4-tp8", worker_images=only_release)
    from zoe_cluster.switching import SwitchConfig

    with pytest.raises(ValidationError, match="variant 'fp8-tp8-nightly'"):
        spec("fp8-tp8", worker_images=only_release, switching=SwitchConfig(candidates=["fp8-tp8", "fp8-tp8-nightly"]))


def test_fits_cluster_names_a_missing_image():
    shape = spec(worker_images=worker_images()).shape("mxfp4-tp8")
    have = {"GPU": 16.0, f"accelerator_type:{MI355X}": 2.0, image_resource(RELEASE): 1.0}
    assert fits_cluster(shape, 1, have) == ("the variant runs in worker image zoe-vllm-rocm-nightly and no node of the "
                                            "cluster advertises zoe-image/zoe-vllm-rocm-nightly (no worker of that "
                                            "image has joined)")
    assert fits_cluster(shape, 1, {**have, image_resource(NIGHTLY): 1.0}) is None


@pytest.fixture(scope="module")
def two_images():
    """A real Ray cluster: a head without GPUs and two 8-GPU MI355X-labelled workers, one per worker image; yields
    {image: node id}."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    nodes = {}
    try:
        for image in (RELEASE, NIGHTLY):
            node = cluster.add_node(num_cpus=1, num_gpus=8, node_ip_address="127.0.0.1",
                                    resources={f"accelerator_type:{MI355X}": 1, image_resource(image): 1})
            nodes[image] = node.node_id
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="zoe-image-test", log_to_driver=False, logging_level="ERROR")
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def _placed_on(pg, timeout_s: float = 30) -> str:
    """The node id of a placement group's bundle 0, once Ray has reserved it."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.get(pg.ready(), timeout=timeout_s)
    where = ray.remote(num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
    return ray.get(where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote(), timeout=30)


@pytest.mark.ray
def test_a_nightly_replica_lands_only_on_a_node_of_the_nightly_image(two_images):
    """The controller's placement-group call (controller._place) with the spec's bundles: the nightly variant's
    replica takes the nightly node's GPUs; a second one waits, though the release node's 8 GPUs are free, and the
    release variant's replica takes those."""
    import ray
    from ray.util import placement_group

    s = spec("mxfp4-tp8", worker_images=worker_images(), replica_variants={2: "fp8-tp8"})
    groups = []
    try:
        for index in range(3):
            shape = s.shape(s.variant_of(index))
            groups.append(placement_group(shape.bundles(), strategy=shape.strategy, name=f"zoe:glm:{index}:1"))
        assert _placed_on(groups[0]) == two_images[NIGHTLY]
        ready, _ = ray.wait([groups[1].ready()], timeout=3)
        assert not ready, "a second nightly replica was placed on a node without the nightly image"
        assert _placed_on(groups[2]) == two_images[RELEASE]
        ray.util.remove_placement_group(groups[0])  # the nightly node frees up: the waiting replica takes it
        assert _placed_on(groups[1]) == two_images[NIGHTLY]
    finally:
        for pg in groups:
            ray.util.remove_placement_group(pg)


@pytest.mark.parametrize("flags,variant", [
    ([], "mxfp4-tp8"),  # the planner's pick among every variant: a nightly-image one
    (["--image-resource", "zoe-vllm-rocm=vllm/vllm-openai-rocm:v0.29.0"], "fp8-tp8-zoe"),  # release image only
])
def test_the_planner_picks_among_the_variants_the_worker_images_run(monkeypatch, flags, variant):
    """`zoe deploy --concurrency` on a cluster of release-image nodes only plans a release-image variant (stopped
    before it joins a Ray cluster)."""
    from typer.testing import CliRunner

    from zoe_cluster.cli import deploy
    from zoe_cluster.cli.main import app

    def stop(*_a, **_kw):
        deploy.fail("stopped before joining Ray", code=2)

    monkeypatch.setattr(deploy, "_connect", stop)
    out = CliRunner().invoke(app, ["deploy", "glm-5.3", "--concurrency", "32", *flags])
    assert "stopped before joining Ray" in out.output
    assert f"plan: {variant} predicts" in out.output.replace("\n", " "), out.output
    assert ("nightly" in glm().variants[variant].image) == (not flags)


def test_a_malformed_image_resource_is_a_usage_error():
    from typer.testing import CliRunner

    from zoe_cluster.cli.main import app

    out = CliRunner().invoke(app, ["deploy", "glm-5.3", "--image-resource", "zoe-vllm-rocm"])
    assert out.exit_code == 2 and "--image-resource expects IMAGE=BASE" in out.output
