"""Which Kubernetes nodes can run which recipe variant: node labels, `amd.com/gpu` capacity, GPUs in use.

`read_gpu_nodes` reads the API (nodes, and pods to count GPUs already requested); `fit_variants` is pure: it
takes the nodes and a recipe and says, per variant, on which nodes a replica fits and how many replicas fit
now (free GPUs) and at most (allocatable GPUs). A multi-node replica needs `nodes` distinct nodes (Ray's
STRICT_SPREAD placement), each with `gpus_per_node` GPUs free.

AMD's GPU operator labels nodes `amd.com/gpu.product-name=AMD_Instinct_MI355X_OAM`; Ray names the same
accelerator `AMD-Instinct-MI355X-OAM` (the recipes' `accelerator_type`), so the two are compared with `_` and
`-` treated alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Iterable

from zoe_cluster.recipes import Recipe

GPU_RESOURCE = "amd.com/gpu"
PRODUCT_LABEL = "amd.com/gpu.product-name"
# Taints on GPU nodes that zoe's worker pods tolerate by default (helm/zoe values: rayCluster.worker.tolerations).
DEFAULT_TOLERATED_TAINTS = frozenset({GPU_RESOURCE})


def parse_quantity(value: str | int | float | None) -> Decimal:
    """A Kubernetes quantity ("8", "500m", "288Gi") as a number; None or "" is 0. Raises ValueError."""
    from kubernetes.utils import parse_quantity as _parse

    if value is None or value == "":
        return Decimal(0)
    return _parse(value)


@dataclass(frozen=True)
class GpuNode:
    """One node with GPUs, as read from the API at one moment."""

    name: str
    labels: dict[str, str]
    gpus_allocatable: int
    gpus_in_use: int = 0
    ready: bool = True
    schedulable: bool = True
    taints: tuple[tuple[str, str], ...] = ()  # (key, effect) of NoSchedule / NoExecute taints

    @property
    def gpus_free(self) -> int:
        return max(self.gpus_allocatable - self.gpus_in_use, 0)

    @property
    def product(self) -> str | None:
        return self.labels.get(PRODUCT_LABEL)


@dataclass(frozen=True)
class VariantFit:
    """Where one variant of a recipe can run."""

    variant: str
    engine: str
    nodes_per_replica: int
    gpus_per_node: int
    accelerator_type: str | None
    eligible_nodes: tuple[str, ...]
    replicas_now: int  # replicas that fit in the GPUs free right now
    replicas_max: int  # replicas that fit if every allocatable GPU of the eligible nodes were free
    excluded: dict[str, str] = field(default_factory=dict)  # node -> why it cannot host this variant


def _same_accelerator(a: str, b: str) -> bool:
    norm = lambda s: s.replace("_", "-").lower()  # noqa: E731
    return norm(a) == norm(b)


def _replicas_on(slots: Iterable[int], nodes_per_replica: int) -> int:
    """Most replicas of `nodes_per_replica` distinct nodes when node i can hold slots[i] replica parts.

    k replicas fit iff sum(min(slots_i, k)) >= k * nodes_per_replica (each replica takes at most one part per node).
    """
    slots = [s for s in slots if s > 0]
    k = 0
    while sum(min(s, k + 1) for s in slots) >= (k + 1) * nodes_per_replica:
        k += 1
    return k


def fit_variants(
    recipe: Recipe,
    nodes: list[GpuNode],
    tolerated_taints: frozenset[str] = DEFAULT_TOLERATED_TAINTS,
) -> list[VariantFit]:
    """For every variant of `recipe`: the nodes that can host part of a replica and how many replicas fit."""
    fits = []
    for vname, v in recipe.variants.items():
        par = v.parallelism
        eligible: list[GpuNode] = []
        excluded: dict[str, str] = {}
        for n in nodes:
            blocking = [k for k, _ in n.taints if k not in tolerated_taints]
            if not n.ready:
                excluded[n.name] = "not Ready"
            elif not n.schedulable:
                excluded[n.name] = "cordoned (unschedulable)"
            elif blocking:
                excluded[n.name] = f"tainted {', '.join(blocking)}"
            elif v.accelerator_type and not (n.product and _same_accelerator(n.product, v.accelerator_type)):
                excluded[n.name] = f"{PRODUCT_LABEL}={n.product or '(none)'}, variant needs {v.accelerator_type}"
            elif n.gpus_allocatable < par.gpus_per_node:
                excluded[n.name] = f"{n.gpus_allocatable} GPUs allocatable, variant needs {par.gpus_per_node} per node"
            else:
                eligible.append(n)
        fits.append(
            VariantFit(
                variant=vname,
                engine=v.engine,
                nodes_per_replica=par.nodes,
                gpus_per_node=par.gpus_per_node,
                accelerator_type=v.accelerator_type,
                eligible_nodes=tuple(n.name for n in eligible),
                replicas_now=_replicas_on((n.gpus_free // par.gpus_per_node for n in eligible), par.nodes),
                replicas_max=_replicas_on((n.gpus_allocatable // par.gpus_per_node for n in eligible), par.nodes),
                excluded=excluded,
            )
        )
    return fits


def _pod_gpu_requests(pod: dict[str, Any], resource: str) -> int:
    """GPUs a pod holds: extended resources are requested in limits (requests default to them)."""
    total = Decimal(0)
    for c in pod.get("spec", {}).get("containers") or []:
        res = c.get("resources") or {}
        q = (res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource))
        total += parse_quantity(q)
    return int(total)


def gpu_nodes_from_objects(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], resource: str = GPU_RESOURCE
) -> list[GpuNode]:
    """GpuNodes from Node and Pod objects (as JSON dicts); nodes without `resource` are left out."""
    in_use: dict[str, int] = {}
    for p in pods:
        node = p.get("spec", {}).get("nodeName")
        if node and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            in_use[node] = in_use.get(node, 0) + _pod_gpu_requests(p, resource)
    out = []
    for n in nodes:
        status, spec, meta = n.get("status") or {}, n.get("spec") or {}, n.get("metadata") or {}
        alloc = int(parse_quantity((status.get("allocatable") or status.get("capacity") or {}).get(resource)))
        if alloc <= 0:
            continue
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        out.append(
            GpuNode(
                name=meta["name"],
                labels=dict(meta.get("labels") or {}),
                gpus_allocatable=alloc,
                gpus_in_use=in_use.get(meta["name"], 0),
                # A node that has not reported conditions yet is not known to be Ready.
                ready=conditions.get("Ready") == "True",
                schedulable=not spec.get("unschedulable", False),
                taints=tuple(
                    (t["key"], t.get("effect", ""))
                    for t in spec.get("taints") or []
                    if t.get("effect") in ("NoSchedule", "NoExecute")
                ),
            )
        )
    return sorted(out, key=lambda g: g.name)


def _items(response: Any) -> list[dict[str, Any]]:
    return json.loads(response.data).get("items") or []


def read_gpu_nodes(
    core: Any, resource: str = GPU_RESOURCE, label_selector: str | None = None, count_in_use: bool = True
) -> list[GpuNode]:
    """Nodes that have `resource` (default amd.com/gpu), with the GPUs pods already hold on each.

    Needs `list nodes` and, with `count_in_use`, `list pods` in all namespaces (the chart's ClusterRole).
    """
    kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": 30}
    nodes = _items(core.list_node(label_selector=label_selector or "", **kw))
    pods: list[dict[str, Any]] = []
    if count_in_use:
        pods = _items(core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed", **kw))
    return gpu_nodes_from_objects(nodes, pods, resource)
