"""The vLLM plugin: routes vLLM's MoE and DSA-indexer calls to zoe_kernels when `ZOE_KERNELS` asks for them.

vLLM runs `register()` (entry point `vllm.general_plugins` -> `zoe_kernels`) in every process it starts: the
API server, the engine core and each worker. Without `ZOE_KERNELS` in the environment it does nothing. With
it, each process patches the kernels named there (see `KERNEL_SPECS`), each patch checked against the vLLM
version and the replaced function's parameters (`patching.install_kernel`), and writes its report into
`$ZOE_KERNELS_REPORT_DIR` (a temporary folder shared with the engine's child processes when unset). The
API server's /metrics exports the replica's reports (`report.ReportCollector`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec, install_kernel
from zoe_kernels.integrations.report import (
    REPORT_DIR_ENV,
    KernelReporter,
    ReportCollector,
    log,
    requested_kernels,
)
from zoe_kernels.integrations.support import KERNELS
from zoe_kernels.integrations.vllm_indexer import lightning_indexer_specs
from zoe_kernels.integrations.vllm_moe import fused_moe_specs

SpecBuilder = Callable[[str, KernelReporter], list[PatchSpec]]

KERNEL_SPECS: dict[str, SpecBuilder] = {
    "fused_moe": fused_moe_specs,
    "lightning_indexer": lightning_indexer_specs,
}
"""Kernels with a vLLM integration. The CSA kernels serve DeepSeek-V4, which zoe's recipes run on SGLang."""

KNOWN_KERNELS = KERNELS
AITER_MOE_ENV = "VLLM_ROCM_USE_AITER_MOE"


def vllm_platform() -> str:
    """"cpu", "cuda" or "rocm": the platform vLLM itself selected (so the patch matches what runs); else its
    device type, or "unspecified"."""
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cuda():
        return "cuda"
    if current_platform.is_cpu():
        return "cpu"
    # e.g. a CUDA build of vLLM on a machine without a GPU: vLLM's UnspecifiedPlatform, device_type ""
    return str(getattr(current_platform, "device_type", "") or "unspecified")


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def report_dir() -> str:
    """The replica's report folder; created (and exported to the engine's children) when unset."""
    folder = os.environ.get(REPORT_DIR_ENV)
    if not folder:
        folder = tempfile.mkdtemp(prefix="zoe-kernels-")
        os.environ[REPORT_DIR_ENV] = folder
    return folder


def patch_vllm(kernels: list[str], reporter: KernelReporter, platform: str, version: str) -> list[str]:
    """Install each requested kernel's patches (or record why not); returns the kernels patched in."""
    patched = []
    for kernel in kernels:
        builder = KERNEL_SPECS.get(kernel)
        if builder is None:
            reason = "unsupported" if kernel in KNOWN_KERNELS else "unknown_kernel"
            reporter.fallback(kernel, "-", reason, f"no vLLM integration for {kernel!r}")
            continue
        try:
            specs = builder(platform, reporter)
        except ImportError as e:
            reporter.fallback(kernel, "zoe_kernels", "kernel_unavailable", f"{type(e).__name__}: {e}")
            continue
        if not specs:
            reporter.fallback(kernel, "-", "unsupported", f"no vLLM integration for {kernel} on {platform}")
            continue
        rocm_moe = kernel == "fused_moe" and platform == "rocm"
        if rocm_moe and aiter_moe_pinned(reporter, specs[-1].target):
            continue
        if install_kernel(kernel, specs, "vllm", version, reporter, platform):
            if rocm_moe:
                route_rocm_moe_to_triton(reporter)
            patched.append(kernel)
    return patched


def _env_on(name: str, default: str) -> bool:
    return os.environ.get(name, default).lower() in ("1", "true")


def aiter_moe_pinned(reporter: KernelReporter, target: str) -> bool:
    """True (and a loud fallback) when the operator pinned AITER's MoE on ROCm: AITER runs on pre-shuffled
    weights, which are not zoe's layout, so zoe's fused MoE cannot take its calls."""
    if _env_on("VLLM_ROCM_USE_AITER", "0") and _env_on("VLLM_ROCM_USE_AITER_MOE", "0"):
        reporter.fallback(
            "fused_moe", target, "engine_backend",
            "VLLM_ROCM_USE_AITER_MOE=1 pins AITER's MoE, whose shuffled weights are not zoe's layout; "
            "unset it (or set 0) to run zoe below the crossover and vLLM's Triton MoE above",
        )  # fmt: skip
        return True
    return False


def route_rocm_moe_to_triton(reporter: KernelReporter) -> None:
    """On ROCm with `VLLM_ROCM_USE_AITER=1`, make vLLM build its Triton MoE experts (the class zoe patches)
    instead of AITER's: `VLLM_ROCM_USE_AITER_MOE=0` in this process (AITER stays on for everything else). zoe's
    kernel then runs below the crossover and vLLM's Triton MoE above it, not AITER's.

    zoe's engine adapter already puts the switch in the engine's environment at launch; this covers an engine
    started some other way. vLLM may have read the switch before the plugin runs, so the values it keeps are
    refreshed too (`sync_aiter_moe_switch`)."""
    if not _env_on("VLLM_ROCM_USE_AITER", "0") or AITER_MOE_ENV in os.environ:
        return
    os.environ[AITER_MOE_ENV] = "0"
    refreshed = sync_aiter_moe_switch()
    already = f"; refreshed what vLLM had read already: {', '.join(refreshed)}" if refreshed else ""
    reporter.note(f"fused_moe: set {AITER_MOE_ENV}=0 so vLLM builds the Triton MoE experts zoe patches (above "
                  f"the crossover vLLM's Triton MoE runs, not AITER's){already}")  # fmt: skip


def sync_aiter_moe_switch() -> list[str]:
    """Make vLLM modules that read `VLLM_ROCM_USE_AITER_MOE` before it was set see its current value; returns
    what was refreshed.

    vLLM reads it through `vllm.envs` (a module `__getattr__` that the engine core and workers wrap in
    `functools.cache` once started: `enable_envs_cache`) and `vllm._aiter_ops.rocm_aiter_ops` copies it into the
    class attribute `_FMOE_ENABLED` when that module is imported (0.29-0.33); `is_fused_moe_enabled()` reads the
    copy. Modules not imported yet read the environment when they are."""
    refreshed = []
    envs = sys.modules.get("vllm.envs")
    cached = getattr(envs, "__getattr__", None)
    if hasattr(cached, "cache_clear"):
        cached.cache_clear()
        refreshed.append("vllm.envs cache")
    ops = getattr(sys.modules.get("vllm._aiter_ops"), "rocm_aiter_ops", None)
    if ops is not None and hasattr(ops, "_FMOE_ENABLED"):
        want = _env_on(AITER_MOE_ENV, "1")
        if ops._FMOE_ENABLED != want:
            if hasattr(ops, "refresh_env_variables"):  # vLLM's own re-read of every AITER switch
                ops.refresh_env_variables()
            if ops._FMOE_ENABLED != want:
                ops._FMOE_ENABLED = want
            refreshed.append("rocm_aiter_ops._FMOE_ENABLED")
    return refreshed


def export_metrics(folder: str) -> None:
    """Serve the replica's reports on this process's /metrics (the API server's is the one scraped)."""
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return
    try:
        REGISTRY.register(ReportCollector(folder))
    except ValueError:  # already registered in this process
        pass


def register() -> None:
    """Entry point `vllm.general_plugins: zoe_kernels`."""
    kernels = requested_kernels()
    if not kernels:
        return
    folder = report_dir()
    version = vllm_version()
    reporter = KernelReporter("vllm", version, kernels, folder)
    try:
        platform = vllm_platform()
        patched = patch_vllm(kernels, reporter, platform, version)
    except Exception as e:  # a broken plugin must not take the engine down: it serves on its own path
        log.exception("vLLM plugin failed; vLLM keeps its own kernels")
        for k in kernels:
            if k not in reporter.report.patched:
                reporter.fallback(k, "-", "plugin_error", f"{type(e).__name__}: {e}")
        patched = []
    export_metrics(folder)
    reporter.flush()
    log.info("vLLM %s process %d runs zoe kernels %s (asked for %s; report in %s)",
             version, os.getpid(), patched, kernels, folder)  # fmt: skip
