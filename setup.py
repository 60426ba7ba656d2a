"""Package layout: `zoe_cluster` from ./zoe_cluster and `zoe_kernels` from ./kernels.

The kernels live in `kernels/` on disk but are imported as `zoe_kernels`, because transformers probes
for an unrelated package named `kernels`.
"""
from setuptools import find_packages, setup

packages = find_packages(include=["zoe_cluster", "zoe_cluster.*"])
packages += ["zoe_kernels"] + ["zoe_kernels." + p for p in find_packages("kernels")]
setup(
    packages=packages,
    package_dir={"zoe_kernels": "kernels"},
    package_data={"zoe_kernels.moe": ["*.json"]},
)
