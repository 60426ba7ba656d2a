"""What zoe does through the Kubernetes API (docs/kubernetes.md).

- `nodes`: read node labels and `amd.com/gpu` capacity (and what pods already hold) and tell which nodes can
  run which recipe variant (`zoe k8s nodes --model glm-5.3`).
- `routers`: find the router pods of a Helm release by label, so the controller can push membership to every
  one of them (two or more router pods share one membership).
- `api`: build a CoreV1Api from the in-cluster service account or a kubeconfig.

The pure parts (quantity parsing, fitting variants onto nodes, picking ready pods) take plain objects and are
tested without a cluster; the readers take a `CoreV1Api` and are tested against an in-memory API server.
"""

from zoe_cluster.k8s.api import KubernetesUnavailable, core_api
from zoe_cluster.k8s.nodes import GpuNode, VariantFit, fit_variants, parse_quantity, read_gpu_nodes
from zoe_cluster.k8s.routers import (
    MembershipFanout,
    RouterDiscovery,
    RouterEndpoint,
    fanout_from_env,
    ready_router_endpoints,
)

__all__ = [
    "GpuNode", "KubernetesUnavailable", "MembershipFanout", "RouterDiscovery", "RouterEndpoint", "VariantFit", "fanout_from_env",
    "core_api", "fit_variants", "parse_quantity", "read_gpu_nodes", "ready_router_endpoints",
]
