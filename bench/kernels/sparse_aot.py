"""Compile zoe's sparse-attention kernels for sm_90 (H100/H200) on a machine without a GPU.

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
    """The hot loop's static SASS (the longest span from a label back to a branch to it): its instructions, a tile's
    instructions a thread issues when the loop body has no branches, with its most common opcodes; and the
    instructions before the loop (prologue)."""
    text = _sass_text(cubin)
    if text is None:
        return None
    lines = text.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"^\.(L_x_\d+):", line.strip()))}
    spans = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA `\(\.(L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    if not spans:
        return None
    start, end = max(spans, key=lambda span: span[1] - span[0])
    ops = [m.group(2) for line in lines[start:end + 1] if (m := _SASS_LINE.search(line))]
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return {"loop_sass_instructions": len(ops),
            "loop_opcodes": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:10]),
            "prologue_sass_instructions": sum(1 for line in lines[:start] if _SASS_LINE.search(line))}


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
    """One specialisation compiled for sm_90a (source: ASTSource, or Gluon's GluonASTSource for Gluon kernels)."""
    t0 = time.time()
    sig = _signature(fn, pointers, constexprs, floats)
    kernel = triton.compile(source(fn=fn, signature=sig, constexprs=constexprs, attrs=_aligned(fn, sig)),
                            target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    row = {"kernel": label, "num_warps": num_warps, "num_stages": num_stages, "compile_s": round(time.time() - t0, 1),
           "shared_bytes": kernel.metadata.shared, "sass_instructions": _sass_instructions(kernel.asm["cubin"]),
           "constexprs": {k: str(v) for k, v in constexprs.items()}}
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_aot.json"))
    ap.add_argument("--only", default="topk,indexer,decode", help="comma-separated ops to compile (also: fused, the "
                    "one-pass Gluon decode kernel, with a Triton that has Gluon)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    topk = importlib.import_module("zoe_kernels.csa.topk")
    decode = importlib.import_module("zoe_kernels.csa.dual_scope_decode")
    indexer = importlib.import_module("zoe_kernels.dsa.indexer")
    rows = []
    only = set(args.only.split(","))
    for k in (512, 2048) if "topk" in only else ():  # CSA top-512, indexer top-2048
        slots = max(4096, 8 * k)
        ptrs = {"val_ptr": "*fp32", "lo_ptr": "*i32", "hi_ptr": "*i32", "cand_key_ptr": "*i32",
                "cand_pos_ptr": "*i32", "out_ptr": "*i32", "thresh_ptr": "*i32", "fill_ptr": "*i32",
                "seg_ptr": "*i32", "hist_ptr": "*i32"}
        sampling = dict(S=topk.SAMPLE, SB=topk.SAMPLE_BLOCK, MARGIN_=topk.MARGIN)
        rows.append(compile_one(f"topk_row k={k}", topk._topk_row_kernel, ptrs,
                                dict(HAS_LO=True, **sampling, SLOTS=slots, TILE=4096), 16))
        if k == 512:
            # PAIRS: the search over each group's two largest keys first (2: two bits per count); SPEC: the sample
            # loaded before the length
            # fused: one row's launch (FUSED_FINISH_MAX_ROWS, pdl) as run 23 launched it and, with wait, as launched
            # now (PDL_THRESHOLD_MAX_ROWS: a dependent of the kernel before)
            for pairs, spec, fused, wait in ((False, False, False, False), (True, False, False, False),
                                             (False, True, False, False), (True, True, False, False),
                                             (2, True, False, False), (2, True, True, False), (2, True, True, True)):
                rows.append(compile_one(f"topk_split_threshold pairs={pairs} spec={spec}"
                                        + (f" pdl=True fused=True wait={wait}" if fused else ""),
                                        topk._split_threshold_kernel, ptrs,
                                        dict(HAS_LO=False, **sampling, SLOTS=slots, HIST=True, FLT=False,
                                             PDL=fused, PAIRS=pairs, SPEC=spec, PTX=True, FUSED=fused, WAIT=wait),
                                        topk.THRESHOLD_WARPS))
            # (tile, warps, one tile per program, 16-byte loads + inline-PTX stores, pdl, rows): 1024-entry tiles
            # from MANY_ROWS rows; VEC is the CUDA default for one tile per program; FLT (float compare, 8-byte
            # candidate stores) both ways on the CUDA defaults; one-tile programs take HALF_SCAN (the halves'
            # packed scan) as the launcher does; fused: the last program runs the finish (FUSED_FINISH_MAX_ROWS, at
            # the finish's 8 warps on 4096-entry tiles)
            # fused=2: with round 7's finish options (PTX_OUT, PACKED, THRESH_EARLY)
            for tile, warps, one, vec, pdl, b, flt, fused in (
                    (2048, 4, True, True, True, 1, False, False), (2048, 4, True, True, True, 1, True, False),
                    (2048, 4, True, False, True, 1, False, False), (2048, 4, False, False, False, 1, False, False),
                    (4096, 8, True, True, True, 1, False, True), (4096, 8, True, True, True, 1, False, 2),
                    (4096, 8, True, True, True, 1, False, False),
                    (1024, 4, True, True, False, 32, False, False), (1024, 4, True, True, False, 32, True, False),
                    (1024, 4, True, False, False, 32, False, False)):
                fptrs = {**ptrs, "cand_key_ptr": "*i64", "cand_pos_ptr": "*i64"} if flt else ptrs
                halves = topk.HALF_SCAN and one
                new = dict(PTX_OUT=fused == 2, PACKED=fused == 2, THRESH_EARLY=fused == 2)
                rows.append(compile_one(f"topk_split_filter tile={tile} one_tile={one} vec={vec} pdl={pdl} "
                                        f"hist={b == 1} flt={flt} halves={halves}" + (" fused=True" if fused else "")
                                        + (" ptx_out=True packed=True thresh_early=True" if fused == 2 else ""),
                                        topk._split_filter_kernel, fptrs,
                                        dict(HAS_LO=False, S=topk.SAMPLE, SLOTS=slots, MAXT=topk.max_tiles(b),
                                             TILE=tile, HIST=b == 1, ONE_TILE=one, VEC=vec, FLT=flt, PDL=pdl,
                                             HALVES=halves, FUSED=bool(fused), EARLY=topk.FINISH_EARLY_LOADS,
                                             ONE_GATHER=bool(fused), **new),
                                        warps, num_stages=1))
        # (pdl, rows, float filter, early loads: FINISH_EARLY_LOADS, the default, and without it; one gather:
        # FINISH_ONE_GATHER; one = 2: also round 7's PTX_OUT, PACKED, THRESH_EARLY)
        finishes = ((False, 1, False, True, False), (True, 1, False, True, False), (True, 1, False, False, False),
                    (True, 1, True, True, False), (True, 1, False, True, True), (False, 32, False, True, False),
                    (False, 32, True, True, False), (True, 32, True, True, False), (True, 32, True, False, False),
                    (True, 32, True, True, True), (True, 32, True, True, 2))
        for pdl, b, flt, early, one in finishes if k == 512 else ((False, 1, False, True, False),):
            fptrs = {**ptrs, "cand_key_ptr": "*i64", "cand_pos_ptr": "*i64"} if flt else ptrs
            new = dict(PTX_OUT=one == 2, PACKED=one == 2, THRESH_EARLY=one == 2)
            rows.append(compile_one(f"topk_split_finish k={k} pdl={pdl} maxt={topk.max_tiles(b)} flt={flt} "
                                    f"early={early}" + (" one_gather=True" if one else "")
                                    + (" ptx_out=True packed=True thresh_early=True" if one == 2 else ""),
                                    topk._split_finish_kernel, fptrs,
                                    dict(HAS_LO=False, S=topk.SAMPLE, SLOTS=slots, MAXT=topk.max_tiles(b),
                                         TILE=topk.split_tile(1 << 20, rows=b), HIST=b == 1, FLT=flt, PDL=pdl,
                                         EARLY=early, ONE_GATHER=bool(one), **new),
                                    min(16, topk.FINISH_WARPS * slots // 4096)))
    iptrs = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "k_ptr": "*fp8e4nv", "k_scale_ptr": "*fp32", "ks_ptr": "*i32",
             "ke_ptr": "*i32", "out_ptr": "*fp32"}
    index_cfgs = [("heads", 2, 64, 8, 4), ("keys", 2, 128, 4, 8), ("keys", 2, 128, 4, 4), ("keys", 4, 128, 4, 8),
                  ("keys", 2, 256, 2, 8)]
    for layout, bm, bn, tiles, warps in index_cfgs if "indexer" in only else ():
        kernel = indexer._indexer_logits_keys_kernel if layout == "keys" else indexer._indexer_logits_kernel
        rows.append(compile_one(f"indexer {layout} H=64 BM={bm} BN={bn}", kernel, iptrs,
                                dict(H=64, D=128, BM=bm, BN=bn, **({"TILES": tiles} if layout == "heads" else {})),
                                warps, num_stages=3))
    dptrs = {"q_ptr": "*bf16", "win_k_ptr": "*fp8e4nv", "win_v_ptr": "*bf16", "win_len_ptr": "*i32",
             "comp_k_ptr": "*fp8e4nv", "comp_v_ptr": "*bf16", "comp_idx_ptr": "*i32", "win_ks_ptr": "*fp32",
             "win_vs_ptr": "*fp32", "comp_ks_ptr": "*fp32", "comp_vs_ptr": "*fp32", "part_out_ptr": "*fp32",
             "part_lse_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16"}
    decode_cfgs = [(bh, dv, bkv, w, final) for bh, dv, bkv, w in [(32, 512, 64, 8), (16, 512, 64, 4), (64, 256, 64, 8),
                                                                 (32, 512, 32, 8), (64, 128, 64, 4)]
                   for final in (True, False)]
    for bh, dv, bkv, warps, final in decode_cfgs if "decode" in only else ():
        rows.append(compile_one(f"dual_scope D=512 BH={bh} DV={dv} BKV={bkv} final={final}",
                                decode._dual_scope_partial_kernel, dptrs,
                                dict(D=512, DV=dv, BH=bh, BKV=bkv, TILES_PER_SPLIT=5, K_SCALED=True, V_SCALED=False,
                                     DOT_DTYPE=tl.bfloat16, PRECISION="tf32", FINAL=final, HAS_SINK=True,
                                     SCHEDULE=0, SEL_TILES=512 // bkv, QK_F16=False, LAZY_RESCALE=False,
                                     DEFER_SUM=False),  # the two-loop schedule, run 1-13 softmax
                                warps, floats=("qk_scale_log2",)))
    if "fused" in only:  # the one-pass Gluon decode kernel (schedule 4) at the tiles, rings and value blocks tried
        from triton.experimental.gluon._runtime import GluonASTSource

        fused = importlib.import_module("zoe_kernels.csa.dual_scope_fused_gluon")
        fptrs = {"q8_ptr": "*fp8e4nv", "qs_ptr": "*fp32", "win_k_ptr": "*fp8e4nv",
                 "win_v_ptr": "*bf16", "win_len_ptr": "*i32", "comp_k_ptr": "*fp8e4nv", "comp_v_ptr": "*bf16",
                 "comp_idx_ptr": "*i32", "win_ks_ptr": "*fp32", "comp_ks_ptr": "*fp32", "sink_ptr": "*fp32",
                 "out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}
        # (DV, tile entries, key slots, staged index rows, final): the default at W=128, k=512 (232,192 bytes of
        # shared memory), its two-split form, 2 key slots, 32-entry tiles, 128-column value blocks
        for dv, bkv, slots, sel_rows, final in ((256, 64, 3, 8, True), (256, 64, 3, 8, False), (256, 64, 2, 8, True),
                                                (256, 32, 3, 16, True), (128, 64, 2, 8, True)):
            rows.append(compile_one(f"dual_scope_fused D=512 DV={dv} BKV={bkv} key_slots={slots} final={final}",
                                    fused.fused_kernel, fptrs,
                                    dict(D=512, DV=dv, BKV=bkv, TILES_PER_SPLIT=640 // bkv, KBUF=slots,
                                         SEL_P2=sel_rows, FINAL=final, HAS_SINK=True, num_warps=4), 4,
                                    source=GluonASTSource, loop=True))
    meta = {"triton": triton.__version__, "ptxas": _ptxas(), "target": "sm_90a",
            "command": "python bench/kernels/sparse_aot.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
