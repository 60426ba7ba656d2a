"""Which nodes can run which variant: the pure fit, and the reader against an in-memory Kubernetes API (kmock)."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from zoe_cluster.cli.main import app
from zoe_cluster.k8s import GpuNode, core_api, fit_variants, read_gpu_nodes
from zoe_cluster.k8s.nodes import _replicas_on
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.recipes.schema import Parallelism

MI355X = {"amd.com/gpu.product-name": "AMD_Instinct_MI355X_OAM"}
MI300X = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}


def _node(name, labels, gpus="8", ready="True", unschedulable=False, taints=()):
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable, "taints": [{"key": k, "effect": e} for k, e in taints]},
        "status": {"allocatable": {"amd.com/gpu": gpus, "cpu": "192"} if gpus else {"cpu": "64"},
                   "conditions": [{"type": "Ready", "status": ready}]},
    }


def _pod(name, ns, node, gpus, phase="Running"):
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "x", "resources": {"limits": {"amd.com/gpu": gpus, "memory": "1Gi"}}},
            {"name": "sidecar", "image": "y"},
        ]},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    "slots,nodes_per_replica,expected",
    [([1, 1, 1, 1], 1, 4), ([2, 0, 1], 1, 3), ([1, 1, 1], 2, 1), ([2, 2, 2], 2, 3), ([3, 1], 2, 1), ([4], 2, 0), ([], 1, 0)],
)
def test_replicas_need_distinct_nodes_for_each_part(slots, nodes_per_replica, expected):
    assert _replicas_on(slots, nodes_per_replica) == expected


def test_fit_excludes_nodes_with_reasons_and_counts_free_gpus():
    recipe = RecipeRegistry.default().get("glm-5.3")
    nodes = [
        GpuNode("a", MI355X, 8),
        GpuNode("b", MI355X, 8, gpus_in_use=4),  # half taken: no 8-GPU replica fits now
        GpuNode("c", MI300X, 8),
        GpuNode("d", MI355X, 8, schedulable=False),
        GpuNode("e", MI355X, 8, taints=(("dedicated", "NoSchedule"),)),
        GpuNode("f", MI355X, 8, taints=(("amd.com/gpu", "NoSchedule"),)),  # tolerated by the chart's workers
        GpuNode("g", MI355X, 8, ready=False),
        GpuNode("h", {}, 8),
    ]
    fits = {f.variant: f for f in fit_variants(recipe, nodes)}
    assert set(fits) == set(recipe.variants)
    f = fits["fp8-tp8"]
    assert f.eligible_nodes == ("a", "b", "f")
    assert (f.replicas_now, f.replicas_max) == (2, 3)
    assert "MI300X" in f.excluded["c"] and "cordoned" in f.excluded["d"]
    assert "dedicated" in f.excluded["e"] and f.excluded["g"] == "not Ready" and "(none)" in f.excluded["h"]


def test_multi_node_variant_needs_free_gpus_on_distinct_nodes():
    recipe = RecipeRegistry.default().get("glm-5.3")
    v = recipe.variants["fp8-tp8"]
    wide = v.model_copy(update={"parallelism": Parallelism(tp=16, nodes=2, gpus_per_node=8)})
    recipe = recipe.model_copy(update={"variants": {"fp8-tp16-2node": wide}})
    nodes = [GpuNode("a", MI355X, 8), GpuNode("b", MI355X, 8, gpus_in_use=8), GpuNode("c", MI355X, 8)]
    (f,) = fit_variants(recipe, nodes)
    assert (f.nodes_per_replica, f.replicas_now, f.replicas_max) == (2, 1, 1)
    assert fit_variants(recipe, nodes[:2])[0].replicas_now == 0


@pytest.fixture
def k8s(kmock):
    kmock.resources["v1/nodes"] = {}
    kmock.resources["v1/pods"] = {}
    return kmock


async def _create(core, nodes=(), pods=()):
    for n in nodes:
        await asyncio.to_thread(core.create_node, n)
    for p in pods:
        await asyncio.to_thread(core.create_namespaced_pod, p["metadata"]["namespace"], p)


@pytest.mark.asyncio
async def test_reader_counts_gpus_held_by_pods_in_any_namespace(k8s):
    core = core_api(host=str(k8s.url))
    await _create(
        core,
        nodes=[_node("gpu-1", MI355X), _node("gpu-2", MI355X, taints=[("amd.com/gpu", "NoSchedule"), ("x", "PreferNoSchedule")]),
               _node("cpu-1", {}, gpus=None)],
        pods=[_pod("engine", "serving", "gpu-1", "4"), _pod("train", "research", "gpu-1", "2"),
              _pod("done", "research", "gpu-2", "8", phase="Succeeded")],
    )
    nodes = await asyncio.to_thread(read_gpu_nodes, core)
    assert [n.name for n in nodes] == ["gpu-1", "gpu-2"]  # the CPU node has no amd.com/gpu
    assert (nodes[0].gpus_in_use, nodes[0].gpus_free) == (6, 2)
    assert nodes[1].gpus_free == 8  # a finished pod holds nothing
    assert nodes[1].taints == (("amd.com/gpu", "NoSchedule"),)
    assert [n.gpus_free for n in await asyncio.to_thread(read_gpu_nodes, core, count_in_use=False)] == [8, 8]


@pytest.mark.asyncio
async def test_cli_nodes_reports_which_variants_fit(k8s):
    core = core_api(host=str(k8s.url))
    await _create(core, nodes=[_node("gpu-1", MI355X), _node("gpu-2", MI300X)], pods=[])
    res = await asyncio.to_thread(
        CliRunner().invoke, app, ["k8s", "nodes", "--server", str(k8s.url), "--model", "glm-5.3", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [n["name"] for n in out["nodes"]] == ["gpu-1", "gpu-2"]
    fit = next(v for v in out["variants"] if v["variant"] == "mxfp4-tp8")
    assert fit["eligible_nodes"] == ["gpu-1"] and fit["replicas_now"] == 1 and "MI300X" in fit["excluded"]["gpu-2"]


def test_cli_nodes_unknown_model_and_unreachable_server_exit_with_a_reason():
    res = CliRunner().invoke(app, ["k8s", "nodes", "--server", "http://127.0.0.1:9", "--model", "no-such-model"])
    assert res.exit_code != 0 and "no-such-model" in res.output
    res = CliRunner().invoke(app, ["k8s", "nodes", "--server", "http://127.0.0.1:9"])
    assert res.exit_code != 0 and "reading nodes from the Kubernetes API failed" in res.output
