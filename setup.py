"""zoe-cluster's package layout: `zoe_cluster` from ./zoe_cluster, the built-in recipes from ./recipes.

The recipes stay at the top of the repository and ship in the wheel as the data package
`zoe_cluster.recipes.builtin` (zoe_cluster/recipes/loader.py looks there first). A build without them
stops here, naming the folder. The kernels are a separate distribution: kernels/pyproject.toml.
"""
from pathlib import Path

from setuptools import find_packages, setup

RECIPES = Path(__file__).resolve().parent / "recipes"
if not sorted(RECIPES.glob("*.yaml")):
    raise SystemExit(f"setup.py: no recipe files (*.yaml) in {RECIPES}; the zoe-cluster wheel must ship them")

setup(
    packages=find_packages(include=["zoe_cluster", "zoe_cluster.*"]) + ["zoe_cluster.recipes.builtin"],
    package_dir={"zoe_cluster.recipes.builtin": "recipes"},
    package_data={"zoe_cluster": ["**/*.json"], "zoe_cluster.recipes.builtin": ["*.yaml"]},
)
