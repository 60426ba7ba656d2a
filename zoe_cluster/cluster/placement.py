"""Where a replica's GPUs come from: one Ray placement group per replica, one bundle per node.

A replica spanning one node is STRICT_PACK (all its GPUs on that node); one spanning several is STRICT_SPREAD
(one bundle on each of `nodes` distinct nodes), with one zoe actor per node starting that node's engine process
(SGLang: --nnodes/--node-rank). A multi-node vLLM replica is different: its `vllm serve` on node 0 is itself a
Ray driver whose Ray executor places one worker per GPU in a placement group of its own ({GPU: 1} bundles, as
vLLM requires), so zoe reserves only a launcher slot on an accelerator node (`engine_places_workers`) and the
engine's placement group lives and dies with the engine process. A variant can require an accelerator type: Ray gives every node
of that type a resource `accelerator_type:<TYPE>` of 1, and a small slice of it in each bundle keeps the
replica on such nodes (MI355X nodes are `AMD-Instinct-MI355X-OAM`).

A cluster whose GPU nodes run different worker images (the Helm chart renders one worker group per image, since
a variant's engine release is its recipe's `image`) labels each node with the Ray resource `zoe-image/<image>`
(1 per node); a replica of a variant of that image then asks for a sliver of it in each bundle, so it starts only
on nodes that run its engine. A multi-node vLLM replica's own GPU workers are placed by vLLM's placement group,
which carries no such resource: only its launcher slot is held to the image.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoe_cluster.recipes.schema import Parallelism

# A sliver of the accelerator_type resource: marks the requirement without using up the node's unit.
ACCELERATOR_SLICE = 0.001
IMAGE_RESOURCE_PREFIX = "zoe-image/"
"""Ray resource of the nodes that run a worker image: `zoe-image/<image name of docker/images.yaml>`."""
IMAGE_SLICE = 0.001
"""What one bundle asks of its node's `zoe-image/<image>` unit: a mark, not a share."""


@dataclass(frozen=True)
class GangShape:
    """The GPUs one replica needs, and on what kind of node."""

    nodes: int
    gpus_per_node: int
    accelerator_type: str | None = None
    engine_places_workers: bool = False
    """The engine reserves its own GPUs through Ray (multi-node vLLM); zoe holds one launcher slot only."""
    image: str | None = None
    """The worker image every node of the replica must run (their resource `zoe-image/<image>`); None: any node."""

    @classmethod
    def of(cls, par: Parallelism, accelerator_type: str | None, places_own_workers: bool = False,
           image: str | None = None) -> "GangShape":
        """The gang of a variant's parallelism; `places_own_workers` is the engine adapter's (multi-node vLLM)."""
        return cls(nodes=par.nodes, gpus_per_node=par.gpus_per_node, accelerator_type=accelerator_type,
                   engine_places_workers=places_own_workers and par.nodes > 1, image=image)

    @property
    def gpus(self) -> int:
        """GPUs one replica uses, whoever reserves them."""
        return self.nodes * self.gpus_per_node

    @property
    def members(self) -> int:
        """zoe actors in the gang: one per node, or the single launcher."""
        return 1 if self.engine_places_workers else self.nodes

    @property
    def member_gpus(self) -> int:
        return 0 if self.engine_places_workers else self.gpus_per_node

    @property
    def strategy(self) -> str:
        return "STRICT_PACK" if self.members == 1 else "STRICT_SPREAD"

    def bundles(self) -> list[dict[str, float]]:
        bundle: dict[str, float] = {"GPU": float(self.gpus_per_node)}
        if self.engine_places_workers:
            bundle = {"CPU": 0.01}
        if self.accelerator_type:
            bundle[accelerator_resource(self.accelerator_type)] = ACCELERATOR_SLICE
        if self.image:
            bundle[image_resource(self.image)] = IMAGE_SLICE
        return [dict(bundle) for _ in range(self.members)]


def accelerator_resource(accelerator_type: str) -> str:
    return f"accelerator_type:{accelerator_type}"


def image_resource(image: str) -> str:
    """The Ray resource the nodes running worker image `image` advertise (the Helm chart's worker groups)."""
    return f"{IMAGE_RESOURCE_PREFIX}{image}"


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
    if shape.image and cluster_resources.get(image_resource(shape.image), 0.0) < 1:
        return (f"the variant runs in worker image {shape.image} and no node of the cluster advertises "
                f"{image_resource(shape.image)} (no worker of that image has joined)")
    if gpus < need:
        return f"{replicas} replicas need {need} GPUs; the cluster has {gpus:g}"
    return None
