"""The `zoe` command as a shell sees it: version, -h on every command, JSON that parses at any terminal
width, and the exit codes docs/cli.md promises (0 success, 1 runtime failure, 2 usage error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.main import get_command

from zoe_cluster.cli.main import app


def zoe(*args: str, columns: int = 80, **env: str) -> subprocess.CompletedProcess:
    """Run the `zoe` console script's function in a fresh interpreter, as the installed command would."""
    code = "import sys; sys.argv[0] = 'zoe'; from zoe_cluster.cli.main import main; main()"
    full_env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color", **env}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          timeout=120)


def command_paths() -> list[list[str]]:
    def walk(cmd, path):
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, [*path, name])

    return list(walk(get_command(app), []))


def test_version_is_the_installed_distributions():
    res = zoe("--version")
    assert res.returncode == 0 and res.stdout == f"zoe {version('zoe-cluster')}\n"


def test_every_command_takes_dash_h():
    paths = command_paths()
    assert len(paths) > 20 and ["sim", "replay"] in paths and ["k8s", "routers"] in paths
    from typer.testing import CliRunner

    runner = CliRunner()
    for path in paths:
        res = runner.invoke(app, [*path, "-h"])
        assert res.exit_code == 0 and "Usage:" in res.output, (path, res.output)


@pytest.mark.parametrize("args", [
    ["recipes", "list", "--json"],
    ["recipes", "show", "glm-5.3", "--json"],
    ["plan", "glm-5.3", "--concurrency", "1", "--json"],
])  # fmt: skip
def test_json_is_never_wrapped_at_the_terminal_width(args):
    narrow, wide = zoe(*args, columns=20), zoe(*args, columns=400)
    assert narrow.returncode == 0, narrow.stderr
    assert narrow.stdout == wide.stdout
    doc = json.loads(narrow.stdout)
    longest = max(len(line) for line in narrow.stdout.splitlines())
    assert doc and longest > 20  # lines longer than the terminal stayed whole


def test_usage_errors_exit_2_naming_the_problem():
    res = zoe("plan", "llama-99", "--concurrency", "1")
    assert res.returncode == 2 and "unknown model 'llama-99'" in res.stderr and "glm-5.3" in res.stderr
    res = zoe("plan", "glm-5.3", "--no-such-flag")
    assert res.returncode == 2 and "--no-such-flag" in res.stderr
    res = zoe("sim", "replay", "/nonexistent.jsonl", "--model", "glm-5.3", "--replicas", "0")
    assert res.returncode == 2 and "--replicas must be positive" in res.stderr


def test_runtime_failures_exit_1(tmp_path):
    res = zoe("recipes", "list", ZOE_RECIPES_DIR=str(tmp_path))
    assert res.returncode == 1 and f"ZOE_RECIPES_DIR={tmp_path}: no recipe files" in res.stderr
    res = zoe("k8s", "nodes", "--server", "http://127.0.0.1:9")
    assert res.returncode == 1 and "reading nodes from the Kubernetes API failed" in res.stderr


def test_with_json_stdout_holds_the_document_alone():
    """Notes printed on the shared console while a --json command runs go to stderr (as `zoe deploy --json`
    does): a command added to the app in a child interpreter, run through the console script's main()."""
    code = """
import sys
import typer
from zoe_cluster.cli.common import console, print_json
from zoe_cluster.cli.main import app, main

@app.command("demo")
def demo(json_out: bool = typer.Option(False, "--json")):
    console.print("deploying glm-5.3: 2 x fp8-tp8 on sim")
    print_json({"replicas_ready": 2}) if json_out else console.print("2/2 ready")

sys.argv = ["zoe", *sys.argv[1:]]
main()
"""
    res = subprocess.run([sys.executable, "-c", code, "demo", "--json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout) == {"replicas_ready": 2}
    assert "deploying glm-5.3" in res.stderr
    res = subprocess.run([sys.executable, "-c", code, "demo"], capture_output=True, text=True, timeout=60)
    assert res.stdout == "deploying glm-5.3: 2 x fp8-tp8 on sim\n2/2 ready\n"
