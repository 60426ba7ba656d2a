"""`zoe k8s ...`: what zoe reads from a Kubernetes cluster (nodes that can run a variant; router pods)."""

from __future__ import annotations

from typing import Optional

import typer

from zoe_cluster.cli.common import EXIT_RUNTIME, console, fail, print_json

k8s_app = typer.Typer(help="Read the Kubernetes cluster zoe runs on (Helm chart: helm/zoe).", no_args_is_help=True)


def _api(kubeconfig: Optional[str], context: Optional[str], server: Optional[str]):
    from zoe_cluster.k8s import KubernetesUnavailable, core_api

    try:
        return core_api(kubeconfig=kubeconfig, context=context, host=server)
    except KubernetesUnavailable as e:
        fail(str(e), code=EXIT_RUNTIME)


_KUBECONFIG = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: in-cluster, $KUBECONFIG, ~/.kube/config).")
_CONTEXT = typer.Option(None, "--context", help="Kubeconfig context.")
_SERVER = typer.Option(None, "--server", help="API server URL to use without credentials (e.g. `kubectl proxy`).")


@k8s_app.command("nodes")
def nodes(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Recipe whose variants to fit onto the nodes."),
    selector: Optional[str] = typer.Option(None, "--selector", "-l", help="Only nodes matching this label selector."),
    resource: str = typer.Option("amd.com/gpu", "--resource", help="Extended resource name of the GPUs."),
    no_pods: bool = typer.Option(False, "--no-pods", help="Do not list pods to count GPUs in use (needs less RBAC)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    kubeconfig: Optional[str] = _KUBECONFIG,
    context: Optional[str] = _CONTEXT,
    server: Optional[str] = _SERVER,
) -> None:
    """GPU nodes (labels, amd.com/gpu allocatable and free) and, with --model, which variants fit where."""
    from dataclasses import asdict

    from rich.table import Table

    from zoe_cluster.k8s import fit_variants, read_gpu_nodes

    recipe = None
    if model:
        from zoe_cluster.recipes import RecipeRegistry, UnknownModelError

        try:
            recipe = RecipeRegistry.default().get(model)
        except UnknownModelError as e:
            fail(str(e))
    core = _api(kubeconfig, context, server)
    try:
        gpu_nodes = read_gpu_nodes(core, resource=resource, label_selector=selector, count_in_use=not no_pods)
    except Exception as e:  # ApiException, connection errors: say what failed, not a traceback
        fail(f"reading nodes from the Kubernetes API failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
             code=EXIT_RUNTIME)
    fits = fit_variants(recipe, gpu_nodes) if recipe else []
    if as_json:
        print_json({"nodes": [asdict(n) | {"gpus_free": n.gpus_free} for n in gpu_nodes], "variants": [asdict(f) for f in fits]})
        return
    if not gpu_nodes:
        console.print(f"no node has {resource} (selector: {selector or 'none'})")
    table = Table(title=f"Nodes with {resource}")
    for col in ("node", "product", "allocatable", "free", "ready", "schedulable", "taints"):
        table.add_column(col)
    for n in gpu_nodes:
        table.add_row(
            n.name, n.product or "-", str(n.gpus_allocatable), str(n.gpus_free), "yes" if n.ready else "NO",
            "yes" if n.schedulable else "NO", ", ".join(f"{k}:{e}" for k, e in n.taints) or "-",
        )
    console.print(table)
    if recipe:
        vt = Table(title=f"{recipe.name}: variants on these nodes")
        for col in ("variant", "engine", "GPUs/replica", "replicas now", "replicas max", "eligible nodes", "excluded"):
            vt.add_column(col)
        for f in fits:
            vt.add_row(
                f.variant, f.engine, f"{f.nodes_per_replica}x{f.gpus_per_node}", str(f.replicas_now), str(f.replicas_max),
                ", ".join(f.eligible_nodes) or "-", "; ".join(f"{k}: {v}" for k, v in f.excluded.items()) or "-",
            )
        console.print(vt)


@k8s_app.command("routers")
def routers(
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="Namespace (default: $ZOE_K8S_NAMESPACE)."),
    release: Optional[str] = typer.Option(None, "--release", help="Helm release whose routers to find."),
    port: int = typer.Option(8000, "--port", help="Router container port, which serves /admin too (helm value router.port)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    kubeconfig: Optional[str] = _KUBECONFIG,
    context: Optional[str] = _CONTEXT,
    server: Optional[str] = _SERVER,
) -> None:
    """Ready router pods the controller pushes membership to (inside a zoe pod, from the chart's variables)."""
    from zoe_cluster.k8s import RouterDiscovery

    if release or namespace:
        if not (release and namespace):
            fail("give both --namespace and --release, or neither (then the chart's ZOE_K8S_* variables are used)")
        disc = RouterDiscovery(namespace, f"app.kubernetes.io/instance={release},app.kubernetes.io/component=router", port)
    else:
        try:
            disc = RouterDiscovery.from_env()
        except ValueError as e:
            fail(f"{e}; outside the chart's pods pass --namespace and --release")
    core = _api(kubeconfig, context, server)
    try:
        eps = disc.endpoints(core)
    except Exception as e:
        fail(f"listing router pods failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}", code=EXIT_RUNTIME)
    if as_json:
        print_json([{"pod": e.pod, "url": e.url, "restarts": e.restarts} for e in eps])
        return
    for e in eps:
        console.print(f"{e.pod}\t{e.url}")
    if not eps:
        console.print(f"no ready router pod in {disc.namespace} matches {disc.selector}")


def register(app: typer.Typer) -> None:
    """Add `zoe k8s` to the top-level app."""
    app.add_typer(k8s_app, name="k8s")
