"""Runs under an engine test environment's python; prints JSON: each kernel's patch targets on each platform, as
the installed engine release has them.

    python _targets_probe.py vllm      targets resolved by importing vLLM's real modules
    python _targets_probe.py sglang    targets read from SGLang's installed source (its CUDA-only imports
                                       keep the modules from loading here)

For every (kernel, platform) the plugin has patches for, the specs verified for this release (or, where none
is, the specs of every other verified release): each target and each engine function its replacement calls, with
the parameters found in the engine (None: no such target).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from zoe_kernels.integrations.patching import param_names, resolve
from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.support import PLATFORMS, in_range, ranges

engine = sys.argv[1]
reporter = KernelReporter(engine, "probe", [], None)

if engine == "vllm":
    import vllm

    from zoe_kernels.integrations.vllm_plugin import KERNEL_SPECS

    version = vllm.__version__
    builders = {k: (lambda b: lambda platform: b(platform, reporter))(b) for k, b in KERNEL_SPECS.items()}

    def found_params(target: str):
        try:
            return list(param_names(resolve(target)[2]))
        except LookupError:
            return None

else:  # located, not imported: sglang 0.5.19's package __init__ alone needs torchvision
    import importlib.metadata
    import importlib.util

    from zoe_kernels.integrations.sglang_hook import KERNEL_SPECS, source_params

    version = importlib.metadata.version("sglang")
    builders = {k: (lambda b: lambda platform: b(reporter, platform))(b) for k, b in KERNEL_SPECS.items()}
    package_dir = Path(importlib.util.find_spec("sglang").origin).parent

    def found_params(target: str):
        found = source_params(target, package_dir)
        return None if found is None else list(found)


rows = []
for kernel, build in builders.items():
    for platform in PLATFORMS:
        if engine == "sglang" and platform == "cpu":
            continue
        specs = build(platform)
        verified = any(in_range(version, r) for r in ranges(kernel, engine, platform))
        mine = [s for s in specs if in_range(version, s.versions)]
        for spec in mine or specs:
            for target, params in spec.checked():  # the patch target, then the engine functions it calls
                rows.append({"kernel": kernel, "platform": platform, "verified_here": verified,
                             "spec_versions": list(spec.versions), "target": target,
                             "expected": list(params), "found": found_params(target)})  # fmt: skip
print(json.dumps({"version": version, "rows": rows}))
