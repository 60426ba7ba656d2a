"""An interpreter for the few PTX instructions of zoe's inline-asm decodes, so CPU tests can run the committed asm
strings themselves (the Triton interpreter takes the portable path and never executes inline PTX).

Covered: mov.b32 (also the {lo, hi} unpack), and/or/shl/shr/mul.lo on 32-bit integers, lop3.b32 with its
truth table, sub.rn.f16x2 and fma.rn.f16x2 (each half rounded once to float16), cvt.f32.f16 and add.f32. `.reg`
declarations and braces are skipped; any other instruction raises, so an asm edit that leaves this subset fails
its test instead of passing unchecked.
"""

from __future__ import annotations

import re

import numpy as np

_MASK = 0xFFFFFFFF
_IMMEDIATE = re.compile(r"^-?(0x[0-9a-fA-F]+|\d+)$")


def f16_bits(value: float) -> int:
    """The 16 bits of `value` rounded to float16."""
    return int(np.array([value], dtype=np.float16).view(np.uint16)[0])


def f16_pair(lo: float, hi: float) -> int:
    """Two float16 values as one 32-bit register (lo in bits 0-15)."""
    return f16_bits(lo) | (f16_bits(hi) << 16)


def _f16(bits: int) -> float:
    return float(np.array([bits & 0xFFFF], dtype=np.uint16).view(np.float16)[0])


def _lop3(a: int, b: int, c: int, table: int) -> int:
    out = 0
    for bit in range(32):
        index = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((table >> index) & 1) << bit
    return out


def _f16x2(op: str, operands: list[int]) -> int:
    halves = []
    for shift in (0, 16):
        v = [_f16(x >> shift) for x in operands]
        halves.append(np.float16(v[0] - v[1]) if op == "sub" else np.float16(v[0] * v[1] + v[2]))
    return f16_bits(halves[0]) | (f16_bits(halves[1]) << 16)


def run(asm: str, inputs: list[int]) -> float:
    """Run an asm block whose output is $0 (a float32 written by add.f32) and whose inputs are $1.. (32-bit
    registers); returns $0."""
    regs: dict[str, int | float] = {f"${i + 1}": v & _MASK for i, v in enumerate(inputs)}
    for stmt in asm.strip().strip("{}").split(";"):
        stmt = stmt.strip().strip("{}").strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        args = [a.strip() for a in re.split(r",(?![^{]*})", rest)]

        def val(a: str) -> int:
            return int(a, 0) & _MASK if _IMMEDIATE.match(a) else int(regs[a])

        dst = args[0]
        if op == "mov.b32" and dst.startswith("{"):
            lo, hi = (x.strip() for x in dst.strip("{}").split(","))
            v = val(args[1])
            regs[lo], regs[hi] = v & 0xFFFF, v >> 16
            continue
        if op == "mov.b32":
            regs[dst] = val(args[1])
        elif op == "and.b32":
            regs[dst] = val(args[1]) & val(args[2])
        elif op == "or.b32":
            regs[dst] = val(args[1]) | val(args[2])
        elif op == "shr.u32":
            regs[dst] = val(args[1]) >> val(args[2])
        elif op == "shl.b32":
            regs[dst] = (val(args[1]) << val(args[2])) & _MASK
        elif op == "mul.lo.u32":
            regs[dst] = (val(args[1]) * val(args[2])) & _MASK
        elif op == "lop3.b32":
            regs[dst] = _lop3(*(val(a) for a in args[1:5]))
        elif op in ("sub.rn.f16x2", "fma.rn.f16x2"):
            regs[dst] = _f16x2(op[:3], [val(a) for a in args[1:]])
        elif op == "cvt.f32.f16":
            regs[dst] = _f16(val(args[1]))
        elif op == "add.f32":
            regs[dst] = float(np.float32(regs[args[1]]) + np.float32(regs[args[2]]))
        else:
            raise ValueError(f"instruction outside the emulated subset: {stmt!r}")
    return float(regs["$0"])
