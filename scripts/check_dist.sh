#!/usr/bin/env bash
# Builds the two distributions and uses them as a user would, outside the checkout (CI runs it through
# tests/packaging/test_dist.py):
#   1. zoe-cluster and zoe-kernels wheels from a clean copy of the tracked sources (no stale build/ files);
#   2. scripts/check_wheels.py: recipes, modules, entry points and requirements inside each wheel;
#      scripts/check_images.py: docker/ against docker/images.yaml and the recipes, with pip dry runs;
#   3. zoe-cluster in a fresh venv with its dependencies (pinned by constraints.txt): `zoe --version`,
#      `zoe recipes list --json` (every recipe of recipes/), `zoe plan glm-5.3 --concurrency 1 --json`;
#   4. zoe-kernels in a fresh venv with --no-deps plus torch and triton only: both engine plugins import
#      and load through their entry points, and Ray is absent.
#   bash scripts/check_dist.sh [WORK_DIR]      # WORK_DIR is emptied first and kept; default: a temporary
#                                              # folder, removed at the end (the venvs take about 1.5 GB)
# Environment: ZOE_BUILD_PYTHON (default .venv/bin/python: setuptools builds without network),
# ZOE_BASE_PYTHON (the interpreter the fresh venvs are made from; default python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 1 ]; then work=$1; else work=$(mktemp -d -t zoe-dist.XXXXXX); trap 'rm -rf "$work"' EXIT; fi
build_py=${ZOE_BUILD_PYTHON:-$repo/.venv/bin/python}
base_py=${ZOE_BASE_PYTHON:-python3}
torch_pin=torch==2.13.0 triton_pin=triton==3.9.0  # the releases CI tests the kernels with (setup_test_envs.sh)
rm -rf "$work" && mkdir -p "$work/src" "$work/dist"
t0=$SECONDS
step() { printf '\033[1m[check_dist %3ds]\033[0m %s\n' $((SECONDS - t0)) "$*"; }
die() { echo "check_dist: $*" >&2; exit 1; }
# pip, without the warnings about the machine's configured local index folders that do not exist (installs
# below skip compiling bytecode: most of their time, and nothing the checks need)
quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }; }

step "building wheels into $work/dist"
git -C "$repo" ls-files -z --cached --others --exclude-standard -- \
    pyproject.toml setup.py README.md zoe_cluster recipes kernels \
  | (cd "$repo" && xargs -0 cp --parents -t "$work/src" 2>/dev/null || true)
# files deleted in the work tree but still in the index are skipped by cp; the wheel check names what matters
quiet "$build_py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/src" "$work/src/kernels"
ls -l "$work/dist"
"$build_py" "$repo/scripts/check_wheels.py" "$work/dist"

step "images: Dockerfiles against docker/images.yaml and the recipes, pip dry runs per image Python"
"$build_py" "$repo/scripts/check_images.py" "$work/dist"

step "zoe-cluster in a fresh venv"
"$base_py" -m venv "$work/zoe"
quiet "$work/zoe/bin/pip" install -q --no-compile -c "$repo/constraints.txt" "$work"/dist/zoe_cluster-*.whl
cd "$work"  # away from the checkout: the recipes must come from the wheel
want_version=$("$build_py" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
  "$repo/pyproject.toml")
got=$("$work/zoe/bin/zoe" --version)
[ "$got" = "zoe $want_version" ] || die "zoe --version printed '$got', expected 'zoe $want_version'"
"$work/zoe/bin/zoe" recipes list --json > "$work/recipes.json"
"$work/zoe/bin/zoe" plan glm-5.3 --concurrency 1 --json > "$work/plan.json"
"$work/zoe/bin/python" - "$repo/recipes" "$work/recipes.json" "$work/plan.json" <<'PY'
import json, sys
from pathlib import Path

import zoe_cluster.recipes.loader as loader

want = sorted(p.stem for p in Path(sys.argv[1]).glob("*.yaml"))
got = sorted(r["model"] for r in json.loads(Path(sys.argv[2]).read_text()))
assert got == want, f"zoe recipes list --json: {got}, expected the checkout's recipes {want}"
assert loader.default_recipes_dir() == loader.BUILTIN_DIR, f"recipes read from {loader.default_recipes_dir()}"
plan = json.loads(Path(sys.argv[3]).read_text())
assert plan["model"] == "glm-5.3" and plan["replicas"] >= 1, f"zoe plan: {plan}"
print(f"zoe recipes list: {len(got)} models {got}; zoe plan glm-5.3 -c 1: {plan['variant']} x {plan['replicas']}")
PY

step "zoe-kernels in a fresh venv (--no-deps, then $torch_pin $triton_pin)"
"$base_py" -m venv "$work/kernels"
quiet "$work/kernels/bin/pip" install -q --no-compile --no-deps "$work"/dist/zoe_kernels-*.whl
quiet "$work/kernels/bin/pip" install -q --no-compile -c "$repo/constraints.txt" "$torch_pin" "$triton_pin"
"$work/kernels/bin/python" - <<'PY'
import importlib.util
from importlib.metadata import entry_points

import zoe_kernels.integrations.sglang_hook
import zoe_kernels.integrations.vllm_plugin  # noqa: F401

assert importlib.util.find_spec("ray") is None, "ray is installed next to zoe-kernels"
assert importlib.util.find_spec("zoe_cluster") is None, "zoe_cluster is installed next to zoe-kernels"
for group in ("vllm.general_plugins", "sglang.srt.plugins"):
    (ep,) = [e for e in entry_points(group=group) if e.name == "zoe_kernels"]
    assert callable(ep.load()), f"{group}: {ep.value} is not callable"
print("zoe-kernels: both plugins import and load through their entry points; no ray, no zoe_cluster")
PY
step "done"
