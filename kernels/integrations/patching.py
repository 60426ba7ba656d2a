"""Replacing an engine's function with zoe's, only where the engine is the one the patch was written for.

Each `PatchSpec` names the function to replace (`"pkg.module:Class.method"` or `"pkg.module:function"`), the
parameter names it must have, the engine functions the replacement calls itself (`calls`), and the engine releases
it was verified against. `install_kernel` checks every spec of one kernel first (engine version, each target and
each called function exists with its exact parameter list) and installs all of them or
none: on any mismatch the engine keeps its own path and the reporter logs a WARNING and records a fallback
(which reaches /metrics as `zoe_kernel_fallback_total{kernel,reason}`). Nothing here falls back silently.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.support import gap_reason, in_range, release

__all__ = ["PatchSpec", "install_kernel", "release", "resolve", "uninstall", "version_supported"]

ORIGINAL_ATTR = "__zoe_original__"


@dataclass(frozen=True)
class PatchSpec:
    """One function of an engine that zoe replaces."""

    kernel: str
    target: str
    """`module:attr.path`, e.g. `vllm.model_executor.layers.fused_moe.experts.cpu_moe:CPUUnquantizedExperts.apply`."""
    params: tuple[str, ...]
    """The exact parameter names, in order (including `self`), the replacement was written against."""
    versions: tuple[str, str]
    """Engine releases verified: [lowest, first unsupported), compared on the numeric release only."""
    wrap: Callable[[Callable], Callable]
    """Builds the replacement from the original (which the replacement calls on the engine's path)."""
    impl: str = "triton"
    """What runs on zoe's path, for the report (e.g. "triton", "reference (CPU)")."""
    calls: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Engine functions the replacement calls on zoe's path (`module:attr.path`, exact parameter names): checked
    like the target, so a release that renames or reshapes one keeps the engine's own path."""

    def checked(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(target, parameters) of everything `install_kernel` checks for this spec: the target, then `calls`."""
        return ((self.target, self.params), *self.calls)


def version_supported(version: str, versions: tuple[str, str]) -> bool:
    return in_range(version, versions)


def resolve(target: str) -> tuple[Any, str, Any]:
    """(owner object, attribute name, current value) for `module:attr.path`; raises LookupError if absent."""
    module_name, _, path = target.partition(":")
    if not path:
        raise LookupError(f"patch target {target!r} must look like 'module:attr.path'")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"cannot import {module_name}: {e}") from e
    parts = path.split(".")
    for part in parts[:-1]:
        if not hasattr(owner, part):
            raise LookupError(f"{module_name} has no {path} ({part} missing)")
        owner = getattr(owner, part)
    if not hasattr(owner, parts[-1]):
        raise LookupError(f"{module_name} has no {path}")
    return owner, parts[-1], getattr(owner, parts[-1])


def param_names(fn: Callable) -> tuple[str, ...]:
    fn = getattr(fn, ORIGINAL_ATTR, fn)
    return tuple(inspect.signature(fn).parameters)


def install_kernel(
    kernel: str, specs: list[PatchSpec], engine: str, engine_version: str, reporter: KernelReporter,
    platform: str | None = None,
) -> bool:
    """Install every spec of `kernel` verified for `engine_version`, or none of them (recording a fallback with
    the first reason). `specs` may hold one set per verified release range (a target renamed between releases);
    only the set whose range holds the running release is checked and installed. With `platform`, a release
    outside every range gets the support table's reason where it has one (`support.GAPS`)."""
    applicable = [s for s in specs if version_supported(engine_version, s.versions)]
    if not applicable:
        ranges = sorted({s.versions for s in specs}, key=lambda r: release(r[0]))
        verified = ", ".join(f"[{lo}, {hi})" for lo, hi in ranges)
        known = gap_reason(kernel, engine, platform, engine_version) if platform else None
        reporter.fallback(
            kernel, specs[0].target if specs else "-", "engine_version",
            f"{engine} {engine_version} is outside the verified range {verified}" + (f": {known}" if known else ""),
        )  # fmt: skip
        return False
    checked: list[tuple[PatchSpec, Any, str, Any]] = []
    for spec in applicable:
        for target, params in spec.checked():
            try:
                owner, name, current = resolve(target)
            except LookupError as e:
                reporter.fallback(kernel, target, "missing_target", str(e))
                return False
            found = param_names(current)
            if found != params:
                reporter.fallback(
                    kernel, target, "signature",
                    f"expected parameters ({', '.join(params)}), found ({', '.join(found)})",
                )  # fmt: skip
                return False
        owner, name, current = resolve(spec.target)
        checked.append((spec, owner, name, current))
    for spec, owner, name, current in checked:
        if getattr(current, ORIGINAL_ATTR, None) is None:  # a second register() in one process is a no-op
            _replace(owner, name, current, spec.wrap(current))
        reporter.patched(kernel, spec.target, spec.impl)
    return True


def _replace(owner: Any, name: str, original: Callable, replacement: Callable) -> None:
    functools.update_wrapper(replacement, original)
    setattr(replacement, ORIGINAL_ATTR, original)
    raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else None
    if isinstance(raw, staticmethod):
        replacement = staticmethod(replacement)
    elif isinstance(raw, classmethod):
        raise TypeError(f"patching classmethod {name} is not supported")
    setattr(owner, name, replacement)


def uninstall(target: str) -> bool:
    """Put the engine's original back (tests; a process that wants zoe's path off). True if it was patched."""
    owner, name, current = resolve(target)
    original = getattr(current, ORIGINAL_ATTR, None)
    if original is None:
        return False
    raw = inspect.getattr_static(owner, name) if inspect.isclass(owner) else None
    setattr(owner, name, staticmethod(original) if isinstance(raw, staticmethod) else original)
    return True
