"""Compile every zoe Triton kernel for AMD GPUs on a machine without one: `python -m zoe_kernels.aot`.

For each compile target (`platform.TARGETS`: gfx950 = MI355X, gfx942 = MI300X/MI325X) the real entry points
(`fused_moe`, `lightning_indexer`, `indexer_topk`, `topk`, `dual_scope_decode`, `paged_dual_scope_decode`) run at
the recipe shapes (`aot_cases.py`) on fake tensors inside `platform.compile_for(target)`, with Triton's launch
replaced by a recorder: every launch a dispatcher and launcher choose on that target is captured with its real
arguments. Each distinct launch is then bound by Triton's own binder for the HIP backend (the specialisation the
JIT makes at that launch: constexprs, 16-divisible integers, aligned pointers, 32-bit pointer ranges) and
compiled with `triton.compile(ASTSource(...), target=GPUTarget("hip", arch, 64))`.

One row per (kernel, configuration, arch): ok / error, the registers (`vgprs`, `agprs`, `sgprs`), scratch
(`spill_bytes`: private segment bytes per lane, with the VGPR/SGPR spill counts), `lds_bytes`, `waves_per_simd`
(`occupancy`), the `v_mfma*` instructions used, and the element types of the source's dot operands
(`dot_operands`: what must lower to the f8f6f4 MFMAs on gfx950). The Gluon kernels (`*_gluon.py`) are written
for Hopper (sm_90) and get not-applicable rows.

Usage: python -m zoe_kernels.aot [--arch gfx950,gfx942] [--json] [--out FILE] [--only SUBSTRING] [--jobs 2]
                                 [--merge REPORT]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import multiprocessing
import os
import re
import sys
import time
import warnings
from typing import Callable, Iterator

from typing import TYPE_CHECKING

import torch

from zoe_kernels.aot_merge import merge_rows

if TYPE_CHECKING:
    from zoe_kernels import platform
    from triton.backends.compiler import GPUTarget
    from triton.runtime import jit as triton_jit

COMPILE_ENV = {"TRITON_INTERPRET": None, "TRITON_DEFAULT_FP_FUSION": "1"}
"""What an AOT run sets in the environment while it runs (None: unset): compiled, not interpreted (Triton reads
TRITON_INTERPRET when `@triton.jit` decorates, i.e. when Triton's own language modules and each kernel module are
first imported, and when it binds a launch), and fp fusion on (Triton 3.9's default, said explicitly so it does
not warn). This module imports Triton (and `zoe_kernels.platform`, which imports it) only inside the compile path,
so importing it changes nothing."""


@contextlib.contextmanager
def compile_environment() -> Iterator[None]:
    """`COMPILE_ENV` in `os.environ` for the duration of the block (and the compile processes forked in it), the
    caller's values put back afterwards. Nests. Triton and the kernel modules first imported inside the block keep
    their compiled JIT functions after it (Python caches modules); ones imported interpreted before it cannot be
    compiled (`collect` says so)."""
    saved = {name: os.environ.get(name) for name in COMPILE_ENV}
    try:
        for name, value in COMPILE_ENV.items():
            if value is None:
                os.environ.pop(name, None)
            elif saved[name] is None:  # an explicit setting of the caller wins
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


GLUON_MODULES = ("zoe_kernels.csa.dual_scope_fused_gluon", "zoe_kernels.csa.dual_scope_fused_ws_gluon",
                 "zoe_kernels.csa.dual_scope_two_pass_gluon")
NOT_APPLICABLE = "not applicable: a Gluon kernel written for Hopper (sm_90 cp.async and warpgroup MMA) by design"


# -- capture -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Launch:
    """One recorded kernel launch: the JIT function, its arguments as the launcher passed them, and the case
    (entry point at a shape) that made it."""

    fn: triton_jit.JITFunction
    args: tuple
    kwargs: dict
    case: str
    phase: str


class _PointerArg:
    """A tensor argument as the binder sees it: dtype, an aligned address (torch allocations are 256-byte
    aligned) and the byte range, which decides 32-bit buffer addressing on AMD."""

    def __init__(self, t: torch.Tensor):
        self.dtype = t.dtype
        self._bytes = t.untyped_storage().nbytes()

    @staticmethod
    def data_ptr() -> int:
        return 0

    def ptr_range(self) -> int:
        return self._bytes


@contextlib.contextmanager
def recording(launches: list, case: str, phase: str) -> Iterator[None]:
    """Within the block `kernel[grid](...)` records a `Launch` instead of launching."""
    from triton.runtime import jit as triton_jit

    original = triton_jit.JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        del grid, warmup
        launches.append(Launch(self, args, kwargs, case, phase))
        return None

    triton_jit.JITFunction.run = record
    try:
        yield
    finally:
        triton_jit.JITFunction.run = original


def _basic_index(t: torch.Tensor, index) -> torch.Tensor:
    """`t[index]` for basic indexing (ints, slices, None, Ellipsis) through aten's view ops. A FakeTensor on a CUDA
    device runs those without CUDA, while `Tensor.__getitem__`'s C++ path takes a CUDA device guard first (and fails
    where PyTorch has no CUDA)."""
    index = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in index):
        at = index.index(Ellipsis)
        real = sum(i is not None and i is not Ellipsis for i in index)
        index = index[:at] + (slice(None),) * (t.dim() - real) + index[at + 1:]
    out, dim = t, 0
    for i in index:
        if i is None:
            out = out.unsqueeze(dim)
            dim += 1
        elif isinstance(i, slice):
            out = torch.ops.aten.slice.Tensor(out, dim, i.start, i.stop, 1 if i.step is None else i.step)
            dim += 1
        elif isinstance(i, int) and not isinstance(i, bool):
            out = torch.ops.aten.select.int(out, dim, i)
        else:
            raise TypeError(f"a fake tensor takes basic indexing only (ints, slices, None, ...), got {i!r}")
    return out


@contextlib.contextmanager
def _fake_basic_indexing() -> Iterator[None]:
    """Within the block FakeTensors index through `_basic_index` (the launchers slice workspaces and weights)."""
    from torch._subclasses.fake_tensor import FakeTensor

    FakeTensor.__getitem__ = _basic_index
    try:
        yield
    finally:
        del FakeTensor.__getitem__


def capture(target: platform.Target, case: str, phase: str, call: Callable[[], object]) -> list[Launch]:
    """The launches `call` makes on `target`: it runs on fake CUDA tensors (no memory, no device) with the
    platform answering for the target."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from zoe_kernels import platform

    launches: list[Launch] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FakeTensor.data_ptr(): 0, which only alignment checks read
        with platform.compile_for(target), FakeTensorMode(allow_non_fake_inputs=True), _fake_basic_indexing(), \
                recording(launches, case, phase):
            call()
    return launches


# -- specialise and compile --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Spec:
    """A launch bound as the JIT binds it for one target: what `triton.compile` takes, picklable."""

    module: str
    name: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    arch: str

    def key(self) -> tuple:
        return (self.module, self.name, repr(sorted(self.signature.items())), repr(sorted(self.constexprs.items())),
                repr(sorted(self.attrs.items())), self.options.get("num_warps"), self.options.get("num_stages"),
                self.options.get("waves_per_eu"), self.options.get("matrix_instr_nonkdim"), self.arch)

    def config(self) -> str:
        """The launch configuration in words: the constexprs (by name) and the launch options."""
        names = list(self.signature)
        parts = [f"{names[path[0]]}={_short(value)}" for path, value in sorted(self.constexprs.items())]
        opts = self.options
        parts += [f"num_warps={opts['num_warps']}", f"num_stages={opts['num_stages']}"]
        parts += [f"{k}={opts[k]}" for k in ("waves_per_eu", "matrix_instr_nonkdim") if opts.get(k)]
        return " ".join(parts)


def _short(value) -> str:
    return str(value).replace("triton.language.", "").replace(" ", "")


def triton_target(arch: str) -> GPUTarget:
    """Triton's compile target of a named target (`platform.TARGETS`): GPUTarget("hip", "gfx950", 64) (wave64 on
    CDNA), GPUTarget("cuda", 90, 32)."""
    from triton.backends.compiler import GPUTarget

    from zoe_kernels import platform

    target = platform.TARGETS[arch]
    if target.is_hip:
        return GPUTarget("hip", arch, target.warp_size)
    return GPUTarget("cuda", int(arch.removeprefix("sm_")), target.warp_size)


def specialise(launch: Launch, arch: str) -> Spec:
    """The specialisation Triton's JIT makes for this launch on `arch` (a `platform.TARGETS` name): its own binder
    and argument packer for that backend, fed the recorded arguments."""
    from triton.compiler import make_backend
    from triton.runtime import jit as triton_jit

    fn = launch.fn
    backend = make_backend(triton_target(arch))
    kwargs = dict(launch.kwargs)
    kwargs.setdefault("debug", False)
    args = tuple(_PointerArg(a) if isinstance(a, torch.Tensor) else a for a in launch.args)
    kwargs = {k: _PointerArg(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    binder = triton_jit.create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return Spec(fn.fn.__module__, fn.fn.__name__, signature, constexprs, attrs, dict(options.__dict__), arch)


_META = {"vgprs": "vgpr_count", "agprs": "agpr_count", "sgprs": "sgpr_count",
         "spill_bytes": "private_segment_fixed_size", "vgpr_spills": "vgpr_spill_count",
         "sgpr_spills": "sgpr_spill_count"}


def amdgcn_resources(amdgcn: str) -> dict:
    """Registers and scratch from the code object's metadata (the `.amdhsa` notes at the end of the amdgcn
    listing), the v_mfma instructions of the code, and LLVM's own occupancy estimate (which does not see the
    dynamic LDS Triton allocates)."""
    row = {}
    for field, key in _META.items():
        found = re.findall(rf"\.{key}:\s+(\d+)", amdgcn)
        row[field] = int(found[-1]) if found else None
    # the metadata's .vgpr_count is the unified total on gfx90a+ (architectural VGPRs, then AGPRs): take the split
    # from the assembler's comments
    for field, key in (("vgprs", "NumVgprs"), ("agprs", "NumAgprs"), ("total_vgprs", "TotalNumVgprs")):
        found = re.findall(rf"; {key}: (\d+)", amdgcn)
        if found:
            row[field] = int(found[-1])
    row.setdefault("total_vgprs", (row["vgprs"] or 0) + (row["agprs"] or 0))
    row["mfma"] = sorted(set(re.findall(r"\b(v_mfma\w*)", amdgcn)))
    llvm = re.findall(r"; Occupancy: (\d+)", amdgcn)
    row["llvm_occupancy"] = int(llvm[-1]) if llvm else None
    return row


def dot_operand_types(ttgir: str) -> list[str]:
    """Element types of the matrix operands of the kernel's `tt.dot` / `tt.dot_scaled` ops (e.g. 'f8E4M3FN',
    'bf16'; packed e2m1 shows as 'i8' in a dot_scaled)."""
    types = set()
    for line in ttgir.splitlines():
        if "tt.dot" not in line:
            continue
        if "tt.dot_scaled" in line:
            fmts = re.findall(r"(?:lhs|rhs)\s*=\s*(\w+)", line)
            types.update(fmts)
            continue
        m = re.search(r":\s*tensor<[\dx]+x(\w+)[,>].*?\*\s*tensor<[\dx]+x(\w+)[,>]", line)
        if m:
            types.update(m.groups())
    return sorted(types)


# Register file and wave limits of CDNA3/CDNA4 (gfx942, gfx950): 4 SIMDs per CU, at most 8 waves per SIMD
# (LLVM's llvm-calc-occupancy for gfx90a-class targets: "Max waves/EU: 8", "EUs (SIMDs) per CU: 4"), 512 VGPRs per
# lane per SIMD shared by the architectural VGPRs and the AGPRs (the "unified" register file: 512 KiB per CU in
# ROCm's GPU-specs table), allocated in blocks of 8, the AGPRs starting at a 4-aligned offset (LLVM AMDGPUUsage,
# "compute_pgm_rsrc3.accum_offset"); SGPR occupancy per LLVM's GCNSubtarget::getOccupancyWithNumSGPRs for GFX9.
SIMDS_PER_CU = 4
MAX_WAVES_PER_SIMD = 8
VGPRS_PER_SIMD_LANE = 512
VGPR_GRANULE = 8


def occupancy(total_vgprs: int, sgprs: int, lds_bytes: int, num_warps: int, lds_per_cu: int) -> float:
    """Waves per SIMD a CU holds of this kernel: the fewest that registers, SGPRs and LDS allow.

    registers: waves_reg = min(8, 512 // ceil8(total)), total = ceil4(arch VGPRs) + AGPRs (the assembler's
    TotalNumVgprs);
    SGPRs (GFX9): <= 80: 10, <= 88: 9, <= 100: 8, else 7 (capped at 8 here);
    workgroups per CU = min(4 * min(waves_reg, waves_sgpr) // num_warps, lds_per_cu // lds_bytes);
    waves per SIMD = workgroups * num_warps / 4 (a workgroup's waves are spread over the CU's 4 SIMDs).
    0 means one workgroup does not fit."""
    total = total_vgprs
    waves_reg = min(MAX_WAVES_PER_SIMD, VGPRS_PER_SIMD_LANE // max(VGPR_GRANULE, -(-total // VGPR_GRANULE) * VGPR_GRANULE))
    waves_sgpr = 10 if sgprs <= 80 else 9 if sgprs <= 88 else 8 if sgprs <= 100 else 7
    per_simd = min(waves_reg, waves_sgpr, MAX_WAVES_PER_SIMD)
    groups = SIMDS_PER_CU * per_simd // num_warps
    if lds_bytes:
        groups = min(groups, lds_per_cu // lds_bytes)
    return round(float(min(per_simd, groups * num_warps / SIMDS_PER_CU)), 2)


@compile_environment()
def compile_spec(spec: Spec) -> dict:
    """Compile one specialisation for its arch and read back its resources; errors become the row's `error`."""
    import triton
    from triton.compiler import ASTSource

    from zoe_kernels import platform

    row = {"kernel": f"{spec.module.removeprefix('zoe_kernels.')}.{spec.name}", "config": spec.config(),
           "arch": spec.arch, "ok": False, "error": None, "num_warps": spec.options["num_warps"],
           "num_stages": spec.options["num_stages"]}
    t0 = time.time()
    try:
        fn = getattr(importlib.import_module(spec.module), spec.name)
        kernel = triton.compile(ASTSource(fn, spec.signature, spec.constexprs, spec.attrs),
                                target=triton_target(spec.arch), options=spec.options)
        res = amdgcn_resources(kernel.asm["amdgcn"])
        lds = int(kernel.metadata.shared)
        target = platform.TARGETS[spec.arch]
        row.update(res, lds_bytes=lds, dot_operands=dot_operand_types(kernel.asm["ttgir"]))
        row["waves_per_simd"] = occupancy(res["total_vgprs"], res["sgprs"] or 0, lds,
                                          spec.options["num_warps"], target.lds_bytes)
        row["ok"] = lds <= target.lds_bytes
        if not row["ok"]:
            row["error"] = f"LDS {lds} bytes > the {target.lds_bytes} one workgroup may take on {spec.arch}"
    except Exception as exc:  # a compile failure is a result: reported, and the CI test fails on it
        root = exc
        while root.__cause__ is not None:  # Triton wraps the real failure in CompilationErrors
            root = root.__cause__
        text = str(root).strip()
        row["error"] = f"{type(root).__name__}: {text.splitlines()[-1] if text else ''}"[:500]
    row["compile_s"] = round(time.time() - t0, 2)
    return row


def gluon_rows(arch: str) -> list[dict]:
    """Not-applicable rows for the Hopper-only Gluon kernels."""
    rows = []
    for module in GLUON_MODULES:
        try:
            mod = importlib.import_module(module)
        except ImportError:  # a Triton without Gluon: the module cannot even load
            continue
        for name, obj in sorted(vars(mod).items()):
            if type(obj).__name__ == "GluonJITFunction" and name.endswith("kernel"):
                rows.append({"kernel": f"{module.removeprefix('zoe_kernels.')}.{name}", "config": "", "arch": arch,
                             "ok": None, "error": NOT_APPLICABLE})
    return rows


# -- the whole run -----------------------------------------------------------------------------------------------
@compile_environment()
def collect(archs: list[str], only: str = "", cases=None, ci: bool = False) -> tuple[list[Spec], dict]:
    """The distinct specialisations of every case on every arch, and per specialisation the cases that chose it
    (with their phase: "decode" or "prefill")."""
    from triton.language import standard
    from triton.runtime import jit as triton_jit

    from zoe_kernels import platform

    def compiled(module: str, name: str) -> None:
        if not isinstance(getattr(importlib.import_module(module), name), triton_jit.JITFunction):
            raise RuntimeError(f"{module} was imported under TRITON_INTERPRET=1 in this process (interpreted "
                               "functions cannot be compiled): run `python -m zoe_kernels.aot`, or this call, in a "
                               "process that has not imported Triton or the kernels interpreted")

    compiled(standard.__name__, "cdiv")  # Triton's own language functions, then zoe's kernels
    compiled("zoe_kernels.moe.align", "_moe_align_kernel")
    from zoe_kernels.aot_cases import all_cases

    specs: dict[tuple, Spec] = {}
    used: dict[tuple, list] = {}
    for arch in archs:
        target = platform.TARGETS[arch]
        for case in cases if cases is not None else all_cases(target, ci=ci):
            if only and only not in case.name:
                continue
            for launch in capture(target, case.name, case.phase, case.call):
                spec = specialise(launch, arch)
                key = spec.key()
                specs.setdefault(key, spec)
                used.setdefault(key, []).append((case.name, case.phase))
    return list(specs.values()), {k: v for k, v in used.items()}


def _compile_in_child(spec: Spec, conn, log_path: str) -> None:
    """Child process body: the compiler's own stderr (MLIR reproducers, assertion messages) goes to a file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    conn.send(compile_spec(spec))
    conn.close()


@compile_environment()
def compile_all(specs: list[Spec], jobs: int = 2, on_row: Callable[[Spec, dict], None] | None = None) -> list[dict]:
    """Compile `specs`, at most `jobs` (<= 2) at a time, each in a forked process of its own, so that a compiler
    that aborts (an LLVM/MLIR assertion) costs that row only: it is reported with the compiler's last words."""
    import tempfile

    ctx = multiprocessing.get_context("fork")
    pending, running, rows = list(enumerate(specs)), {}, [None] * len(specs)
    with tempfile.TemporaryDirectory() as tmp:
        while pending or running:
            while pending and len(running) < max(1, min(2, jobs)):
                i, spec = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                log = os.path.join(tmp, f"{i}.log")
                proc = ctx.Process(target=_compile_in_child, args=(spec, send, log))
                proc.start()
                send.close()
                running[i] = (proc, recv, log)
            for i, (proc, recv, log) in list(running.items()):
                row = None
                if recv.poll(0.05):
                    try:
                        row = recv.recv()
                    except EOFError:  # the child died before sending
                        pass
                elif proc.is_alive():
                    continue
                proc.join()
                if row is None:
                    spec = specs[i]
                    with open(log, errors="replace") as f:
                        tail = [line.strip() for line in f if line.strip()][-3:]
                    row = {"kernel": f"{spec.module.removeprefix('zoe_kernels.')}.{spec.name}",
                           "config": spec.config(), "arch": spec.arch, "ok": False,
                           "error": f"compiler exited with {proc.exitcode}: " + " | ".join(tail)[-500:],
                           "num_warps": spec.options["num_warps"], "num_stages": spec.options["num_stages"]}
                elif not row["ok"]:
                    with open(log, errors="replace") as f:
                        first = next((line.strip() for line in f if "Assertion" in line or "error:" in line), "")
                    if first:
                        row["error"] = (row["error"] + " | " + first)[:800]
                rows[i] = row
                del running[i]
                if on_row:
                    on_row(specs[i], row)
    return rows


@compile_environment()
def run(archs: list[str], *, only: str = "", jobs: int = 2, cases=None, ci: bool = False,
        progress=None) -> list[dict]:
    """Compile everything for `archs` (at most 2 compiles at a time) and return the rows, the Gluon kernels'
    not-applicable rows included."""
    specs, used = collect(archs, only, cases, ci)
    if progress:
        progress.start(len(specs))

    def annotate(spec: Spec, row: dict) -> None:
        cases_of = used[spec.key()]
        row["cases"] = sorted({name for name, _ in cases_of})
        row["decode"] = any(phase == "decode" for _, phase in cases_of)
        if progress:
            progress.advance(row)

    rows = compile_all(specs, jobs, annotate)
    for arch in archs:
        rows += gluon_rows(arch)
    rows.sort(key=lambda r: (r["arch"], r["kernel"], r["config"]))
    return rows


class _RichProgress:
    """A progress bar on stderr (rich), one step per compiled specialisation."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from rich.console import Console

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=Console(stderr=True))
        self._task = None
        self._failed = 0

    def start(self, total: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("compiling", total=total)

    def advance(self, row: dict) -> None:
        self._failed += not row["ok"]
        self._progress.update(self._task, advance=1,
                              description=f"{row['arch']} {row['kernel'].split('.')[-1]} ({self._failed} failed)")

    def stop(self) -> None:
        self._progress.stop()


@compile_environment()
def main(argv: list[str] | None = None) -> int:
    from zoe_kernels import platform

    ap = argparse.ArgumentParser(prog="python -m zoe_kernels.aot", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="gfx950,gfx942", help="comma-separated AMD targets (platform.TARGETS)")
    ap.add_argument("--json", action="store_true", help="print one JSON row per line on stdout (no progress bar)")
    ap.add_argument("--out", default="", help="also write {meta, rows} as JSON to this file")
    ap.add_argument("--only", default="", help="only the cases whose name contains this (e.g. 'moe', 'topk')")
    ap.add_argument("--jobs", type=int, default=2, help="compile processes (at most 2)")
    ap.add_argument("--ci", action="store_true", help="the representative cases only (aot_cases.CI_CASES)")
    ap.add_argument("--merge", default="", help="a report (--out JSON) whose rows of the --only cases this run "
                    "replaces; the merged report goes to --out")
    args = ap.parse_args(argv)
    if args.merge and not (args.only and args.out):
        ap.error("--merge takes --only (the cases compiled again) and --out (where the merged report goes)")
    archs = [a for a in args.arch.split(",") if a]
    unknown = [a for a in archs if a not in platform.TARGETS or not platform.TARGETS[a].is_hip]
    if unknown:
        ap.error(f"--arch: unknown AMD target(s) {unknown}; known: "
                 f"{[k for k, t in platform.TARGETS.items() if t.is_hip]}")
    progress = None if args.json else _RichProgress()
    t0 = time.time()
    try:
        rows = run(archs, only=args.only, jobs=args.jobs, ci=args.ci, progress=progress)
    finally:
        if progress:
            progress.stop()
    wall_s = round(time.time() - t0, 1)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        _print_summary(rows, wall_s)
    if args.out:
        import triton

        meta = {"triton": triton.__version__, "archs": archs, "wall_s": wall_s, "jobs": min(2, args.jobs),
                "command": "python -m zoe_kernels.aot " + " ".join(sys.argv[1:] if argv is None else argv)}
        if args.merge:
            with open(args.merge) as f:
                report = json.load(f)
            rows = merge_rows(report["rows"], rows, args.only, archs)
            meta = {**{k: v for k, v in report["meta"].items() if k != "merged"},
                    "merged": report["meta"].get("merged", []) + [meta]}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
            f.write("\n")
    return 0 if all(r["ok"] is not False for r in rows) else 1


def _print_summary(rows: list[dict], wall_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"AOT compile ({wall_s} s)")
    for col in ("arch", "kernel", "config", "ok", "vgprs", "agprs", "spill", "lds", "waves", "mfma"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["arch"], r["kernel"], r["config"][:60], str(r["ok"]), str(r.get("vgprs", "")),
                      str(r.get("agprs", "")), str(r.get("spill_bytes", "")), str(r.get("lds_bytes", "")),
                      str(r.get("waves_per_simd", "")), ",".join(r.get("mfma", [])) or (r["error"] or "")[:60])
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
