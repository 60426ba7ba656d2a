"""What the CLI (and tests, and the switcher) call on a connected driver: create, find, and remove deployments.

Deployments are found by asking Ray for the named controller actors in the "zoe" namespace; nothing about a
deployment is kept in local files.
"""

from __future__ import annotations

from zoe_cluster.cluster.controller import CONTROLLER_PREFIX, NAMESPACE, DeploymentController, controller_name
from zoe_cluster.cluster.intent_store import IntentStore
from zoe_cluster.cluster.placement import fits_cluster
from zoe_cluster.cluster.spec import DeploymentSpec


class DeploymentExists(RuntimeError):
    pass


class NoDeployment(LookupError):
    def __init__(self, name: str, known: list[str]):
        self.name, self.known = name, known
        super().__init__(f"no deployment named '{name}'; deployments: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:
        return self.args[0]


def controller_actor_class():
    import ray

    return ray.remote(DeploymentController)


def list_deployments() -> list[str]:
    import ray

    names = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        a["name"][len(CONTROLLER_PREFIX):] for a in names
        if a.get("namespace") == NAMESPACE and a["name"].startswith(CONTROLLER_PREFIX)
    )


def get_controller(name: str):
    import ray

    try:
        return ray.get_actor(controller_name(name), namespace=NAMESPACE)
    except ValueError:
        raise NoDeployment(name, list_deployments()) from None


def create_deployment(spec: DeploymentSpec, ray_address: str, check_fit: bool = True, start_timeout_s: float = 120):
    """Create and start the controller of `spec` (a detached named actor on the head node); returns its handle.

    Raises DeploymentExists if one by that name runs, ValueError when the cluster can never hold the replicas.
    """
    import ray

    if spec.name in list_deployments():
        raise DeploymentExists(f"deployment '{spec.name}' already exists: use `zoe scale`, `zoe switch`, or "
                               f"`zoe undeploy {spec.name}` first")
    if check_fit:
        why = fits_cluster(spec.shape(spec.variant), spec.replicas, ray.cluster_resources())
        if why:
            raise ValueError(why)
    IntentStore(spec.name).clear()  # a leftover intent of an earlier deployment of this name
    handle = controller_actor_class().options(
        name=controller_name(spec.name), namespace=NAMESPACE, lifetime="detached", max_restarts=-1,
        max_task_retries=0, num_cpus=0, max_concurrency=1000,
        resources={"node:__internal_head__": 0.001},
    ).remote(spec.model_dump_json(), ray_address)
    try:
        ray.get(handle.start.remote(), timeout=start_timeout_s)
    except Exception:
        remove_deployment_handle(handle, graceful=False)
        raise
    return handle


def remove_deployment_handle(handle, graceful: bool = True, timeout_s: float = 180) -> dict | None:
    """Drain and stop everything of a deployment (when graceful), then kill its controller."""
    import ray

    status = None
    if graceful:
        try:
            status = ray.get(handle.shutdown.remote(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - a dead controller: killing it still frees everything it owned
            status = None
    ray.kill(handle, no_restart=True)
    return status


def remove_deployment(name: str, graceful: bool = True, timeout_s: float = 180) -> dict | None:
    status = remove_deployment_handle(get_controller(name), graceful, timeout_s)
    IntentStore(name).clear()
    return status
