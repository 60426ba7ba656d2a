"""The two distributions: what their metadata promises, what the wheels hold, and the wheels installed as
a user installs them (scripts/check_dist.sh)."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import check_wheels  # noqa: E402

CLUSTER = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
KERNELS = tomllib.loads((REPO / "kernels" / "pyproject.toml").read_text())["project"]
PLUGIN_MODULES = ["vllm_moe", "vllm_indexer", "sglang_hook", "sglang_dual_scope"]


def verified_range(engine: str) -> tuple[str, str]:
    """The union of the `<ENGINE>_VERSIONS` ranges ([lowest, first unsupported)) of the plugin's patches."""
    from zoe_kernels.integrations.patching import release

    ranges = []
    for name in PLUGIN_MODULES:
        module = importlib.import_module(f"zoe_kernels.integrations.{name}")
        if hasattr(module, f"{engine.upper()}_VERSIONS"):
            ranges.append(getattr(module, f"{engine.upper()}_VERSIONS"))
    assert ranges, f"no {engine.upper()}_VERSIONS in zoe_kernels.integrations"
    return min((r[0] for r in ranges), key=release), max((r[1] for r in ranges), key=release)


def short(version: str) -> str:
    """"0.32.0" -> "0.32" (how the extras write a range's ends), "0.5.23" stays."""
    return re.sub(r"\.0$", "", version) if version.count(".") == 2 else version


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kernels_extras_state_the_plugins_verified_engine_releases(engine):
    lo, hi = verified_range(engine)
    assert KERNELS["optional-dependencies"][engine] == [f"{engine}>={short(lo)},<{short(hi)}"]
    table = (REPO / "kernels" / "README.md").read_text()
    assert f"| {KERNELS['version']} | `{engine}` | `{engine}>={short(lo)},<{short(hi)}` |" in table


def test_cluster_extras_pull_the_kernels_of_the_same_version():
    v = CLUSTER["version"]
    assert KERNELS["version"] == v
    extras = CLUSTER["optional-dependencies"]
    assert extras["kernels"] == [f"zoe-kernels=={v}"]
    assert extras["vllm"] == [f"zoe-kernels[vllm]=={v}"] and extras["sglang"] == [f"zoe-kernels[sglang]=={v}"]


def test_kernels_depend_on_torch_and_triton_only():
    assert sorted(re.split(r"[<>=!~ \[]", d)[0] for d in KERNELS["dependencies"]) == ["torch", "triton"]


def test_every_cluster_dependency_is_imported():
    """A dependency nobody imports goes (uvicorn's [standard] extra is what its loop="auto" picks up)."""
    import_name = {"PyYAML": "yaml", "prometheus-client": "prometheus_client", "pyzmq": "zmq"}
    sources = "\n".join(p.read_text() for p in (REPO / "zoe_cluster").rglob("*.py"))
    for dep in CLUSTER["dependencies"]:
        name = re.split(r"[<>=!~ \[;]", dep)[0]
        module = import_name.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), f"{dep}: no module of zoe_cluster imports {module}"


def test_constraints_pin_every_release_once():
    lines = [ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    names = [ln.split("==")[0].lower() for ln in lines]
    assert all("==" in ln and "+" not in ln for ln in lines) and len(names) == len(set(names))
    assert "ray==2.60.0" in lines and not any(n.startswith("zoe") for n in names)


def _fake_wheel(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for n in names:
            zf.writestr(n, "")
    return path


def test_wheel_check_names_a_recipe_the_wheel_lacks(tmp_path):
    recipes = sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
    modules = [p.as_posix() for p in check_wheels.source_files("zoe_cluster", ("",))]
    shipped = [f"zoe_cluster/recipes/builtin/{r}" for r in recipes if r != "glm-5.3.yaml"]
    problems = check_wheels.check_cluster(_fake_wheel(tmp_path / "zoe_cluster-0-py3-none-any.whl", modules + shipped))
    assert problems == ["zoe_cluster-0-py3-none-any.whl: recipes/glm-5.3.yaml is missing "
                        "(expected zoe_cluster/recipes/builtin/glm-5.3.yaml)"]


def test_build_without_recipes_stops_naming_the_folder(tmp_path):
    shutil.copy(REPO / "setup.py", tmp_path / "setup.py")
    (tmp_path / "recipes").mkdir()
    res = subprocess.run([sys.executable, "setup.py", "--name"], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode != 0 and f"no recipe files (*.yaml) in {tmp_path / 'recipes'}" in res.stderr


@pytest.mark.slow
def test_wheels_install_and_run_outside_the_checkout(tmp_path):
    """Both wheels built, checked, and used from fresh virtual environments (about 1-2 minutes)."""
    env = {k: v for k, v in os.environ.items() if k != "ZOE_RECIPES_DIR"}
    res = subprocess.run(["bash", str(REPO / "scripts" / "check_dist.sh"), str(tmp_path / "dist")], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "zoe recipes list: 4 models" in res.stdout and "no ray, no zoe_cluster" in res.stdout
