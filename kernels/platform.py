"""ROCm vs CUDA differences for zoe's Triton kernels, kept in one place.

Kernels ask this module for the fp8 flavour of the device, for extra launch options and for the target they
tune their launches to; nothing else in `zoe_kernels` branches on the vendor.
- target (`current_target`): multiprocessor/CU count, shared memory/LDS bytes a program may take, wave size and
  architecture, read from the live device, or from a named compile target inside `compile_for(TARGETS[...])`
  (ahead-of-time compiles for a GPU this machine does not have, `zoe_kernels.aot`). Without either, launchers tune
  for `REFERENCE_TARGET`, the H200 their constants were measured on (the CPU interpreter's tests).
- fp8: `float8_e4m3fn` on NVIDIA and gfx950 (MI355X); `float8_e4m3fnuz` on gfx942 (MI300X/MI325X).
- launch options: `waves_per_eu` and `matrix_instr_nonkdim` exist only on ROCm and raise on NVIDIA.
- inline PTX (`tl.inline_asm_elementwise`): only on NVIDIA GPUs (`has_ptx`); kernels keep a portable path.
- Gluon kernels written for Hopper (`has_gluon_hopper`): sm_90 only; the Triton kernel stays the portable path.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os

import torch


@dataclasses.dataclass(frozen=True)
class Target:
    """What launch tuning needs to know of a GPU: backend ("cuda" or "hip"), architecture name ("sm_90",
    "gfx950"), multiprocessors (CUDA) or compute units (ROCm), shared memory (LDS) one program may take in
    bytes, threads per warp/wavefront, the part's name, and its L2 cache in bytes (0: not known)."""

    backend: str
    arch: str
    cu_count: int
    lds_bytes: int
    warp_size: int
    name: str = ""
    l2_bytes: int = 0

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    def pipeline_tiles(self, num_stages: int) -> int:
        """Tiles of a `num_stages` software pipeline held in shared memory/LDS at once, as Triton 3.9 compiles:
        all of them on gfx950 (asynchronous global->LDS copies), one fewer on gfx942 (the next tile staged in
        registers) and on sm_90 (as the sm_90a compiles of bench/kernels/sparse_aot.py show)."""
        return max(1, num_stages if self.arch == "gfx950" else num_stages - 1)


# Named compile targets. AMD figures: ROCm "AMD GPU specifications" table (rocm.docs.amd.com/en/latest/reference/
# gpu-specs.html: compute units, wavefront size, LDS KiB per CU); MI355X's 256 CUs are also the seed's Table 1
# footnote (256 CUs x 2.4 GHz); their L2 is left unknown (nothing tuned for AMD reads it). H200: 132 SMs, 227 KiB of
# shared memory per block (opt-in), warps of 32 (CUDA programming guide, compute capability 9.0), 60 MiB of L2 (the
# L2_cache_size torch reports on the H200 these kernels were measured on: 62,914,560 bytes).
TARGETS: dict[str, Target] = {
    "gfx950": Target("hip", "gfx950", 256, 160 * 1024, 64, "AMD Instinct MI355X"),
    "gfx942": Target("hip", "gfx942", 304, 64 * 1024, 64, "AMD Instinct MI300X"),
    "sm_90": Target("cuda", "sm_90", 132, 227 * 1024, 32, "NVIDIA H200", 60 << 20),
}
# The target launchers tune for without a device or compile target: the H200 their constants were measured on.
REFERENCE_TARGET = TARGETS["sm_90"]

_COMPILE_TARGET: contextvars.ContextVar[Target | None] = contextvars.ContextVar("zoe_compile_target", default=None)


@contextlib.contextmanager
def compile_for(target: Target):
    """Inside the block every question this module answers is answered for `target` (not the live device nor the
    interpreter): launchers then choose the configurations they would choose on that GPU."""
    token = _COMPILE_TARGET.set(target)
    try:
        yield target
    finally:
        _COMPILE_TARGET.reset(token)


def compile_target() -> Target | None:
    """The named target of an enclosing `compile_for`, else None."""
    return _COMPILE_TARGET.get()


@functools.lru_cache(maxsize=None)
def device_target(device_index: int = 0) -> Target | None:
    """The live GPU's description (None without one)."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    hip = torch.version.hip is not None
    arch = props.gcnArchName.split(":")[0] if hip else f"sm_{props.major}{props.minor}"
    lds = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
    warp = getattr(props, "warp_size", 64 if hip else 32)
    l2 = getattr(props, "L2_cache_size", 0)
    return Target("hip" if hip else "cuda", arch, props.multi_processor_count, lds, warp, props.name, l2)


def current_target(device_index: int = 0) -> Target:
    """The target launches tune for: the compile target, else the live device, else `REFERENCE_TARGET`."""
    return compile_target() or (None if interpreting() else device_target(device_index)) or REFERENCE_TARGET


def is_rocm() -> bool:
    """True when the kernels are built for HIP (AMD GPUs): a ROCm torch, or a hip compile target."""
    target = compile_target()
    return target.is_hip if target is not None else torch.version.hip is not None


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1) and no compile target is set."""
    return compile_target() is None and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def gcn_arch(device_index: int = 0) -> str:
    """The AMD architecture name (e.g. 'gfx942'), or '' on other devices."""
    target = compile_target()
    if target is not None:
        return target.arch if target.is_hip else ""
    return _device_gcn_arch(device_index)


@functools.lru_cache(maxsize=None)
def _device_gcn_arch(device_index: int) -> str:
    if torch.version.hip is None or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_properties(device_index).gcnArchName.split(":")[0]


def fp8_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """The e4m3 fp8 flavour the device's (or the compile target's) matrix units take."""
    if compile_target() is not None:
        return torch.float8_e4m3fnuz if gcn_arch() == "gfx942" else torch.float8_e4m3fn
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
    target = compile_target()
    if target is not None:
        return target.backend == "cuda"
    return not interpreting() and not is_rocm() and torch.cuda.is_available()


try:  # programmatic dependent launch from Triton code (CUDA sm_90+); absent from some Triton builds
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - has_pdl is then False and no kernel traces these
    gdc_launch_dependents = gdc_wait = None


def has_pdl(device_index: int = 0) -> bool:
    """Programmatic dependent launch (`launch_pdl=True`, `gdc_wait` / `gdc_launch_dependents` in the kernel):
    CUDA (not ROCm, not the interpreter) at compute capability >= 9, with a Triton that has it."""
    target = compile_target()
    if target is not None:
        return gdc_wait is not None and target.backend == "cuda" and int(target.arch[3:]) >= 90
    return _device_has_pdl(device_index)


@functools.lru_cache(maxsize=None)
def _device_has_pdl(device_index: int) -> bool:
    return (gdc_wait is not None and not interpreting() and not is_rocm() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


def sm_count(device_index: int = 0) -> int:
    """Streaming multiprocessors (CUDA) or compute units (ROCm) of the target (`current_target`)."""
    return current_target(device_index).cu_count


def has_gluon_hopper(device_index: int = 0) -> bool:
    """Gluon kernels written for Hopper (cp.async, warpgroup MMA) can run: an sm_90 CUDA device (not the
    interpreter, not ROCm, not an AMD compile target) and a Triton whose Gluon has those ops."""
    if compile_target() is not None:
        return False  # compiled ahead of time by their own scripts (bench/kernels/sparse_aot.py), not by aot.py
    return _device_has_gluon_hopper(device_index)


@functools.lru_cache(maxsize=None)
def _device_has_gluon_hopper(device_index: int) -> bool:
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


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input_precision for operands of `dtype`: "ieee" (exact) for float32; for 16-bit operands, where
    the choice changes nothing, "tf32" on CUDA and "ieee" on ROCm (gfx950 has no xf32 matrix instructions and
    Triton rejects "tf32" there)."""
    return "ieee" if dtype == torch.float32 or is_rocm() else "tf32"


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
