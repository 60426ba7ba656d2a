"""ROCm vs CUDA differences for zoe's Triton kernels, kept in one place.

Kernels ask this module for the fp8 flavour of the device and for extra launch options; nothing else in
`zoe_kernels` branches on the vendor.
- fp8: `float8_e4m3fn` on NVIDIA and gfx950 (MI355X); `float8_e4m3fnuz` on gfx942 (MI300X/MI325X).
- launch options: `waves_per_eu` and `matrix_instr_nonkdim` exist only on ROCm and raise on NVIDIA.
- inline PTX (`tl.inline_asm_elementwise`): only on NVIDIA GPUs (`has_ptx`); kernels keep a portable path.
- Gluon kernels written for Hopper (`has_gluon_hopper`): sm_90 only; the Triton kernel stays the portable path.
"""

from __future__ import annotations

import functools
import os

import torch


def is_rocm() -> bool:
    """True when torch was built for HIP (AMD GPUs)."""
    return torch.version.hip is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def gcn_arch(device_index: int = 0) -> str:
    """The AMD architecture name (e.g. 'gfx942'), or '' on other devices."""
    if not is_rocm() or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_properties(device_index).gcnArchName.split(":")[0]


def fp8_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The e4m3 fp8 flavour the device's matrix units take."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and gcn_arch(dev.index or 0) == "gfx942":
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 240 for e4m3fnuz)."""
    return float(torch.finfo(dtype).max)


def device_name(device: torch.device | str | None = None) -> str:
    """A stable name for the device, used as the key of measured tables ('cpu' without a GPU)."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type != "cuda":
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(dev.index if dev is not None and dev.index is not None else 0)


def has_ptx() -> bool:
    """True where kernels may emit inline PTX: an NVIDIA GPU, not ROCm and not the CPU interpreter."""
    return not interpreting() and not is_rocm() and torch.cuda.is_available()


try:  # programmatic dependent launch from Triton code (CUDA sm_90+); absent from some Triton builds
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - has_pdl is then False and no kernel traces these
    gdc_launch_dependents = gdc_wait = None


@functools.lru_cache(maxsize=None)
def has_pdl(device_index: int = 0) -> bool:
    """Programmatic dependent launch (`launch_pdl=True`, `gdc_wait` / `gdc_launch_dependents` in the kernel):
    CUDA (not ROCm, not the interpreter) at compute capability >= 9, with a Triton that has it."""
    return (gdc_wait is not None and not interpreting() and not is_rocm() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int = 0) -> int:
    """Streaming multiprocessors (CUDA) or compute units (ROCm) of the device; 0 without a GPU."""
    if interpreting() or not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def has_gluon_hopper(device_index: int = 0) -> bool:
    """Gluon kernels written for Hopper (cp.async, warpgroup MMA) can run: an sm_90 CUDA device (not the
    interpreter, not ROCm) and a Triton whose Gluon has those ops."""
    if interpreting() or is_rocm() or not torch.cuda.is_available():
        return False
    if torch.cuda.get_device_capability(device_index) != (9, 0):
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import async_copy, warpgroup_mma  # noqa: F401
    except ImportError:
        return False
    return True


def has_native_mx(device_index: int = 0) -> bool:
    """True where the matrix units take e8m0-scaled e2m1 operands natively (gfx950, i.e. MI355X)."""
    return not interpreting() and gcn_arch(device_index) == "gfx950"


def launch_options(*, waves_per_eu: int | None = None, matrix_instr_nonkdim: int | None = None) -> dict:
    """Keyword arguments for a kernel launch: AMD-only options are dropped on other platforms."""
    if not is_rocm():
        return {}
    opts = {}
    if waves_per_eu is not None:
        opts["waves_per_eu"] = waves_per_eu
    if matrix_instr_nonkdim is not None:
        opts["matrix_instr_nonkdim"] = matrix_instr_nonkdim
    return opts
