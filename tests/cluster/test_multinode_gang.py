"""A replica spanning two nodes: one placement group STRICT_SPREAD over two Ray nodes, one actor per node, every
rank launched with its node rank and rank 0's address; a rank that dies takes the whole gang down and back up."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import FAST_HEALTH, group_members, wait_for
from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec
from zoe_cluster.recipes.loader import RecipeRegistry
from zoe_cluster.recipes.schema import Recipe

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ENGINE = Path(__file__).with_name("multinode_engine.py")


@pytest.fixture(scope="module")
def two_nodes():
    """Two Ray nodes on this machine, 8 fake GPUs each."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_gpus": 8, "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    cluster.add_node(num_gpus=8, num_cpus=2, node_ip_address="127.0.0.1")
    ray.init(address=cluster.address, namespace="zoe", log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
    cluster.shutdown()


def two_node_recipe() -> Recipe:
    data = RecipeRegistry.default().get("deepseek-v4-pro").model_dump()
    v = data["variants"]["fp8-tp8"]
    v.update(parallelism={"tp": 8, "pp": 2, "nodes": 2, "gpus_per_node": 8}, accelerator_type=None)
    v["profile"]["ttft_from"] = None
    data.update(default_variant="fp8-tp8-2n", variants={"fp8-tp8-2n": v})
    return Recipe.model_validate(data)


def test_two_node_gang_spreads_launches_every_rank_and_restarts_as_a_whole(two_nodes):
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    spec = DeploymentSpec(name="wide", recipe=two_node_recipe(), variant="fp8-tp8-2n", replicas=1, engine="sglang",
                          launcher=[sys.executable, str(ENGINE)], health=FAST_HEALTH,
                          router=DeploymentRouter(enabled=False))
    handle = create_deployment(spec, two_nodes)
    try:
        st = ray.get(handle.wait_ready.remote(60))
        rep = st["replicas"][0]
        assert rep["state"] == "ready" and len(rep["pids"]) == 2 and len(rep["member_pids"]) == 2
        assert [len(g) for g in rep["gpu_ids"]] == [8, 8]
        node_ids = ray.get([handle.__ray_call__.remote(lambda self: [i["node_id"] for i in self.replicas.slots[0].gang.infos])])[0]
        assert len(set(node_ids)) == 2  # STRICT_SPREAD: one bundle per node
        # ready means rank 0 answers /health; rank 1's process may still be starting (a loaded CI machine), so
        # wait for its start line rather than read the log once
        start_line = re.compile(r"rank (\d)/2 dist-init-addr (\S+)")  # the flag alone also shows in other lines
        log = wait_for(lambda: len(start_line.findall(t := ray.get(handle.logs.remote(0))["0"])) >= 2 and t, 30,
                       what="both node ranks' start lines in the replica log")
        ranks = start_line.findall(log)
        assert sorted(r for r, _ in ranks) == ["0", "1"]
        assert len({addr for _, addr in ranks}) == 1 and ranks[0][1].startswith("127.0.0.1:")
        assert "--tp-size 8" in log and "--pp-size 2" in log

        os.killpg(rep["process_groups"][1], signal.SIGKILL)  # node rank 1 dies: the replica cannot serve
        after = wait_for(lambda: (r := ray.get(handle.status.remote())["replicas"][0])["generation"] == 2
                         and r["state"] == "ready" and r, 30, what="the gang restarted on a new generation")
        assert not group_members(rep["process_groups"][0])  # rank 0 of the failed generation was stopped too
        failed = ray.get(handle.status.remote())["history"][-1]
        assert "node rank 1 exited" in failed["failure"]
        assert len(after["pids"]) == len(after["process_groups"]) == 2
    finally:
        remove_deployment("wide")
