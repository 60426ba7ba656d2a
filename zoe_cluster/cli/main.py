"""The `zoe` command. Each area registers its own commands from its own module (cli/<area>.py); this module
names which area holds which command and imports an area only when one of its commands runs or help lists it,
so `zoe router` (restarted by a supervisor, a pod's container) starts without the deployment, benchmark,
simulator and Kubernetes code. Heavy imports (ray, torch) stay inside the commands.

Every command takes `-h`/`--help`; `zoe --version` prints the installed distribution's version. Exit codes
(docs/cli.md): 0 success, 1 a runtime failure, 2 a usage error."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, MutableMapping
from typing import Optional

import typer
from typer.core import TyperGroup

from zoe_cluster.cli.common import EXIT_RUNTIME, console, fail

DISTRIBUTION = "zoe-cluster"

COMMAND_AREAS: dict[str, str] = {
    "plan": "plan",
    "deploy": "deploy", "status": "deploy", "scale": "deploy", "switch": "deploy", "logs": "deploy",
    "undeploy": "deploy",
    "router": "router",
    "recipes": "recipes",
    "sim": "sim",
    "bench": "bench",
    "k8s": "k8s",
}
"""Each top-level command and the area module (`zoe_cluster.cli.<area>`) whose `register(app)` adds it, in the
order `zoe --help` lists them. tests/cli/test_lazy_start.py checks it against what every area registers."""


class LazyCommands(MutableMapping):
    """The root group's commands by name: every name of COMMAND_AREAS is listed, and the first lookup of one
    imports its area and builds that area's click commands (all of them, as typer would at start)."""

    def __init__(self, loaded: dict, settings: dict) -> None:
        self._loaded = dict(loaded)
        self._settings = settings

    def _load_area(self, area: str) -> None:
        sub = typer.Typer(**self._settings)
        importlib.import_module(f"zoe_cluster.cli.{area}").register(sub)
        for name, command in typer.main.get_group(sub).commands.items():
            self._loaded.setdefault(name, command)

    def __getitem__(self, name: str):
        if name not in self._loaded and name in COMMAND_AREAS:
            self._load_area(COMMAND_AREAS[name])
        return self._loaded[name]

    def __setitem__(self, name: str, command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMAND_AREAS
        yield from (name for name in self._loaded if name not in COMMAND_AREAS)

    def __len__(self) -> int:
        return len(COMMAND_AREAS.keys() | self._loaded.keys())


_SETTINGS = dict(pretty_exceptions_enable=False, add_completion=False)


class ZoeGroup(TyperGroup):
    """The root group, its commands a LazyCommands (lookups, listing, help and typo suggestions go through it)."""

    def __init__(self, *, commands=None, **attrs) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(commands or {}, _SETTINGS)


app = typer.Typer(
    name="zoe",
    cls=ZoeGroup,
    help="Serve frontier MoE models on MI355X clusters: recipes, planning, Ray deployments, routing, benchmarks.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # sub-commands inherit it from this context
    **_SETTINGS,
)


def installed_version() -> str:
    """The version of the installed zoe-cluster distribution (a source tree that was never installed says so)."""
    from importlib.metadata import PackageNotFoundError, version

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


def main() -> None:
    """The `zoe` console script: the app, with a missing recipe folder reported as a runtime failure. With
    `--json`, everything but the JSON document (notes, progress, tables) goes to stderr."""
    if "--json" in sys.argv[1:]:
        console.file = sys.stderr
    try:
        app()
    except FileNotFoundError as e:
        from zoe_cluster.recipes.loader import RecipesNotFound  # imported already when the loader raised it

        if not isinstance(e, RecipesNotFound):
            raise
        fail(str(e), code=EXIT_RUNTIME)


if __name__ == "__main__":  # pragma: no cover
    main()
