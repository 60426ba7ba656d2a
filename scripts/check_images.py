"""The images of docker/images.yaml, checked without a container runtime (scripts/check_dist.sh runs it).

    python scripts/check_images.py DIST_DIR      # DIST_DIR holds the zoe-cluster and zoe-kernels wheels

- every Dockerfile parses (dockerfile-parse) into known instructions, its FROM (with the entry's build args)
  is the entry's `base`, and the Python it puts Ray and zoe on is `zoe_python`;
- every recipe variant's engine image has an entry with that `base` and engine;
- pip resolves each image's Python requirements for that image's Python, as a dry run: zoe-cluster with
  constraints.txt on `zoe_python` (Ray's release must be the one zoe-cluster pins, the same in every image),
  and zoe-kernels without dependencies (plus Ray at zoe's release where the Dockerfile puts Ray there too)
  on the engine's `engine_python`.
Each problem names the file it is about; the exit status is 1 if there was any.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docker" / "images.yaml"
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "LABEL", "EXPOSE", "VOLUME",
                "ENTRYPOINT", "CMD", "SHELL", "HEALTHCHECK", "STOPSIGNAL", "ONBUILD", "COMMENT"}
GLIBC_MINOR = 35
"""The oldest glibc among the base images (Ubuntu 22.04's 2.35), so a resolved wheel runs on every one."""
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(GLIBC_MINOR, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]
"""pip takes --platform literally (no older manylinux implied), so every tag up to that glibc is listed."""


def check_dockerfile(name: str, entry: dict, zoe_python: str) -> list[str]:
    path = REPO / entry["dockerfile"]
    if not path.is_file():
        return [f"{IMAGES.relative_to(REPO)}: image {name}: {entry['dockerfile']} does not exist"]
    rel = path.relative_to(REPO)
    df = DockerfileParser(str(path), build_args=entry.get("build_args", {}))
    problems = [f"{rel}:{i['startline'] + 1}: unknown instruction {i['instruction']}"
                for i in df.structure if i["instruction"] not in INSTRUCTIONS]
    froms = [i for i in df.structure if i["instruction"] == "FROM"]
    if len(froms) != 1:
        problems.append(f"{rel}: expected one FROM, found {len(froms)}")
    if df.baseimage != entry["base"]:
        problems.append(f"{rel}: FROM resolves to {df.baseimage!r} for image {name}, "
                        f"but {IMAGES.relative_to(REPO)} says {entry['base']!r}")
    if "engine" in entry:
        python = df.args.get("ZOE_PYTHON")
        if python != zoe_python:
            problems.append(f"{rel}: ARG ZOE_PYTHON={python} but zoe_python is {zoe_python} "
                            "(one Python per Ray cluster)")
        if not re.search(r"python\$\{ZOE_PYTHON\} -m venv /opt/zoe", df.content):
            problems.append(f"{rel}: Ray and zoe must go into a venv /opt/zoe made by python${{ZOE_PYTHON}}")
        ray = df.args.get("RAY_VERSION")
        if ray is not None and ray != ray_pin():
            problems.append(f"{rel}: ARG RAY_VERSION={ray} but zoe-cluster pins ray[default]=={ray_pin()}")
    else:
        m = re.match(r"python:(\d+\.\d+)", df.baseimage or "")
        if not m or m.group(1) != zoe_python:
            problems.append(f"{rel}: the zoe image's FROM {df.baseimage!r} is not python:{zoe_python}")
    for i in df.structure:
        if i["instruction"] == "COPY":
            for src in i["value"].split()[:-1]:
                if not src.startswith(("--", "dist/")) and not (REPO / src).exists():
                    problems.append(f"{rel}:{i['startline'] + 1}: COPY source {src} does not exist")
    return problems


@lru_cache(maxsize=1)
def ray_pin() -> str:
    """The Ray release zoe-cluster pins (pyproject.toml)."""
    return re.search(r'"ray\[default\]==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)


def engine_ray(entry: dict) -> str | None:
    """The Ray release a worker Dockerfile installs into the engine's interpreter (ARG RAY_VERSION), if any."""
    df = DockerfileParser(str(REPO / entry["dockerfile"]), build_args=entry.get("build_args", {}))
    return df.args.get("RAY_VERSION")


def check_recipes(images: dict[str, dict]) -> list[str]:
    sys.path.insert(0, str(REPO))
    from zoe_cluster.recipes.loader import CHECKOUT_DIR, load_recipe_file

    have = {(e.get("engine"), e["base"]) for e in images.values()}
    problems = []
    for path in sorted(CHECKOUT_DIR.glob("*.yaml")):
        recipe = load_recipe_file(path)
        for vname, variant in recipe.variants.items():
            if (variant.engine, variant.image) not in have:
                problems.append(f"recipes/{path.name}: variants.{vname}.image {variant.image} ({variant.engine}) "
                                f"has no image built FROM it in {IMAGES.relative_to(REPO)}")
    return problems


@lru_cache(maxsize=None)
def dry_run(python_version: str, requirement: str, no_deps: bool) -> tuple[dict[str, str], str]:
    """({distribution: version} pip would install, error text) for `requirement` on `python_version`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--report", str(report), "--target", str(Path(tmp) / "target"), "--only-binary=:all:",
               "--python-version", python_version, "--disable-pip-version-check"]
        cmd += [arg for tag in PLATFORMS for arg in ("--platform", tag)]
        cmd += ["--no-deps"] if no_deps else ["-c", str(REPO / "constraints.txt")]
        res = subprocess.run([*cmd, requirement], capture_output=True, text=True)
        if res.returncode != 0:
            errors = [ln for ln in res.stderr.splitlines() if not ln.startswith("WARNING: Location")]
            return {}, "\n".join(errors[-6:])
        items = json.loads(report.read_text())["install"]
        return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}, ""


def check_resolution(images: dict[str, dict], zoe_python: str, dist: Path) -> list[str]:
    (cluster,) = dist.glob("zoe_cluster-*.whl")
    (kernels,) = dist.glob("zoe_kernels-*.whl")
    pinned = ray_pin()
    problems = []
    for name, entry in images.items():
        where = f"{entry['dockerfile']} ({name})"
        resolved, err = dry_run(zoe_python, str(cluster), False)
        if err:
            problems.append(f"{where}: zoe-cluster does not resolve for Python {zoe_python}: {err}")
        elif resolved.get("ray") != pinned:
            problems.append(f"{where}: Ray resolves to {resolved.get('ray')} on Python {zoe_python}, not {pinned}")
        else:
            print(f"check_images: {name}: zoe-cluster on Python {zoe_python}: {len(resolved)} packages, ray {pinned}")
        if "engine_python" in entry:
            _, err = dry_run(entry["engine_python"], str(kernels), True)
            if err:
                problems.append(f"{where}: zoe-kernels does not install on the engine's Python "
                                f"{entry['engine_python']}: {err}")
            else:
                print(f"check_images: {name}: zoe-kernels on the engine's Python {entry['engine_python']}")
            ray = engine_ray(entry)
            if ray is not None:
                resolved, err = dry_run(entry["engine_python"], f"ray[default]=={ray}", False)
                if err or resolved.get("ray") != pinned:
                    problems.append(f"{where}: the engine's Ray does not resolve to {pinned} on Python "
                                    f"{entry['engine_python']}: {err or resolved.get('ray')}")
                else:
                    print(f"check_images: {name}: ray {pinned} on the engine's Python {entry['engine_python']}")
    return problems


def main(dist: Path) -> int:
    spec = yaml.safe_load(IMAGES.read_text())
    images, zoe_python = spec["images"], spec["zoe_python"]
    problems = [p for name, entry in images.items() for p in check_dockerfile(name, entry, zoe_python)]
    problems += check_recipes(images)
    problems += check_resolution(images, zoe_python, dist)
    for p in problems:
        print(f"check_images: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
