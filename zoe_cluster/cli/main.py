"""The `zoe` command. Each area registers its own commands from its own module (cli/<area>.py), so the
command tree is assembled here and nowhere else; heavy imports (ray, torch) stay inside the commands.

Every command takes `-h`/`--help`; `zoe --version` prints the installed distribution's version. Exit codes
(docs/cli.md): 0 success, 1 a runtime failure, 2 a usage error."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Optional

import typer

from zoe_cluster.cli import bench, deploy, k8s, plan, recipes, router, sim
from zoe_cluster.cli.common import EXIT_RUNTIME, console, fail
from zoe_cluster.recipes.loader import RecipesNotFound

DISTRIBUTION = "zoe-cluster"

app = typer.Typer(
    name="zoe",
    help="Serve frontier MoE models on MI355X clusters: recipes, planning, Ray deployments, routing, benchmarks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # sub-commands inherit it from this context
)


def installed_version() -> str:
    """The version of the installed zoe-cluster distribution (a source tree that was never installed says so)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        print(f"zoe {installed_version()}")
        raise typer.Exit()


@app.callback()
def root(
    show_version: Optional[bool] = typer.Option(
        None, "--version", callback=_print_version, is_eager=True, help="Print zoe's version and exit."
    ),
) -> None:
    """Serve frontier MoE models on MI355X clusters: recipes, planning, Ray deployments, routing, benchmarks."""


for area in (recipes, plan, sim, deploy, router, bench, k8s):
    area.register(app)


def main() -> None:
    """The `zoe` console script: the app, with a missing recipe folder reported as a runtime failure. With
    `--json`, everything but the JSON document (notes, progress, tables) goes to stderr."""
    if "--json" in sys.argv[1:]:
        console.file = sys.stderr
    try:
        app()
    except RecipesNotFound as e:
        fail(str(e), code=EXIT_RUNTIME)


if __name__ == "__main__":  # pragma: no cover
    main()
