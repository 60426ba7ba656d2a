"""What each built wheel must hold, checked from the files themselves (scripts/check_dist.sh runs it).

    python scripts/check_wheels.py DIST_DIR

- zoe-cluster: every recipes/*.yaml of the checkout as zoe_cluster/recipes/builtin/<name>.yaml, every
  file of zoe_cluster/ (modules and data), no zoe_kernels;
- zoe-kernels: every module and data file of kernels/ under zoe_kernels/, both engine entry points, and
  no requirement besides torch and triton (outside its engine extras).
Each problem is printed naming the wheel and the file; the exit status is 1 if there was any.
"""

from __future__ import annotations

import configparser
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {"vllm.general_plugins": "zoe_kernels.integrations.vllm_plugin:register",
                "sglang.srt.plugins": "zoe_kernels.integrations.sglang_hook:register"}


def source_files(folder: str, suffixes: tuple[str, ...]) -> list[Path]:
    """Files of `folder` git knows about (tracked, or new and not ignored), relative to the repository."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", folder],
                         check=True, capture_output=True, text=True).stdout.split()
    return sorted(Path(p) for p in out if p.endswith(suffixes) and (REPO / p).is_file())


def one_wheel(dist: Path, name: str) -> Path:
    found = sorted(dist.glob(f"{name}-*.whl"))
    if len(found) != 1:
        raise SystemExit(f"check_wheels: expected one {name} wheel in {dist}, found {[p.name for p in found]}")
    return found[0]


def metadata(zf: zipfile.ZipFile, suffix: str) -> str:
    names = [n for n in zf.namelist() if n.endswith(".dist-info/" + suffix)]
    return zf.read(names[0]).decode() if names else ""


def check_cluster(whl: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
    recipes = source_files("recipes", (".yaml",))
    if not recipes:
        problems.append(f"{REPO / 'recipes'}: no recipe files to ship")
    for src in recipes:
        if f"zoe_cluster/recipes/builtin/{src.name}" not in names:
            problems.append(f"{whl.name}: {src} is missing (expected zoe_cluster/recipes/builtin/{src.name})")
    for src in source_files("zoe_cluster", ("",)):  # modules and their data files (package_data in setup.py)
        if src.as_posix() not in names:
            problems.append(f"{whl.name}: {src} is missing")
    problems += [f"{whl.name}: {n} belongs to zoe-kernels" for n in sorted(names) if n.startswith("zoe_kernels/")]
    return problems


def check_kernels(whl: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        entry_points = metadata(zf, "entry_points.txt")
        meta = Parser().parsestr(metadata(zf, "METADATA"))
    for src in source_files("kernels", (".py", ".json")):
        target = "zoe_kernels/" + src.relative_to("kernels").as_posix()
        if target not in names:
            problems.append(f"{whl.name}: {src} is missing (expected {target}; "
                            "list its package in kernels/pyproject.toml)")
    problems += [f"{whl.name}: {n} does not belong to zoe-kernels" for n in sorted(names)
                 if not n.startswith(("zoe_kernels/", "zoe_kernels-"))]
    parser = configparser.ConfigParser()
    parser.read_string(entry_points)
    for group, target in ENTRY_POINTS.items():
        if not parser.has_section(group) or parser.get(group, "zoe_kernels", fallback=None) != target:
            problems.append(f"{whl.name}: entry point {group}: zoe_kernels = {target} is missing")
    for req in meta.get_all("Requires-Dist") or []:
        name = req.split(";")[0].strip()
        if "extra ==" not in req and not name.startswith(("torch", "triton")):
            problems.append(f"{whl.name}: requires {req!r}; zoe-kernels may depend on torch and triton only")
    return problems


def main(dist: Path) -> int:
    problems = check_cluster(one_wheel(dist, "zoe_cluster")) + check_kernels(one_wheel(dist, "zoe_kernels"))
    for p in problems:
        print(f"check_wheels: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
