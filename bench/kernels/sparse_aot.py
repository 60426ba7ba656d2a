"""Compile zoe's sparse-attention kernels for sm_90 (H100/H200) on a machine without a GPU.

The launches are the ones the launchers choose on an H200 (captured and bound as the JIT binds them by
`zoe_kernels.aot`, which compiles the same calls for AMD targets); the one-pass Gluon kernel's are written out.
Reports, per kernel specialisation, the Triton compile time and what `ptxas -v` says (registers, spill
bytes), using the ptxas that ships in Triton's wheel. No device time needed: use it to catch compile
blow-ups (large `tl.sort` networks) and register spills before a GPU run. Numbers depend on the local
Triton/ptxas versions, which may differ from the GPU machine's.

Usage: python bench/kernels/sparse_aot.py [--out bench/kernels/results/sparse_aot.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def _nvdisasm() -> str | None:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    return str(tool) if tool.exists() else None


_SASS_LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P[0-9T]\s+)?([A-Z0-9_]+)")


def _sass_text(cubin: bytes) -> str | None:
    tool = _nvdisasm()
    if not tool:
        return None
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(cubin)
    text = subprocess.run([tool, "-c", f.name], capture_output=True, text=True).stdout  # code sections only
    os.unlink(f.name)
    return text


def _sass_instructions(cubin: bytes) -> int | None:
    """Static SASS instruction count of the kernel (for loop-free kernels, the instructions each thread issues)."""
    text = _sass_text(cubin)
    return None if text is None else sum(1 for line in text.splitlines() if _SASS_LINE.search(line))


def sass_loop_counts(cubin: bytes) -> dict | None:
    """The hot loop's static SASS: the shortest span from a label back to a branch to it that holds the warpgroup
    MMAs (the longest span, where there are none): its instructions, a tile's instructions a thread issues when the
    loop body has no branches, with its most common opcodes; the instructions before it (prologue); and in a
    warp-specialized kernel the copy loop's (the shortest span with the cp.async copies and no MMA)."""
    text = _sass_text(cubin)
    if text is None:
        return None
    lines = text.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\.(L_x_\d+):", line.strip()))}
    spans = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA `\(\.(L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    if not spans:
        return None

    def ops(span):
        return [m.group(2) for line in lines[span[0]:span[1] + 1] if (m := _SASS_LINE.search(line))]

    mma = [sp for sp in spans if any("GMMA" in op for op in ops(sp))]
    start, end = min(mma, key=lambda sp: sp[1] - sp[0]) if mma else max(spans, key=lambda sp: sp[1] - sp[0])
    loop = ops((start, end))
    counts: dict[str, int] = {}
    for op in loop:
        counts[op] = counts.get(op, 0) + 1
    row = {"loop_sass_instructions": len(loop),
           "loop_opcodes": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:10]),
           "prologue_sass_instructions": sum(1 for line in lines[:start] if _SASS_LINE.search(line))}
    copies = [sp for sp in spans if "LDGSTS" in ops(sp) and not any("GMMA" in op for op in ops(sp))]
    if mma and copies:
        row["copy_loop_sass_instructions"] = len(ops(min(copies, key=lambda sp: sp[1] - sp[0])))
    return row


def _ptxas() -> str | None:
    bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas-blackwell", "ptxas"):  # the newer one reads Triton 3.9's PTX version
        if (bindir / name).exists():
            return str(bindir / name)
    return None


def _signature(fn, pointers: dict[str, str], constexprs: dict, floats: tuple[str, ...] = ()) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        elif name in floats:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def _aligned(fn, signature: dict[str, str]) -> dict:
    """The 16-divisibility the JIT would infer at a real launch: pointers from torch's allocator, and the
    integer arguments named stride_* (row strides of power-of-two widths)."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
            if signature[name].startswith("*") or (name.startswith("stride") and signature[name] == "i32")}


def compile_one(label: str, fn, pointers: dict[str, str], constexprs: dict, num_warps: int,
                floats: tuple[str, ...] = (), num_stages: int = 2, source=ASTSource, loop: bool = False) -> dict:
    """One hand-specified specialisation compiled for sm_90a (source: ASTSource, or Gluon's GluonASTSource for Gluon
    kernels)."""
    sig = _signature(fn, pointers, constexprs, floats)
    return compile_bound(label, fn, sig, constexprs, _aligned(fn, sig), {"num_warps": num_warps, "num_stages": num_stages},
                         source=source, loop=loop)


def compile_bound(label: str, fn, signature: dict, constexprs: dict, attrs: dict, options: dict, source=ASTSource,
                  loop: bool = False) -> dict:
    """A specialisation (signature, constexprs, attributes, options) compiled for sm_90a: shared memory, SASS counts
    and what ptxas -v says (registers, spill bytes)."""
    t0 = time.time()
    kernel = triton.compile(source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), target=TARGET,
                            options=options)
    names = list(signature)
    row = {"kernel": label, "num_warps": options["num_warps"], "num_stages": options.get("num_stages"),
           "compile_s": round(time.time() - t0, 1), "shared_bytes": kernel.metadata.shared,
           "sass_instructions": _sass_instructions(kernel.asm["cubin"]),
           "constexprs": {(names[k[0]] if isinstance(k, tuple) else k): str(v) for k, v in constexprs.items()}}
    if loop:
        row.update(sass_loop_counts(kernel.asm["cubin"]) or {})
    ptxas = _ptxas()
    if ptxas:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(kernel.asm["ptx"])
        info = subprocess.run([ptxas, "-v", "-arch=sm_90a", f.name, "-o", os.devnull], capture_output=True,
                              text=True).stderr
        os.unlink(f.name)
        regs = re.findall(r"Used (\d+) registers", info)
        spills = re.findall(r"(\d+) bytes spill stores", info)
        spill_loads = re.findall(r"(\d+) bytes spill loads", info)
        row.update(registers=int(regs[-1]) if regs else None, spill_store_bytes=int(spills[-1]) if spills else None,
                   spill_load_bytes=int(spill_loads[-1]) if spill_loads else None)
    print(json.dumps(row), flush=True)
    return row


# The calls compiled (the launches their launchers choose on an H200, captured by zoe_kernels.aot): CSA top-512 and
# the indexer's top-2048 at decode batches, the indexer's logits at decode and prefill, dual-scope decode by batch
TOPK_CALLS = [(b, n, k) for k in (512, 2048) for b, n in ((1, 1 << 20), (8, 262144), (32, 1 << 20), (64, 65536))]
INDEXER_CALLS = [(1, 65536), (32, 65536), (8192, 8192)]
DECODE_BATCHES = (1, 8, 32, 64, 128)


def captured_rows(only: set[str]) -> list[dict]:
    """The chosen launches of TOPK_CALLS, INDEXER_CALLS and DECODE_BATCHES on sm_90, each distinct one compiled."""
    from zoe_kernels import aot, aot_cases, platform

    calls = []
    if "topk" in only:
        calls += [(f"topk B={b} N={n} k={k}", aot_cases.topk_call(b, n, k)) for b, n, k in TOPK_CALLS]
    if "indexer" in only:
        calls += [(f"indexer H=64 M={m} N={n}", aot_cases.indexer_call(m, n, 64, 128, 2048)) for m, n in INDEXER_CALLS]
    if "decode" in only:
        calls += [(f"dual_scope B={b} H=64", aot_cases.dual_scope_call(b, 64, 128, 512, 4096)) for b in DECODE_BATCHES]
    specs = {}
    for name, call in calls:
        for launch in aot.capture(platform.TARGETS["sm_90"], name, "decode", call):
            spec = aot.specialise(launch, "sm_90")
            specs.setdefault(spec.key(), (name, spec, launch.fn))
    return [compile_bound(f"{spec.name} ({name}): {spec.config()}", fn, spec.signature, spec.constexprs, spec.attrs,
                          spec.options) for name, spec, fn in specs.values()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_aot.json"))
    ap.add_argument("--only", default="topk,indexer,decode", help="comma-separated ops to compile (also: fused, the "
                    "one-pass Gluon decode kernels, with a Triton that has Gluon)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    only = set(args.only.split(","))
    rows = captured_rows(only)
    if "fused" in only:  # the one-pass Gluon decode kernels (FUSED_GLUON) at the tiles, rings and value blocks tried
        from triton.experimental.gluon._runtime import GluonASTSource

        fused = importlib.import_module("zoe_kernels.csa.dual_scope_fused_gluon")
        ws = importlib.import_module("zoe_kernels.csa.dual_scope_fused_ws_gluon")
        dsd = importlib.import_module("zoe_kernels.csa.dual_scope_decode")
        fptrs = {"q8_ptr": "*fp8e4nv", "qs_ptr": "*fp32", "win_k_ptr": "*fp8e4nv",
                 "win_v_ptr": "*bf16", "win_len_ptr": "*i32", "comp_k_ptr": "*fp8e4nv", "comp_v_ptr": "*bf16",
                 "comp_idx_ptr": "*i32", "win_ks_ptr": "*fp32", "comp_ks_ptr": "*fp32", "sink_ptr": "*fp32",
                 "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
        # one compute warpgroup and loader warps (dual_scope_fused_ws_gluon), (DV, tile entries, key slots, staged
        # rows, final) at W=128, k=512: the default below B=67 (2 key slots), its split form, 3 key slots, 32-entry
        # tiles, 128-column value blocks
        for dv, bkv, slots, sel_rows, final in ((256, 64, 2, 8, True), (256, 64, 2, 8, False), (256, 64, 3, 8, True),
                                                (256, 32, 3, 16, True), (128, 64, 2, 8, True)):
            rows.append(compile_one(f"dual_scope_fused_ws D=512 DV={dv} BKV={bkv} key_slots={slots} final={final}",
                                    ws.fused_ws_kernel, fptrs,
                                    dict(D=512, DV=dv, BKV=bkv, TILES_PER_SPLIT=640 // bkv, KBUF=slots,
                                         SEL_P2=sel_rows, LOAD_WARPS=dsd._LOADER_WARPS, LOAD_REGS=dsd._LOADER_REGS,
                                         FINAL=final, HAS_SINK=True, num_warps=4), 4,
                                    source=GluonASTSource, loop=True))
        # two warpgroups over all 512 value columns (dual_scope_fused_gluon, the default from B=67: 8 warps), its
        # two-split form and 2 key slots
        for slots, final in ((3, True), (3, False), (2, True)):
            rows.append(compile_one(f"dual_scope_fused D=512 DV=512 BKV=32 key_slots={slots} final={final}",
                                    fused.fused_kernel, fptrs,
                                    dict(D=512, DV=512, BKV=32, TILES_PER_SPLIT=20, KBUF=slots, SEL_P2=16,
                                         FINAL=final, HAS_SINK=True, num_warps=8), 8,
                                    source=GluonASTSource, loop=True))
    meta = {"triton": triton.__version__, "ptxas": _ptxas(), "target": "sm_90a",
            "command": "python bench/kernels/sparse_aot.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
