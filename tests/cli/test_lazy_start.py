"""`zoe router` starts without the rest of the CLI: the root group imports an area only when one of its commands
runs or help lists it, and the router's own imports leave out recipes, the simulator, Ray and torch (a restarted
router serves again sooner). Help still lists every command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import typer

from zoe_cluster.cli.main import COMMAND_AREAS

NOT_FOR_THE_ROUTER = ("ray", "torch", "matplotlib", "kubernetes", "triton", "zoe_cluster.recipes", "zoe_cluster.sim",
                      "zoe_cluster.planner", "zoe_cluster.cluster", "zoe_cluster.cli.deploy", "zoe_cluster.cli.bench",
                      "zoe_cluster.cli.sim", "zoe_cluster.cli.plan", "zoe_cluster.cli.k8s", "zoe_cluster.cli.recipes")

# `zoe router` as the console script runs it, up to the moment uvicorn would start serving: the server's run()
# prints the loaded module names instead (everything the start imports has been imported by then).
START = """
import json, sys
from zoe_cluster.router import drain
drain.DrainingServer.run = lambda self: print(json.dumps(sorted(sys.modules)))
sys.argv[0] = "zoe"
from zoe_cluster.cli.main import main
main()
"""


def test_router_start_imports_only_the_router():
    res = subprocess.run([sys.executable, "-c", START, "router", "--replica", "http://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    modules = set(json.loads(res.stdout.splitlines()[-1]))
    assert {"zoe_cluster.router.app", "zoe_cluster.cli.router", "uvicorn"} <= modules  # the start did run
    loaded = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NOT_FOR_THE_ROUTER))
    assert loaded == []


def test_every_area_registers_exactly_the_commands_main_names():
    for area in sorted(set(COMMAND_AREAS.values())):
        sub = typer.Typer()
        __import__(f"zoe_cluster.cli.{area}", fromlist=["register"]).register(sub)
        registered = set(typer.main.get_group(sub).commands)
        assert registered == {name for name, a in COMMAND_AREAS.items() if a == area}, area


def test_help_lists_every_command_in_order():
    res = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "--help"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    listed = [line.split()[1] for line in res.stdout.splitlines()
              if line.startswith("│ ") and len(line.split()) > 2 and line.split()[1] in COMMAND_AREAS]
    assert listed == list(COMMAND_AREAS)
