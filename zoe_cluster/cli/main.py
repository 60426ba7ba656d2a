"""The `zoe` command. Each area registers its own commands from its own module (cli/<area>.py), so the
command tree is assembled here and nowhere else; heavy imports (ray, torch) stay inside the commands."""

from __future__ import annotations

import typer

from zoe_cluster.cli import bench, deploy, k8s, plan, recipes, router, sim

app = typer.Typer(
    name="zoe",
    help="Serve frontier MoE models on MI355X clusters: recipes, planning, Ray deployments, routing, benchmarks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for area in (recipes, plan, sim, deploy, router, bench, k8s):
    area.register(app)


if __name__ == "__main__":  # pragma: no cover
    app()
