"""The 4-bit decodes of the tl.dot path (`grouped_gemm.py`): packed nibbles to the activations' 16-bit dtype in
registers, with inline PTX where `platform.has_ptx` and portable Triton ops of the same numbers elsewhere.

- int4 (`_int4_halves`, zero point 8): a magic-number or and one paired fma per two weights, exact;
  `_int4_scaled_halves` also applies the group scale (rounded to the 16-bit dtype) with one more paired fma.
- mxfp4 with its e8m0 scales (`_e2m1_scaled_halves`, the swapped form's decode): the row's 4 scale bytes of a K
  step come as one 32-bit word; bf16 results carry 2^-MX_BF16_SHIFT, which the caller's accumulator takes back.
"""

from __future__ import annotations

import triton
import triton.language as tl


def _int4_pairs_asm(magic: int, one: int, off: int, fma: str) -> str:
    """PTX of `_int4_halves` for 4 bytes in one 32-bit register: a byte permute spreads two bytes over two 16-bit
    halves (low nibbles; a shift gives the high ones), one `lop3` masks and ors MAGIC into both halves, one
    paired `fma` (x * one + off) takes MAGIC + 8 off both."""
    return (
        f"{{ .reg .b32 t0, t1, u0, u1, one, off; mov.b32 one, 0x{one:04X}{one:04X}; mov.b32 off, 0x{off:04X}{off:04X}; "
        "prmt.b32 t0, $4, 0, 0x4140; prmt.b32 t1, $4, 0, 0x4342; shr.b32 u0, t0, 4; shr.b32 u1, t1, 4; "
        + "".join(f"lop3.b32 {r}, {r}, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA; " for r in ("t0", "t1", "u0", "u1"))
        + "".join(f"fma.rn.{fma} ${i}, {r}, one, off; " for i, r in enumerate(("t0", "t1", "u0", "u1")))
        + "}"
    )


def _int4_scaled_pairs_asm(magic: int, one: int, off: int, fma: str) -> str:
    """PTX of `_int4_scaled_halves`: `_int4_pairs_asm`'s exact u - 8, then one paired fma (x * s - 0) per two
    weights with the scales of bytes 0-1 ($5) and 2-3 ($6): one rounding of the exact product."""
    return (
        f"{{ .reg .b32 t0, t1, u0, u1, one, off, nz; mov.b32 one, 0x{one:04X}{one:04X}; "
        f"mov.b32 off, 0x{off:04X}{off:04X}; mov.b32 nz, 0x80008000; "
        "prmt.b32 t0, $4, 0, 0x4140; prmt.b32 t1, $4, 0, 0x4342; shr.b32 u0, t0, 4; shr.b32 u1, t1, 4; "
        + "".join(f"lop3.b32 {r}, {r}, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA; " for r in ("t0", "t1", "u0", "u1"))
        + "".join(f"fma.rn.{fma} {r}, {r}, one, off; " for r in ("t0", "t1", "u0", "u1"))
        + "".join(f"fma.rn.{fma} ${i}, {r}, ${5 + i % 2}, nz; " for i, r in enumerate(("t0", "t1", "u0", "u1")))
        + "}"
    )


def _int4_scaled_words_asm(magic: int, one: int, off: int, fma: str) -> str:
    """PTX of `_int4_scaled_words` for 4 bytes in one 32-bit register ($4) and their scales as 16-bit pairs (s, s)
    ($5-$8): per byte a byte permute puts it ($4) and its copy shifted by 4 (y) in the low bytes of two 16-bit
    halves, one `lop3` masks the low nibble of each and ors MAGIC in, one paired fma takes MAGIC + 8 off both (exact)
    and one applies the scale: the word (w[2kp], w[2kp+1]) that the joined K tile stores, no repacking."""
    return (
        f"{{ .reg .b32 y, t, one, off, nz; mov.b32 one, 0x{one:04X}{one:04X}; mov.b32 off, 0x{off:04X}{off:04X}; "
        "mov.b32 nz, 0x80008000; shr.b32 y, $4, 4; "
        + "".join(f"prmt.b32 t, $4, y, 0x{0x0400 + 0x0101 * i:04X}; "
                  f"lop3.b32 t, t, 0x000F000F, 0x{magic:04X}{magic:04X}, 0xEA; fma.rn.{fma} t, t, one, off; "
                  f"fma.rn.{fma} ${i}, t, ${5 + i}, nz; " for i in range(4))
        + "}"
    )


# bf16: MAGIC 0x4300 (128), 1.0 = 0x3F80, -136 = 0xC308; fp16: MAGIC 0x6400 (1024), 1.0 = 0x3C00, -1032 = 0xE408
_INT4_PAIRS_BF16 = tl.constexpr(_int4_pairs_asm(0x4300, 0x3F80, 0xC308, "bf16x2"))
_INT4_PAIRS_F16 = tl.constexpr(_int4_pairs_asm(0x6400, 0x3C00, 0xE408, "f16x2"))
_INT4_SCALED_BF16 = tl.constexpr(_int4_scaled_pairs_asm(0x4300, 0x3F80, 0xC308, "bf16x2"))
_INT4_SCALED_F16 = tl.constexpr(_int4_scaled_pairs_asm(0x6400, 0x3C00, 0xE408, "f16x2"))
_INT4_WORDS_BF16 = tl.constexpr(_int4_scaled_words_asm(0x4300, 0x3F80, 0xC308, "bf16x2"))
_INT4_WORDS_F16 = tl.constexpr(_int4_scaled_words_asm(0x6400, 0x3C00, 0xE408, "f16x2"))


@triton.jit
def _int4_halves(p, DT: tl.constexpr, PTX: tl.constexpr):
    """Bytes p of two int4 nibbles u (zero point 8) -> (low - 8, high - 8) in the activations' dtype DT, exact.

    16-bit DT: a nibble becomes the float MAGIC + u by one or (bf16 0x4300 | u = 128 + u, fp16 0x6400 | u =
    1024 + u) and MAGIC + 8 comes off in the same dtype (exact: small integers). With PTX this runs on 4 bytes
    per 32-bit register: a byte permute spreads two bytes over two 16-bit halves, one `lop3` masks and ors the
    magic into both, one paired `fma` takes the offset off both (1.5 instructions per weight), where Triton's
    own lowering extends and packs each byte separately (sm_90 SASS: ~3 PRMT per pair, moe_aot.py).
    float32 DT (tests) converts the nibbles."""
    if DT == tl.float32:
        return (p & 0xF).to(tl.float32) - 8.0, (p >> 4).to(tl.float32) - 8.0
    if PTX:
        if DT == tl.bfloat16:
            return tl.inline_asm_elementwise(_INT4_PAIRS_BF16, "=r,=r,=r,=r,r", [p], dtype=(tl.bfloat16, tl.bfloat16),
                                             is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_INT4_PAIRS_F16, "=r,=r,=r,=r,r", [p], dtype=(tl.float16, tl.float16),
                                             is_pure=True, pack=4)
    if DT == tl.bfloat16:
        magic: tl.constexpr = 0x4300
        off: tl.constexpr = 136.0
    else:
        magic: tl.constexpr = 0x6400
        off: tl.constexpr = 1032.0
    p16 = p.to(tl.uint16)
    lo = ((p16 & 0xF) | magic).to(tl.uint16).to(DT, bitcast=True)
    hi = ((p16 >> 4) | magic).to(tl.uint16).to(DT, bitcast=True)
    return (lo.to(tl.float32) - off).to(DT), (hi.to(tl.float32) - off).to(DT)


@triton.jit
def _int4_scaled_halves(p, s, DT: tl.constexpr, PTX: tl.constexpr):
    """Bytes p of two int4 nibbles (zero point 8) and their group scales s (p's shape, any float dtype) ->
    ((low - 8) * s, (high - 8) * s) in the activations' 16-bit dtype DT: the scale rounded to DT, then one
    rounding of the exact product (with PTX one paired fma per two weights after `_int4_halves`' decode)."""
    s16 = s.to(DT)
    if PTX and DT != tl.float32:
        if DT == tl.bfloat16:
            return tl.inline_asm_elementwise(_INT4_SCALED_BF16, "=r,=r,=r,=r,r,r,r", [p, s16],
                                             dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        else:
            return tl.inline_asm_elementwise(_INT4_SCALED_F16, "=r,=r,=r,=r,r,r,r", [p, s16],
                                             dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    lo, hi = _int4_halves(p, DT, PTX)
    sf = s16.to(tl.float32)
    return (lo.to(tl.float32) * sf).to(DT), (hi.to(tl.float32) * sf).to(DT)


@triton.jit
def _int4_scaled_words(p, s_row, DT: tl.constexpr):
    """PTX only, 16-bit DT: bytes p [KP, N] of two int4 nibbles (zero point 8) and the group scale of each column
    s_row [1, N] -> int32 words [KP, N], each the DT pair ((low - 8) * s, (high - 8) * s) with the scale rounded to
    DT (the numbers of `_int4_scaled_halves`): the two weights of a byte side by side in one register, as the
    joined K tile stores them (`_int4_words_to_tile`)."""
    s16 = s_row.to(DT).to(tl.uint16, bitcast=True).to(tl.uint32)
    s2 = tl.broadcast_to((s16 * 0x10001).to(tl.int32, bitcast=True), p.shape)
    if DT == tl.bfloat16:
        return tl.inline_asm_elementwise(_INT4_WORDS_BF16, "=r,=r,=r,=r,r,r,r,r,r", [p, s2], dtype=tl.int32,
                                         is_pure=True, pack=4)
    else:
        return tl.inline_asm_elementwise(_INT4_WORDS_F16, "=r,=r,=r,=r,r,r,r,r,r", [p, s2], dtype=tl.int32,
                                         is_pure=True, pack=4)


@triton.jit
def _int4_words_to_tile(words, DT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """int32 words [BLOCK_K/2, BLOCK_N] of DT pairs (w[2kp], w[2kp+1]) -> the [BLOCK_K, BLOCK_N] K tile."""
    lo = (words & 0xFFFF).to(tl.uint16).to(DT, bitcast=True)
    hi = (words >> 16).to(tl.uint16).to(DT, bitcast=True)
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_K, BLOCK_N))


# mxfp4 weights decoded to bf16 in the swapped form carry 2^-MX_BF16_SHIFT (the accumulator takes it back), so that
# one bf16 multiply applies any e8m0 scale from 2^-61 to 2^65 exactly (bytes 66..192); see `_e2m1_scaled_halves`.
MX_BF16_SHIFT = 64


def _e2m1_scaled_asm(shift: int) -> str:
    """PTX of `_e2m1_scaled_halves` (bf16) for 4 bytes of one row and scale group in one 32-bit register ($4),
    the row's scale word ($5) and the group's bit offset in it ($9). A byte permute puts two bytes in the low
    8 bits of two 16-bit halves t; the low nibble's bf16 bits v * 2^-126 are ((t << 6) | (t << 12)) & 0x81C0
    (magnitude to bits 6-8, sign to 15; nothing else of either shift lands in the mask), the high nibble's
    ((t << 2) & 0x01C0) | ((t << 8) & 0x8000); one paired fma (x * scale - 0) applies the scale 2^(b - 1 - shift),
    built once as (b + 126 - shift) << 7 in both halves."""
    body = "".join(
        f"prmt.b32 t, $4, 0, {sel}; "
        f"shl.b32 a, t, 6; shl.b32 b, t, 12; lop3.b32 a, a, b, 0x81C081C0, 0xA8; fma.rn.bf16x2 ${i}, a, s, nz; "
        f"shl.b32 a, t, 2; shl.b32 b, t, 8; and.b32 b, b, 0x80008000; lop3.b32 a, a, 0x01C001C0, b, 0xEA; "
        f"fma.rn.bf16x2 ${i + 2}, a, s, nz; "
        for i, sel in ((0, "0x4140"), (1, "0x4342")))
    return ("{ .reg .b32 t, a, b, s, nz; mov.b32 nz, 0x80008000; "
            f"bfe.u32 s, $5, $9, 8; mad.lo.u32 s, s, 128, {(126 - shift) * 128}; mul.lo.u32 s, s, 0x00010001; "
            + body + "}")


_E2M1_SCALED_BF16 = tl.constexpr(_e2m1_scaled_asm(MX_BF16_SHIFT))


@triton.jit
def _e2m1_scaled_halves(p, sw, DT: tl.constexpr, BLOCK_K: tl.constexpr, MX_GROUP: tl.constexpr,
                        MX_BF16_SHIFT: tl.constexpr, PTX: tl.constexpr = False, group0=0):
    """Bytes p [BLOCK_N, BLOCK_K/2] of two e2m1 nibbles -> (low, high) times their e8m0 scale, in DT.

    sw [BLOCK_N] holds the row's 4 scale bytes of 128 k (groups of 32 k = 16 bytes) as one int32 word; the K
    step starts at its group `group0` (0 for K steps of 128; 0 or 2 for steps of 64).
    bf16: the nibble s|e1 e0|m placed at bf16 bits 15|8 7|6 is v * 2^-126 (subnormals included); the scale byte
    b becomes the bf16 2^(b - 1 - MX_BF16_SHIFT) by a shift into the exponent field, and one bf16 multiply gives
    v * 2^(b - 127 - MX_BF16_SHIFT), exact (two significant bits) where it is a normal bf16 number. fp16/fp32:
    the fp16 bits v * 2^-14 times the float32 2^(b - 127 + 14), rounded once to DT (the unswapped path's numbers)."""
    shift = 8 * (group0 + tl.arange(0, BLOCK_K // 2) // (MX_GROUP // 2))
    if PTX and DT == tl.bfloat16:  # three operands: Triton hoists only one-operand decodes into the shared-memory
        # load, and this tile goes through shared memory either way
        sw2 = tl.broadcast_to(sw[:, None], p.shape)
        sh2 = tl.broadcast_to(shift[None, :], p.shape)
        return tl.inline_asm_elementwise(_E2M1_SCALED_BF16, "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r",
                                         [p, sw2, sh2], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    sb = (sw[:, None] >> shift[None, :]) & 0xFF
    p16 = p.to(tl.uint16)
    if DT == tl.bfloat16:
        s = ((sb + (126 - MX_BF16_SHIFT)) << 7).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        lo = (((p16 & 0x7) << 6) | ((p16 & 0x8) << 12)).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        hi = (((p16 & 0x70) << 2) | ((p16 & 0x80) << 8)).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return lo * s, hi * s
    scale = ((sb + 14) << 23).to(tl.float32, bitcast=True)
    lo = (((p16 & 0x7) << 9) | ((p16 & 0x8) << 12)).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (((p16 & 0x70) << 5) | ((p16 & 0x80) << 8)).to(tl.uint16).to(tl.float16, bitcast=True)
    return (lo.to(tl.float32) * scale).to(DT), (hi.to(tl.float32) * scale).to(DT)
