"""The two distributions: what their metadata promises, what the wheels hold, and the wheels installed as
a user installs them (scripts/check_dist.sh)."""

from __future__ import annotations

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
def verified_releases(engine: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The [lowest, first unsupported) release ranges some kernel of the plugin is verified on for `engine`,
    over every platform, merged and sorted (zoe_kernels.integrations.support holds them)."""
    from zoe_kernels.integrations.patching import release
    from zoe_kernels.integrations.support import table

    spans = sorted((release(lo), release(hi)) for k in table()["kernels"].values()
                   for per_platform in k.get(engine, {}).values() for lo, hi in per_platform)
    merged: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def requirement(engine: str) -> str:
    """The extra's requirement for exactly those releases: ">=lowest,<highest" and a `!=X.*` for each release
    series in a gap between ranges (a release there would load the plugin only to fall back)."""

    def text(v: tuple[int, ...]) -> str:
        return ".".join(map(str, v[:-1] if len(v) == 3 and v[-1] == 0 else v))

    ranges = verified_releases(engine)
    spec = f"{engine}>={text(ranges[0][0])},<{text(ranges[-1][1])}"
    for (_, gap_lo), (gap_hi, _) in zip(ranges, ranges[1:]):
        i = next(i for i, (a, b) in enumerate(zip(gap_lo, gap_hi)) if a != b)  # the component that steps
        spec += "".join(f",!={text(gap_lo[:i] + (n,))}.*" for n in range(gap_lo[i], gap_hi[i]))
    return spec


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kernels_extras_state_the_plugins_verified_engine_releases(engine):
    assert verified_releases(engine), f"zoe_kernels.integrations.support verifies no {engine} release"
    assert KERNELS["optional-dependencies"][engine] == [requirement(engine)]
    table = (REPO / "kernels" / "README.md").read_text()
    assert f"| {KERNELS['version']} | `{engine}` | `{requirement(engine)}` |" in table


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
        imported = re.search(rf"^\s*(import|from) {module}\b", sources, re.M)
        assert imported, f"{dep}: no module of zoe_cluster imports {module}"


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
def test_wheels_install_and_run_outside_the_checkout():
    """Both wheels built, checked, and used from fresh virtual environments (about 1-2 minutes)."""
    env = {k: v for k, v in os.environ.items() if k != "ZOE_RECIPES_DIR"}
    res = subprocess.run(["bash", str(REPO / "scripts" / "check_dist.sh")], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "zoe recipes list: 4 models" in res.stdout and "no ray, no zoe_cluster" in res.stdout
