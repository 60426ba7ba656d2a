"""Compile the fused MoE's GEMV kernels (`kernels/moe/gemv.py`, `gemv_4bit.py`) for sm_90 without a GPU.

Reports registers and spills per specialisation (the DeepSeek-V3.2 M=1 configs of `config.gemv_config`),
reusing `sparse_aot.compile_one` (Triton's own ptxas). The signature carries no divisibility hints, which
Triton adds at run time (16-byte aligned pointers, strides and sizes), so the loads here can be narrower and
the register counts differ from the GPU's; the README's PTX figures came from a compile with those hints.

Usage: python bench/kernels/moe_aot.py [--out bench/kernels/results/moe_aot.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sparse_aot import _ptxas, compile_one  # noqa: E402

import triton  # noqa: E402

# (fmt code, weight pointer type, scale pointer type)
FORMATS = {"bf16": (0, "*bf16", "*bf16"), "fp8": (1, "*fp8e4nv", "*fp32"), "w4a16": (2, "*u8", "*fp32"),
           "mxfp4": (3, "*u8", "*u8")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "moe_aot.json"))
    ap.add_argument("--configs", default="", help="fmt:gated:BLOCK_N:GPI:warps,... (default: the M=1 configs)")
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
            configs.append((fmt, True, config.gemv_config(8, 2048, fmt, gated=True)))
            configs.append((fmt, False, config.gemv_config(1, 7168, fmt, gated=False, top_k=8)))
    rows = []
    for fmt, gated, cfg in configs:
        code, wty, sty = FORMATS[fmt]
        ptrs = {"a_ptr": "*bf16", "w_ptr": wty, "ws_ptr": sty, "out_ptr": "*bf16", "ids_ptr": "*i32",
                "topk_w_ptr": "*fp32", "zero_ptr": "*fp32"}
        const = dict(GATED=gated, FMT=code, G=gemv.GROUP[code], GPI=cfg["GPI"], BLOCK_N=cfg["BLOCK_N"],
                     FP8_MUL=0.0, ATOMIC=not gated, ZBLOCK=128 if gated else 0)  # M=1: slots split, stage 1 zeroes
        row = compile_one(f"gemv {fmt} {'stage1' if gated else 'stage2'} BN={cfg['BLOCK_N']} GPI={cfg['GPI']}",
                          gemv._gemv_kernel, ptrs, const, cfg["num_warps"])
        rows.append(row)
    words = importlib.import_module("zoe_kernels.moe.gemv_4bit")
    for fmt, gated, cfg in configs:  # the word-wise kernel of the 4-bit formats (gemv_4bit.py), PTX decode
        if "WORDS" not in cfg:
            continue
        wc = cfg["WORDS"]
        code = words.FMT_CODE[fmt]
        ptrs = {"a_ptr": "*bf16", "w_ptr": "*i32", "ws_ptr": FORMATS[fmt][2], "out_ptr": "*bf16" if gated else "*fp32",
                "ids_ptr": "*i32", "topk_w_ptr": "*fp32", "zero_ptr": "*fp32"}
        const = dict(GATED=gated, ATOMIC=not gated, FMT=code, PTX=True, BLOCK_N=wc["BLOCK_N"], NS=wc["NS"],
                     ZBLOCK=0, EVEN_N=True, EVEN_K=True, PREFETCH=wc["PREFETCH"])
        label = (f"gemv_4bit {fmt} {'stage1' if gated else 'stage2'} BN={wc['BLOCK_N']} NS={wc['NS']} "
                 f"prefetch={wc['PREFETCH']}")
        rows.append(compile_one(label, words._gemv_4bit_kernel, ptrs, const, wc["num_warps"],
                                num_stages=wc["num_stages"]))
    meta = {"triton": triton.__version__, "ptxas": _ptxas(), "target": "sm_90a",
            "command": "python bench/kernels/moe_aot.py " + " ".join(sys.argv[1:])}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
