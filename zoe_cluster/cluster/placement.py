"""Where a replica's GPUs come from: one Ray placement group per replica, one bundle per node.

A replica spanning one node is STRICT_PACK (all its GPUs on that node); one spanning several is STRICT_SPREAD
(one bundle on each of `nodes` distinct nodes). A variant can require an accelerator type: Ray gives every node
of that type a resource `accelerator_type:<TYPE>` of 1, and a small slice of it in each bundle keeps the
replica on such nodes (MI355X nodes are `AMD-Instinct-MI355X-OAM`).
"""

from __future__ import annotations

from dataclasses import dataclass

from zoe_cluster.recipes.schema import Parallelism

# A sliver of the accelerator_type resource: marks the requirement without using up the node's unit.
ACCELERATOR_SLICE = 0.001


@dataclass(frozen=True)
class GangShape:
    """The GPUs one replica needs, and on what kind of node."""

    nodes: int
    gpus_per_node: int
    accelerator_type: str | None = None

    @classmethod
    def of(cls, par: Parallelism, accelerator_type: str | None) -> "GangShape":
        return cls(nodes=par.nodes, gpus_per_node=par.gpus_per_node, accelerator_type=accelerator_type)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def strategy(self) -> str:
        return "STRICT_PACK" if self.nodes == 1 else "STRICT_SPREAD"

    def bundles(self) -> list[dict[str, float]]:
        bundle: dict[str, float] = {"GPU": float(self.gpus_per_node)}
        if self.accelerator_type:
            bundle[accelerator_resource(self.accelerator_type)] = ACCELERATOR_SLICE
        return [dict(bundle) for _ in range(self.nodes)]


def accelerator_resource(accelerator_type: str) -> str:
    return f"accelerator_type:{accelerator_type}"


def fits_cluster(shape: GangShape, replicas: int, cluster_resources: dict[str, float]) -> str | None:
    """A reason why `replicas` gangs of `shape` can never fit the cluster's total resources, or None.

    Only totals are checked (cheap and catches the common mistakes: no GPUs, no nodes of the type); whether
    per-node packing works is Ray's answer, seen as a replica staying pending.
    """
    gpus = cluster_resources.get("GPU", 0.0)
    need = shape.gpus * replicas
    if gpus < shape.gpus:
        return f"each replica needs {shape.gpus} GPUs ({shape.nodes}x{shape.gpus_per_node}); the cluster has {gpus:g}"
    if shape.accelerator_type and cluster_resources.get(accelerator_resource(shape.accelerator_type), 0.0) < 1:
        return (
            f"the variant needs nodes with accelerator type {shape.accelerator_type} and the cluster has none "
            "(use --engine sim to simulate on any node)"
        )
    if gpus < need:
        return f"{replicas} replicas need {need} GPUs; the cluster has {gpus:g}"
    return None
