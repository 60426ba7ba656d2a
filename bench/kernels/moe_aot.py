"""Compile the fused MoE's GEMV kernels (`kernels/moe/gemv.py`, `gemv_4bit.py`) and its tl.dot stages
(`grouped_gemm.py`: the M=1 tiles, and the 4-bit formats' 128-row large-M tiles) for sm_90 without a GPU.

Reports registers and spills per specialisation (the DeepSeek-V3.2 M=1 configs of `config.gemv_config`),
reusing `sparse_aot.compile_one` (Triton's own ptxas). For the tl.dot stages (`--dot`) it also reports the
cp.async count of the PTX and the SASS instructions of the K loop per weight and thread, with the integer
arguments specialised as the JIT does at a real launch (unit strides as constants, sizes divisible by 16):
without that the 4-bit weight loads compile to one byte each and nothing is pipelined. The GEMV rows' signature
carries only pointer and stride hints (Triton adds more at run time: 16-byte aligned sizes), so their loads can
be narrower and the register counts differ from the GPU's; the README's PTX figures came from a compile with
those hints.

Usage: python bench/kernels/moe_aot.py [--out bench/kernels/results/moe_aot.json] [--dot [--only LABEL]]
(MOE_AOT_DUMP=DIR also writes each tl.dot stage's TTGIR, PTX and SASS there.)
"""

from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sparse_aot import TARGET, _aligned, _ptxas, _signature, compile_one  # noqa: E402

import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# (fmt code, weight pointer type, scale pointer type)
FORMATS = {"bf16": (0, "*bf16", "*bf16"), "fp8": (1, "*fp8e4nv", "*fp32"), "w4a16": (2, "*u8", "*fp32"),
           "mxfp4": (3, "*u8", "*u8")}


# The tl.dot stages at M=1 (one tile per edge): (label, FMT code, weight type, scale type, stage-1 gated, BLOCK_N,
# num_warps, num_stages, SPLIT_K, activation type[, operands swapped: `grouped_gemm._dot_w_mx_swapped`, which the
# align-based tiles of up to 32 rows of mxfp4 run (`config.SWAP_AB_FORMATS`); compiled here as one tile per edge,
# the same K loop)
DOT_KERNELS = [
    ("fp8 stage1", 1, "*fp8e4nv", "*fp32", True, 32, 4, 4, 1, "*fp8e4nv"),
    ("fp8 stage2", 1, "*fp8e4nv", "*fp32", False, 128, 4, 4, 2, "*fp8e4nv"),
    ("w4a16 stage1", 2, "*u8", "*fp32", True, 32, 4, 4, 1, "*bf16"),
    ("w4a16 stage1 BN64", 2, "*u8", "*fp32", True, 64, 4, 4, 1, "*bf16"),
    ("w4a16 stage2", 2, "*u8", "*fp32", False, 128, 4, 4, 2, "*bf16"),
    ("mxfp4 stage1", 3, "*u8", "*u8", True, 32, 4, 4, 1, "*bf16"),
    ("mxfp4 stage2", 3, "*u8", "*u8", False, 128, 4, 4, 2, "*bf16"),
    ("mxfp4 stage1 swapped", 3, "*u8", "*u8", True, 64, 4, 4, 1, "*bf16", True),
    ("mxfp4 stage2 swapped", 3, "*u8", "*u8", False, 128, 4, 4, 2, "*bf16", True),
]
# The 4-bit formats' large-M tiles (align-based, 128 rows, joined K tiles, K steps of 64, as `config.stage_config`
# picks them from 64 edges per expert): (label, FMT code, scale type, stage-1 gated, BLOCK_N, num_warps, num_stages);
# stage 1 multiplies gate and up in one dot (GU_ONE_DOT), mxfp4 takes its scales as words (MX_WORD).
LARGE_M_KERNELS = [
    ("w4a16 stage1 BM128", 2, "*fp32", True, 64, 4, 3),
    ("w4a16 stage2 BM128", 2, "*fp32", False, 128, 4, 3),
    ("mxfp4 stage1 BM128", 3, "*u8", True, 64, 4, 3),
    ("mxfp4 stage2 BM128", 3, "*u8", False, 128, 4, 3),
]


def _loop_counts(sass: str) -> dict:
    """Instruction counts of the longest backward-branch loop of a SASS listing."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    where = {a: i for i, (a, _) in enumerate(ins)}
    best = None
    for i, (a, text) in enumerate(ins):
        m = re.search(r"BRA (?:`\(\.L_x_\d+\) )?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in where:
            body = [t for _, t in ins[where[int(m.group(1), 16)]:i + 1]]
            if best is None or len(body) > len(best):
                best = body
    if not best:
        return {}
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best)
    return {"loop_instructions": len(best), "loop_ops": dict(ops.most_common(12))}


def compile_dot(label, fmt, wty, sty, gated, bn, warps, stages, split, aty, swap=False, large_m=False) -> dict:
    """One tl.dot stage: the M=1 tiles (DOT_KERNELS) or, with `large_m`, the 128-row joined tiles."""
    gg = importlib.import_module("zoe_kernels.moe.grouped_gemm")
    fn = gg._expert_gemm_kernel
    ptrs = {"a_ptr": aty, "as_ptr": "*fp32", "w_ptr": wty, "ws_ptr": sty, "out_ptr": "*bf16" if gated else "*fp32",
            "topk_w_ptr": "*fp32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "num_padded_ptr": "*i32",
            "zero_ptr": "*fp32", "count_ptr": "*i32", "q_ptr": "*fp8e4nv", "qs_ptr": "*fp32", "pf_ptr": "*u8"}
    const = dict(GATED=gated, ATOMIC=not gated, FMT=fmt, A_FMT="bf16", BLOCK_M=16, BLOCK_N=bn, BLOCK_K=128,
                 FP8_GROUP=128, INT4_GROUP=128, MX_GROUP=32, EDGE_TILES=True,
                 SPLIT_K=split, ZBLOCK=16 if gated else 0, PTX=True, JOIN_K=False,
                 SWAP_AB=swap, MX_WORD=False, MX_BF16_SHIFT=64,
                 # fp8 stage 1 quantizes the intermediate at M=1 (config.DOT_M1_QUANT_IN_STAGE1)
                 QUANT_OUT=gated and fmt == 1, FP8_MAX=448.0, ROUND_E4M3=False,
                 TILE_ROWS=0, ALIGN_M=16, EVEN_K=True, GU_ONE_DOT=False,
                 # fp8 stage 1 prefetches 16 MiB of stage 2's weights over its 512 programs (DeepSeek-V3.2)
                 PF_LINES=256 if gated and fmt == 1 else 0,
                 PDL_WAIT=gated and fmt == 1,  # fp8 stage 1 waits for x as a programmatic dependent (DOT_M1_PDL)
                 stride_ak=1, stride_wk=1, stride_on=1, stride_ask=1, stride_wsk=1)  # unit strides: JIT constants
    if large_m:  # align's 128-row tiles, the upper-used launch of the half tiles
        const.update(BLOCK_M=128, BLOCK_K=64, EDGE_TILES=False, ZBLOCK=0, JOIN_K=True, MX_WORD=fmt == 3,
                     QUANT_OUT=False, TILE_ROWS=1, ALIGN_M=128, GU_ONE_DOT=gated, PF_LINES=0, PDL_WAIT=False)
    sig = _signature(fn, ptrs, const)
    attrs = _aligned(fn, sig)
    for i, name in enumerate(fn.arg_names):
        if name in ("N", "K", "KP", "KS", "zero_numel"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=TARGET,
                            options={"num_warps": warps, "num_stages": stages})
    ptx = kernel.asm["ptx"]
    row = {"kernel": (f"tl.dot large M {label} BN={bn} warps={warps} stages={stages}" if large_m else
                      f"tl.dot M=1 {label} BN={bn} warps={warps} stages={stages} split={split}"),
           "shared_bytes": kernel.metadata.shared, "cp_async": len(re.findall(r"cp\.async\.ca|cp\.async\.cg", ptx)),
           "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "st_shared": len(re.findall(r"st\.shared", ptx))}
    sass = _ptxas_row(row, kernel, label)
    if sass is not None:
        weights_per_thread = const["BLOCK_K"] * bn * (2 if gated else 1) / (32 * warps)  # one K step
        if row.get("loop_instructions"):
            row["loop_instructions_per_weight"] = round(row["loop_instructions"] / weights_per_thread, 2)
    print(json.dumps(row), flush=True)
    return row


def _ptxas_row(row: dict, kernel, label: str) -> str | None:
    """Assemble the kernel's PTX for sm_90a with Triton's ptxas: registers, spills and the K loop's instruction
    counts into `row`; the SASS listing, or None without ptxas. MOE_AOT_DUMP=DIR also writes TTGIR, PTX and SASS."""
    ptxas = _ptxas()
    if not ptxas:
        return None
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_text(ptx)
        info = subprocess.run([ptxas, "-v", "-arch=sm_90a", f"{tmp}/k.ptx", "-o", f"{tmp}/k.cubin"],
                              capture_output=True, text=True).stderr
        sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", f"{tmp}/k.cubin"],
                              capture_output=True, text=True).stdout
    if os.environ.get("MOE_AOT_DUMP"):  # the listings, for reading the K loop
        stem = Path(os.environ["MOE_AOT_DUMP"]) / re.sub(r"\W+", "_", label)
        for ext, text in (("ttgir", kernel.asm["ttgir"]), ("ptx", ptx), ("sass", sass)):
            stem.with_suffix(f".{ext}").write_text(text)
    regs = re.findall(r"Used (\d+) registers", info)
    spills = re.findall(r"(\d+) bytes spill stores", info)
    row.update(registers=int(regs[-1]) if regs else None, spill_store_bytes=int(spills[-1]) if spills else None)
    row.update(_loop_counts(sass))
    return sass


def compile_words(fmt: str, gated: bool, wc: dict) -> dict:
    """The word-wise 4-bit GEMV stage (`gemv_4bit.py`, PTX decode) with the JIT's specialisations (sizes divisible
    by 16): registers, spills, and the K loop's SASS instructions per weight. ptxas may unroll the loop: the
    steps in its body are counted by its FFMAs (one per weight in either format's float32 products) or, with the
    packed-half products (H2), by its HFMA2s (int4: 6 per 8 weights, e2m1: 4 per 8)."""
    words = importlib.import_module("zoe_kernels.moe.gemv_4bit")
    code = words.FMT_CODE[fmt]
    fn = words._gemv_4bit_kernel
    ptrs = {"a_ptr": "*bf16", "w_ptr": "*i32", "ws_ptr": FORMATS[fmt][2], "out_ptr": "*bf16" if gated else "*fp32",
            "ids_ptr": "*i32", "topk_w_ptr": "*fp32", "zero_ptr": "*fp32"}
    const = dict(GATED=gated, ATOMIC=not gated, FMT=code, PTX=True, BLOCK_N=wc["BLOCK_N"], NS=wc["NS"],
                 ZBLOCK=0, EVEN_N=True, EVEN_K=True, PREFETCH=wc["PREFETCH"],
                 STAGES=1 if wc["PREFETCH"] else wc["num_stages"], PDL=wc.get("PDL", False), H2=wc.get("H2", True))
    sig = _signature(fn, ptrs, const)
    attrs = _aligned(fn, sig)
    for i, name in enumerate(fn.arg_names):
        if name in ("N", "K", "KW", "zero_numel"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    label = (f"gemv_4bit {fmt} {'stage1' if gated else 'stage2'} BN={wc['BLOCK_N']} NS={wc['NS']} "
             f"prefetch={wc['PREFETCH']} stages={wc['num_stages']} pdl={wc.get('PDL', False)} h2={wc.get('H2', True)}")
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs), target=TARGET,
                            options={"num_warps": wc["num_warps"], "num_stages": wc["num_stages"]})
    row = {"kernel": label, "num_warps": wc["num_warps"], "shared_bytes": kernel.metadata.shared,
           "cp_async": len(re.findall(r"cp\.async\.ca|cp\.async\.cg", kernel.asm["ptx"]))}
    if _ptxas_row(row, kernel, label) is not None and row.get("loop_instructions"):
        per_step = wc["BLOCK_N"] * wc["NS"] * 32 * (2 if gated else 1) / (32 * wc["num_warps"])  # weights/thread
        if wc.get("H2", True):  # f16x2 fmas per weight: int4 4 products + 2 decodes per 8, e2m1 4 products per 8
            steps = max(1, round(row["loop_ops"].get("HFMA2", 0) / (per_step * (0.75 if fmt == "w4a16" else 0.5))))
        else:
            steps = max(1, round(row["loop_ops"].get("FFMA", 0) / per_step))
        row.update(loop_steps=steps, loop_instructions_per_weight=round(row["loop_instructions"] / (per_step * steps), 2))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "moe_aot.json"))
    ap.add_argument("--configs", default="", help="fmt:gated:BLOCK_N:GPI:warps,... (default: the M=1 configs)")
    ap.add_argument("--dot", action="store_true", help="also the tl.dot stages at M=1 (DOT_KERNELS)")
    ap.add_argument("--only", default="", help="with --dot: only the DOT_KERNELS whose label contains this")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    gemv = importlib.import_module("zoe_kernels.moe.gemv")
    config = importlib.import_module("zoe_kernels.moe.config")
    configs = []
    if args.configs:
        for item in args.configs.split(","):
            fmt, gated, bn, gpi, warps = item.split(":")
            configs.append((fmt, gated == "1", {"BLOCK_N": int(bn), "GPI": int(gpi), "num_warps": int(warps)}))
    else:  # DeepSeek-V3.2 at M=1: stage 1 over 8 edges x I=2048, stage 2 over 1 token x H=7168
        for fmt in FORMATS:
            configs.append((fmt, True, config.gemv_config(8, 2048, fmt, gated=True, k=7168)))
            configs.append((fmt, False, config.gemv_config(1, 7168, fmt, gated=False, top_k=8, k=2048)))
    rows = []
    for fmt, gated, cfg in configs:
        code, wty, sty = FORMATS[fmt]
        ptrs = {"a_ptr": "*bf16", "w_ptr": wty, "ws_ptr": sty, "out_ptr": "*bf16", "ids_ptr": "*i32",
                "topk_w_ptr": "*fp32", "zero_ptr": "*fp32"}
        const = dict(GATED=gated, FMT=code, G=gemv.GROUP[code], GPI=cfg["GPI"], BLOCK_N=cfg["BLOCK_N"],
                     ATOMIC=not gated, ZBLOCK=128 if gated else 0)  # M=1: slots split, stage 1 zeroes
        row = compile_one(f"gemv {fmt} {'stage1' if gated else 'stage2'} BN={cfg['BLOCK_N']} GPI={cfg['GPI']}",
                          gemv._gemv_kernel, ptrs, const, cfg["num_warps"])
        rows.append(row)
    for fmt, gated, cfg in configs:  # the word-wise kernel of the 4-bit formats (gemv_4bit.py), PTX decode
        if "WORDS" in cfg:  # H2 as on a GPU (gemv_config turns it off without PTX)
            rows.append(compile_words(fmt, gated, cfg["WORDS"] | {"H2": config.GEMV_4BIT_H2[fmt][1 if gated else 2]}))
    if args.dot:
        rows += [compile_dot(*k) for k in DOT_KERNELS if not args.only or args.only in k[0]]
        rows += [compile_dot(label, fmt, "*u8", sty, gated, bn, warps, stages, 1, "*bf16", large_m=True)
                 for label, fmt, sty, gated, bn, warps, stages in LARGE_M_KERNELS
                 if not args.only or args.only in label]
    meta = {"triton": triton.__version__, "ptxas": _ptxas(), "target": "sm_90a",
            "command": "python bench/kernels/moe_aot.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
