"""The 4-bit formats' GEMV stages (w4a16, mxfp4) of the fused MoE's small-M path, decoded a 32-bit word at a time.

Same math, grid and launch contract as `gemv.py` (stage 1: a program per (edge, block of BLOCK_N rows of I)
writes silu(gate) * up; stage 2: a program per (token, chunk of top-k slots, block of BLOCK_N rows of H)
sums weight * (inter[edge] . w2[e, n]) and stores or atomically adds it), for weights whose rows are whole
32-bit words (ceil(K/2) % 4 == 0; `gemv.py` takes the others). The weights are read as int32 words of 8
nibbles, k = 8 w + j for nibble j (bits 4j..4j+3 of word w), 16 bytes (a "slice" of 32 k) per thread and
row; a slice lies in one scale group of either format (int4: 4 slices per group of 128, mxfp4: one per 32).

Why words: the byte-wise decode of `gemv.py` spent about 9 SASS instructions per weight (nibble extraction,
magic-number or, subtract, multiply, reduction, and a shared-memory round trip of the activations per scale
group), so the 4-bit stages were bound by instructions at about a third of the HBM bandwidth
(bench/kernels/moe_README.md). Here, per nibble:
- int4 (u, zero point 8): one byte permute `prmt` builds the float32 bits 0x43 | 00 | 0u | 00 = 128 + u from
  the masked word (two masks per word serve its 8 nibbles); the offset 136 = 128 + 8 is taken out once per
  word from the activations (acc starts at -136 sum_j a_j), so a nibble costs the permute and one FMA
  (portable Triton without `prmt`: shift, and, or);
- e2m1 (s|e1 e0|m): nibbles j and j + 4 go to f16 bits 15|11 10|9 of the two halves of one register with
  two shifts and two logic ops (v * 2^-14, subnormal for e = 0, exact), then two f16 -> f32 conversions
  and two FMAs; the factor 2^14 goes on the sum with the e8m0 scale.
Each thread keeps float32 partials per (row, slice) and multiplies by the slice's scale once; the rows'
partials are reduced across threads once per program. The activations of a K step are loaded once per
program and shared by the BLOCK_N (x2 for gate and up) rows.

`prmt` and the paired f16 conversion are PTX (`tl.inline_asm_elementwise`), used where `platform.has_ptx`
(CUDA, not the interpreter); ROCm and the interpreter run the portable decode of the same bits.

Packed halves (H2, `config.GEMV_4BIT_H2`, 16-bit activations): the products are f16x2 fmas. A nibble pair
(j, j + 4) of a word lies 16 bits apart, so one register holds both decoded values:
- int4: (w & 0x000F000F) | 0x6400 6400 is the f16 pair 1024 + u (Marlin's magic number); a subtraction of 1032
  (or, for the nibbles 4 bits up, an fma by 1/16 and -72) leaves u - 8: two operations per pair;
- e2m1: the f16 bits need each nibble's sign 6 bits above its magnitude (s at 15, e1 e0 m at 11..9), and
  nibbles sit 4 bits apart, so one shift cannot place them. A word is first rearranged so that every byte holds
  one nibble in that pattern: te = lop3 select of w (magnitudes, mask 0x07070707) and w * 8 (the sign into bit
  6) holds the even nibbles, to = the same select of w >> 4 and w >> 1 the odd ones; the other bits of each
  byte are junk the final mask drops. Then a pair is (te or to, shifted by 9 or 1) & 0x8E008E00: 13 integer
  operations per word against 15 for per-pair shifts and masks (17 and 19 with the 4 f16x2 fmas).
The activations of a K step are scaled per 32-value slice by a power of two (2^-E from the slice's largest
magnitude, times 2^14 for e2m1) so that a slice's 16 products per half and their sums stay inside float16, packed
as f16 pairs, and one asm block per (row, slice) chains its 16 f16x2 fmas and converts the sum to float32 once,
which then takes the scale and 2^E back. Against float32 products on the same (16, 16, 2) tile, the sm_90a K loop
of stage 1 spends 2.26 against 2.92 (w4a16) and 2.88 against 4.48 (mxfp4) instructions per weight (moe_aot.py,
Triton 3.9; mxfp4 3.12 with per-pair shifts). Stage 1 at M=1 on DeepSeek-V3.2 (H200): w4a16 35.2 against 42.8 us
(best tile each way), mxfp4 37.2 against 40.8 with per-pair shifts and 52.3 with float32 products (history and
the sweeps in bench/kernels/moe_README.md's git history). Rounding: about 6e-4 of the norm (float16 partial sums of
16 products).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.platform import gdc_launch_dependents, gdc_wait, has_pdl, has_ptx

FMT_CODE = {"w4a16": 2, "mxfp4": 3}
SLICES_PER_GROUP = {2: 4, 3: 1}  # 32-k slices per scale group: int4 groups of 128, e8m0 groups of 32


# Benchmarks set RECORD_LAUNCHES to read the last launch's grid and registers per thread from LAST_LAUNCH (to
# relate a tile's time to its occupancy); off, the launch path does no bookkeeping.
RECORD_LAUNCHES = False
LAST_LAUNCH: dict = {}


def rows_are_words(w: torch.Tensor) -> bool:
    """True when the packed weight's rows are whole aligned int32 words (this module's layout contract)."""
    return w.stride(-1) == 1 and w.shape[-1] % 4 == 0 and w.stride(-2) % 4 == 0 and w.data_ptr() % 4 == 0


@triton.jit
def _int4(p, J: tl.constexpr, PTX: tl.constexpr):
    """Nibble J of int32 words p as the float32 128 + u."""
    if J % 2 == 0:
        t = p & 0x0F0F0F0F
    else:
        t = (p >> 4) & 0x0F0F0F0F
    B: tl.constexpr = J // 2  # the byte of t that holds nibble J
    if PTX:
        # bytes 0-3 from 0x43000000, 4-7 from t; selector 0x3 (4+B) 1 0: out = [0x00, 0x00, t.byte B, 0x43]
        magic = tl.full(t.shape, 0x43000000, tl.int32)
        if B == 0:
            f = tl.inline_asm_elementwise("prmt.b32 $0, $2, $1, 0x3410;", "=r,r,r", [t, magic], dtype=tl.float32,
                                          is_pure=True, pack=1)
        elif B == 1:
            f = tl.inline_asm_elementwise("prmt.b32 $0, $2, $1, 0x3510;", "=r,r,r", [t, magic], dtype=tl.float32,
                                          is_pure=True, pack=1)
        elif B == 2:
            f = tl.inline_asm_elementwise("prmt.b32 $0, $2, $1, 0x3610;", "=r,r,r", [t, magic], dtype=tl.float32,
                                          is_pure=True, pack=1)
        else:
            f = tl.inline_asm_elementwise("prmt.b32 $0, $2, $1, 0x3710;", "=r,r,r", [t, magic], dtype=tl.float32,
                                          is_pure=True, pack=1)
        return f
    if B < 2:
        q = t << (16 - 8 * B)
    elif B > 2:
        q = t >> 8
    else:
        q = t
    return ((q & 0x000F0000) | 0x43000000).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_bits(p, J: tl.constexpr):
    """e2m1 nibbles J and J + 4 (J < 4) of int32 words p placed as the f16 bits s|e1 e0|m of the two halves of one
    int32 (v * 2^-14, subnormal for e = 0, exact)."""
    if J < 3:
        sg = p << (12 - 4 * J)
        mg = p << (9 - 4 * J)
    else:
        sg = p
        mg = p >> 3
    return (mg & 0x0E000E00) | (sg & -2147450880)  # masks 0x0e000e00 (e1 e0 m), 0x80008000 (s)


@triton.jit
def _f16_halves(h2):
    """The two float16 values in the halves of int32 h2 (low, high)."""
    return h2.to(tl.int16).to(tl.float16, bitcast=True), (h2 >> 16).to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _e2m1_pair(p, J: tl.constexpr, PTX: tl.constexpr):
    """e2m1 nibbles J and J + 4 (J < 4) of int32 words p as float32 v * 2^-14."""
    h2 = _e2m1_bits(p, J)
    if PTX:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [h2], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        lo, hi = _f16_halves(h2)
        lo = lo.to(tl.float32)
        hi = hi.to(tl.float32)
    return lo, hi


@triton.jit
def _load_acts(a_row, k0, K, NS: tl.constexpr, EVEN_K: tl.constexpr):
    """The activations of one K step (NS slices from k0) as [NS, 4, 8]: x[s, w, j] = a[k0 + 32 s + 8 w + j]."""
    offs_k = k0 + tl.arange(0, NS)[:, None, None] * 32 + tl.arange(0, 4)[None, :, None] * 8 \
        + tl.arange(0, 8)[None, None, :]
    if EVEN_K:
        return tl.load(a_row + offs_k)
    return tl.load(a_row + offs_k, mask=offs_k < K, other=0.0)


@triton.jit
def _split_acts(x, NS: tl.constexpr):
    """[NS, 4, 8] activations -> 8 float32 [NS, 4] tensors a_j[s, w] = x[s, w, j]."""
    x = tl.reshape(x.to(tl.float32), (NS, 4, 2, 2, 2))  # j = 4 b2 + 2 b1 + b0
    e, o = tl.split(x)
    ee, eo = tl.split(e)
    oe, oo = tl.split(o)
    a0, a4 = tl.split(ee)
    a2, a6 = tl.split(eo)
    a1, a5 = tl.split(oe)
    a3, a7 = tl.split(oo)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _slice_dot(p, a0, a1, a2, a3, a4, a5, a6, a7, FMT: tl.constexpr, PTX: tl.constexpr):
    """sum over the 4 words of each slice of sum_j decode_j(p) a_j: float32 [BLOCK_N, NS] from words [BLOCK_N, NS, 4]
    (int4: sum_j a_j (u_j - 8); e2m1: 2^-14 sum_j a_j v_j)."""
    if FMT == 2:
        acc = -136.0 * (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7)[None, :, :] + _int4(p, 0, PTX) * a0[None, :, :]
        acc += _int4(p, 1, PTX) * a1[None, :, :]
        acc += _int4(p, 2, PTX) * a2[None, :, :]
        acc += _int4(p, 3, PTX) * a3[None, :, :]
        acc += _int4(p, 4, PTX) * a4[None, :, :]
        acc += _int4(p, 5, PTX) * a5[None, :, :]
        acc += _int4(p, 6, PTX) * a6[None, :, :]
        acc += _int4(p, 7, PTX) * a7[None, :, :]
    else:
        f0, f4 = _e2m1_pair(p, 0, PTX)
        acc = f0 * a0[None, :, :] + f4 * a4[None, :, :]
        f1, f5 = _e2m1_pair(p, 1, PTX)
        acc += f1 * a1[None, :, :]
        acc += f5 * a5[None, :, :]
        f2, f6 = _e2m1_pair(p, 2, PTX)
        acc += f2 * a2[None, :, :]
        acc += f6 * a6[None, :, :]
        f3, f7 = _e2m1_pair(p, 3, PTX)
        acc += f3 * a3[None, :, :]
        acc += f7 * a7[None, :, :]
    return tl.sum(acc, axis=2)


# The packed-half (H2) slice dot: fp16x2 products and sums of a slice's 32 weights, per pair of nibbles (j, j + 4)
# of a word, which sit 16 bits apart (one f16x2 register holds both). Constants as f16x2 bit patterns: 0x6400 1024,
# 0x6408 1032, 0x2C00 1/16, 0xD480 -72. lop3 tables: 0xEA (a & b) | c, 0xE4 c ? a : b.
_H2_INT4_ASM = """{
.reg .b32 d, s, acc, sub, sc, off;
.reg .b16 l, h;
.reg .f32 fl, fh;
mov.b32 sub, 0x64086408;
mov.b32 sc, 0x2C002C00;
mov.b32 off, 0xD480D480;
mov.b32 acc, 0;
""" + "".join(f"""lop3.b32 d, ${1 + w}, 0x000F000F, 0x64006400, 0xEA;
sub.rn.f16x2 d, d, sub;
fma.rn.f16x2 acc, d, ${5 + 4 * w}, acc;
lop3.b32 d, ${1 + w}, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, sc, off;
fma.rn.f16x2 acc, d, ${6 + 4 * w}, acc;
shr.u32 s, ${1 + w}, 8;
lop3.b32 d, s, 0x000F000F, 0x64006400, 0xEA;
sub.rn.f16x2 d, d, sub;
fma.rn.f16x2 acc, d, ${7 + 4 * w}, acc;
lop3.b32 d, s, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, sc, off;
fma.rn.f16x2 acc, d, ${8 + 4 * w}, acc;
""" for w in range(4)) + """mov.b32 {l, h}, acc;
cvt.f32.f16 fl, l;
cvt.f32.f16 fh, h;
add.f32 $0, fl, fh;
}"""

_H2_E2M1_ASM = """{
.reg .b32 d, t, u, te, to, acc;
.reg .b16 l, h;
.reg .f32 fl, fh;
mov.b32 acc, 0;
""" + "".join(f"""mul.lo.u32 t, ${1 + w}, 8;
lop3.b32 te, ${1 + w}, t, 0x07070707, 0xE4;
shr.u32 t, ${1 + w}, 4;
shr.u32 u, ${1 + w}, 1;
lop3.b32 to, t, u, 0x07070707, 0xE4;
mul.lo.u32 d, te, 512;
and.b32 d, d, 0x8E008E00;
fma.rn.f16x2 acc, d, ${5 + 4 * w}, acc;
mul.lo.u32 d, to, 512;
and.b32 d, d, 0x8E008E00;
fma.rn.f16x2 acc, d, ${6 + 4 * w}, acc;
shl.b32 d, te, 1;
and.b32 d, d, 0x8E008E00;
fma.rn.f16x2 acc, d, ${7 + 4 * w}, acc;
shl.b32 d, to, 1;
and.b32 d, d, 0x8E008E00;
fma.rn.f16x2 acc, d, ${8 + 4 * w}, acc;
""" for w in range(4)) + """mov.b32 {l, h}, acc;
cvt.f32.f16 fl, l;
cvt.f32.f16 fh, h;
add.f32 $0, fl, fh;
}"""
_H2_INT4 = tl.constexpr(_H2_INT4_ASM)
_H2_E2M1 = tl.constexpr(_H2_E2M1_ASM)
_H2_OPERANDS = tl.constexpr("=r" + ",r" * 20)  # the slice's sum; its 4 words, then its 16 activation pairs


@triton.jit
def _h2_bits(v):
    """float32 -> the 16 bits of its float16, in the low half of an int32."""
    return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _acts_h2(x, NS: tl.constexpr, FMT: tl.constexpr):
    """The activations of one K step ([NS, 4, 8], `_load_acts`) for the packed-half slice dot: each slice scaled
    by a power of two 2^-E (E: the exponent of its largest magnitude; e2m1 also 2^14, the decode's factor) so
    that its products and sums stay within float16 (|a| < 2, or < 2^15), as float16 pairs (a[8 w + j],
    a[8 w + j + 4]) in one int32 per (slice, word w): h_j [NS, 4] for j < 4. Returns 2^E [NS] (the factor the
    slice's sum takes back) and h_0 .. h_3 (split by word only where they meet the weights, whose 4 words per
    slice one thread holds: splitting them here cost layout conversions through shared memory)."""
    xf = x.to(tl.float32)
    amax = tl.max(tl.max(tl.abs(xf), axis=2), axis=1)
    eb = amax.to(tl.int32, bitcast=True) & 0x7F800000
    eb = tl.minimum(tl.where(eb == 0, 127 << 23, eb), 254 << 23)  # all-zero (or subnormal) slice: 2^0
    two_e = eb.to(tl.float32, bitcast=True)
    inv = (16384.0 if FMT == 3 else 1.0) / two_e
    a0, a1, a2, a3, a4, a5, a6, a7 = _split_acts(xf * inv[:, None, None], NS)
    h0 = _h2_bits(a0) | (_h2_bits(a4) << 16)
    h1 = _h2_bits(a1) | (_h2_bits(a5) << 16)
    h2 = _h2_bits(a2) | (_h2_bits(a6) << 16)
    h3 = _h2_bits(a3) | (_h2_bits(a7) << 16)
    return two_e, h0, h1, h2, h3


@triton.jit
def _words(t, BLOCK_N: tl.constexpr, NS: tl.constexpr):
    """[BLOCK_N, NS, 4] (or [1, NS, 4], broadcast) -> its 4 words as [BLOCK_N, NS] tensors, in-thread splits."""
    q = tl.reshape(tl.broadcast_to(t, (BLOCK_N, NS, 4)), (BLOCK_N, NS, 2, 2))
    e, o = tl.split(q)
    w0, w2 = tl.split(e)
    w1, w3 = tl.split(o)
    return w0, w1, w2, w3


@triton.jit
def _h2_pair(p, J: tl.constexpr, FMT: tl.constexpr):
    """Portable decode of nibbles J and J + 4 of words p into two float16 tensors (int4: u - 8; e2m1: v 2^-14),
    the values the PTX slice dot builds in one f16x2 register."""
    if FMT == 2:
        lo = ((p >> (4 * J)) & 0xF) - 8
        hi = ((p >> (4 * J + 16)) & 0xF) - 8
        return lo.to(tl.float16), hi.to(tl.float16)
    return _f16_halves(_e2m1_bits(p, J))


@triton.jit
def _h2_word(acc_lo, acc_hi, p, b0, b1, b2, b3, FMT: tl.constexpr):
    """One word's 8 products added to float16 partials (low and high halves), portable."""
    for J in tl.static_range(4):
        if J == 0:
            b = b0
        elif J == 1:
            b = b1
        elif J == 2:
            b = b2
        else:
            b = b3
        lo, hi = _h2_pair(p, J, FMT)
        acc_lo = acc_lo + lo * (b & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
        acc_hi = acc_hi + hi * (b >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return acc_lo, acc_hi


@triton.jit
def _slice_dot_h2(p, h0, h1, h2, h3, FMT: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, NS: tl.constexpr):
    """sum over each slice of its 32 products in float16 (two halves, then float32): float32 [BLOCK_N, NS] from
    words [BLOCK_N, NS, 4] and the slice's float16 pairs h_j ([NS, 4], `_acts_h2`). With PTX one asm block
    per slice: per pair a mask, an or and one f16x2 fma or subtraction (int4, Marlin's magic number 1024), or two
    multiplies, three logic ops (e2m1), then one f16x2 fma of the products."""
    p0, p1, p2, p3 = _words(p, BLOCK_N, NS)
    h00, h10, h20, h30 = _words(h0[None, :, :], BLOCK_N, NS)  # h{word}{pair}
    h01, h11, h21, h31 = _words(h1[None, :, :], BLOCK_N, NS)
    h02, h12, h22, h32 = _words(h2[None, :, :], BLOCK_N, NS)
    h03, h13, h23, h33 = _words(h3[None, :, :], BLOCK_N, NS)
    if PTX:
        args = [p0, p1, p2, p3, h00, h01, h02, h03, h10, h11, h12, h13, h20, h21, h22, h23, h30, h31, h32, h33]
        if FMT == 2:
            return tl.inline_asm_elementwise(_H2_INT4, _H2_OPERANDS, args, dtype=tl.float32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise(_H2_E2M1, _H2_OPERANDS, args, dtype=tl.float32, is_pure=True, pack=1)
    acc_lo = tl.zeros(p0.shape, dtype=tl.float16)
    acc_hi = tl.zeros(p0.shape, dtype=tl.float16)
    acc_lo, acc_hi = _h2_word(acc_lo, acc_hi, p0, h00, h01, h02, h03, FMT)
    acc_lo, acc_hi = _h2_word(acc_lo, acc_hi, p1, h10, h11, h12, h13, FMT)
    acc_lo, acc_hi = _h2_word(acc_lo, acc_hi, p2, h20, h21, h22, h23, FMT)
    acc_lo, acc_hi = _h2_word(acc_lo, acc_hi, p3, h30, h31, h32, h33, FMT)
    return acc_lo.to(tl.float32) + acc_hi.to(tl.float32)


@triton.jit
def _load_scales(ws_base, rows, row_mask, offs_s, stride_wsn, stride_wsk, FMT: tl.constexpr, EVEN_N: tl.constexpr):
    """The raw scale of each (row, slice) of one K step, [BLOCK_N, NS]."""
    ptrs = ws_base + rows[:, None] * stride_wsn + (offs_s // (4 if FMT == 2 else 1))[None, :] * stride_wsk
    if EVEN_N:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=row_mask[:, None], other=0)


@triton.jit
def _scale_f32(s, FMT: tl.constexpr):
    """Raw scales as float32; e8m0 byte b is 2^(b - 127) (b = 0: 2^-127, a float32 subnormal)."""
    if FMT == 2:
        return s.to(tl.float32)
    sb = s.to(tl.uint32)
    return tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)


@triton.jit
def _load_words(w_base, rows, row_mask, kw0, KW, stride_wn, NS: tl.constexpr, EVEN_N: tl.constexpr,
                EVEN_K: tl.constexpr):
    """The row block's words kw0 .. kw0 + 4 NS as [BLOCK_N, NS, 4], loaded as one [BLOCK_N, 4 NS] tile: its
    layout puts a row's consecutive 16-byte slices on neighbouring threads, so a thread holds one slice of
    several rows and its activations serve all of them (a [BLOCK_N, NS, 4] load put each row on one thread)."""
    offs_w = kw0 + tl.arange(0, NS * 4)
    ptrs = w_base + rows[:, None] * stride_wn + offs_w[None, :]
    if EVEN_N and EVEN_K:
        p = tl.load(ptrs)
    else:
        p = tl.load(ptrs, mask=row_mask[:, None] & (offs_w[None, :] < KW), other=0)
    return tl.reshape(p, (rows.shape[0], NS, 4))


@triton.jit
def _load_step(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, kw0, stride_wn, stride_wsn, stride_wsk,
               BOTH: tl.constexpr, FMT: tl.constexpr, NS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """Everything one K step (words kw0 .. kw0 + 4 NS) reads: weight words and raw scales of the row block (and
    of the up rows N + offs_n if BOTH, else the same tensors again), and the activations."""
    p, s, p2, s2 = _load_w_step(w_base, ws_base, offs_n, n_mask, N, KW, kw0, stride_wn, stride_wsn, stride_wsk,
                                BOTH, FMT, NS, EVEN_N, EVEN_K)
    return p, s, p2, s2, _load_acts(a_row, kw0 * 8, K, NS, EVEN_K)


@triton.jit
def _load_w_step(w_base, ws_base, offs_n, n_mask, N, KW, kw0, stride_wn, stride_wsn, stride_wsk,
                 BOTH: tl.constexpr, FMT: tl.constexpr, NS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
    """The weight words and raw scales of one K step (`_load_step` without the activations)."""
    offs_s = kw0 // 4 + tl.arange(0, NS)
    p = _load_words(w_base, offs_n, n_mask, kw0, KW, stride_wn, NS, EVEN_N, EVEN_K)
    s = _load_scales(ws_base, offs_n, n_mask, offs_s, stride_wsn, stride_wsk, FMT, EVEN_N)
    if BOTH:
        p2 = _load_words(w_base, N + offs_n, n_mask, kw0, KW, stride_wn, NS, EVEN_N, EVEN_K)
        s2 = _load_scales(ws_base, N + offs_n, n_mask, offs_s, stride_wsn, stride_wsk, FMT, EVEN_N)
    else:
        p2 = p
        s2 = s
    return p, s, p2, s2


@triton.jit
def _step(acc, acc2, p, s, p2, s2, x, BOTH: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr, NS: tl.constexpr,
          H2: tl.constexpr, BLOCK_N: tl.constexpr):
    """One K step's products added to the (row, slice) partials of the gate (acc) and, if BOTH, up (acc2) rows.
    H2: in packed halves (`_slice_dot_h2`), each slice's sum scaled back by its activations' 2^E."""
    if H2:
        two_e, h0, h1, h2, h3 = _acts_h2(x, NS, FMT)
        acc += _slice_dot_h2(p, h0, h1, h2, h3, FMT, PTX, BLOCK_N, NS) * (_scale_f32(s, FMT) * two_e[None, :])
        if BOTH:
            acc2 += _slice_dot_h2(p2, h0, h1, h2, h3, FMT, PTX, BLOCK_N, NS) * (_scale_f32(s2, FMT) * two_e[None, :])
    else:
        a0, a1, a2, a3, a4, a5, a6, a7 = _split_acts(x, NS)
        acc += _slice_dot(p, a0, a1, a2, a3, a4, a5, a6, a7, FMT, PTX) * _scale_f32(s, FMT)
        if BOTH:
            acc2 += _slice_dot(p2, a0, a1, a2, a3, a4, a5, a6, a7, FMT, PTX) * _scale_f32(s2, FMT)
    return acc, acc2


@triton.jit
def _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, stride_wn, stride_wsn, stride_wsk,
              BOTH: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, NS: tl.constexpr,
              EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, PREFETCH: tl.constexpr, STAGES: tl.constexpr,
              H2: tl.constexpr, WAIT: tl.constexpr = False):
    """(a_row . W[offs_n], a_row . W[N + offs_n] if BOTH else zeros) over the whole K, float32 [BLOCK_N] each.
    PREFETCH: the loads of step i + 1 are issued before step i computes (two steps of registers), so each
    program keeps a step of weights in flight while it decodes. STAGES > 1 (without PREFETCH): the K loop is
    software-pipelined by Triton through shared memory (`tl.range(num_stages=...)`: cp.async, STAGES - 1 steps
    in flight without holding registers); the launch's num_stages alone does not pipeline loads that feed no
    tl.dot. WAIT (a programmatic dependent launch): the first step's weights are requested before `gdc_wait`,
    the activations (the previous grid's output) after it; that step is then computed before the loop."""
    acc = tl.zeros((BLOCK_N, NS), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, NS), dtype=tl.float32)
    STEP: tl.constexpr = NS * 4
    k_first = 0
    if WAIT:
        p, s, p2, s2 = _load_w_step(w_base, ws_base, offs_n, n_mask, N, KW, 0, stride_wn, stride_wsn, stride_wsk,
                                    BOTH, FMT, NS, EVEN_N, EVEN_K)
        gdc_wait()
        x = _load_acts(a_row, 0, K, NS, EVEN_K)
        if not PREFETCH:  # step 0 here, the loop from step 1
            acc, acc2 = _step(acc, acc2, p, s, p2, s2, x, BOTH, FMT, PTX, NS, H2, BLOCK_N)
            k_first = STEP
    elif PREFETCH:
        p, s, p2, s2, x = _load_step(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, 0, stride_wn, stride_wsn,
                                     stride_wsk, BOTH, FMT, NS, EVEN_N, EVEN_K)
    for kw0 in tl.range(k_first, KW, STEP, num_stages=STAGES):
        if PREFETCH:
            # the last step re-reads itself when every step is full (no masks); else masks cut past KW
            if EVEN_K:
                kn = tl.multiple_of(tl.minimum(kw0 + STEP, KW - STEP), 4)  # 16-byte loads still
            else:
                kn = kw0 + STEP
            pn, sn, p2n, s2n, xn = _load_step(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, kn, stride_wn,
                                              stride_wsn, stride_wsk, BOTH, FMT, NS, EVEN_N, EVEN_K)
        else:
            p, s, p2, s2, x = _load_step(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, kw0, stride_wn,
                                         stride_wsn, stride_wsk, BOTH, FMT, NS, EVEN_N, EVEN_K)
        acc, acc2 = _step(acc, acc2, p, s, p2, s2, x, BOTH, FMT, PTX, NS, H2, BLOCK_N)
        if PREFETCH:
            p, s, p2, s2, x = pn, sn, p2n, s2n, xn
    post = 1.0 if FMT == 2 or H2 else 16384.0  # e2m1 decoded as v * 2^-14 (H2: the activations took 2^14)
    return tl.sum(acc, axis=1) * post, tl.sum(acc2, axis=1) * post


@triton.jit
def _gemv_4bit_kernel(
    a_ptr, w_ptr, ws_ptr, out_ptr, ids_ptr, topk_w_ptr, zero_ptr,
    num_rows, num_chunks, slots_per_chunk, top_k, num_experts, N, K, KW, zero_numel,
    stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_wsk, stride_om,
    GATED: tl.constexpr, ATOMIC: tl.constexpr, FMT: tl.constexpr, PTX: tl.constexpr,
    BLOCK_N: tl.constexpr, NS: tl.constexpr, ZBLOCK: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PREFETCH: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr, H2: tl.constexpr,
):
    """As `gemv._gemv_kernel`, with w_ptr the int32 words of the packed weights (KW words per row).
    PDL: stage 1 lets the next launch (stage 2) start at once; stage 2, launched as its programmatic dependent,
    requests its first weights before it waits for stage 1 (`_rows_dot` WAIT) and waits before it writes."""
    pid = tl.program_id(0)
    if PDL and GATED:
        gdc_launch_dependents()
    if ZBLOCK > 0:
        offs_z = pid * ZBLOCK + tl.arange(0, ZBLOCK)
        tl.store(zero_ptr + offs_z, tl.zeros((ZBLOCK,), dtype=tl.float32), mask=offs_z < zero_numel)
    rc = pid % (num_rows * num_chunks)
    r = rc // num_chunks
    chunk = rc % num_chunks
    pid_n = pid // (num_rows * num_chunks)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if GATED:
        expert = tl.load(ids_ptr + r).to(tl.int32)
        if (expert < 0) | (expert >= num_experts):
            return  # an edge of another rank: stage 2 skips it too
        token = r // top_k
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        ws_base = ws_ptr + expert.to(tl.int64) * stride_wse
        a_row = a_ptr + token.to(tl.int64) * stride_am
        acc, acc_up = _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, stride_wn, stride_wsn,
                                stride_wsk, True, FMT, PTX, BLOCK_N, NS, EVEN_N, EVEN_K, PREFETCH, STAGES, H2)
        h = acc / (1.0 + tl.exp(-acc)) * acc_up
        tl.store(out_ptr + r.to(tl.int64) * stride_om + offs_n, h.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        slot0 = chunk * slots_per_chunk
        for slot in range(slot0, tl.minimum(slot0 + slots_per_chunk, top_k)):
            edge = r * top_k + slot
            expert = tl.load(ids_ptr + edge).to(tl.int32)
            if (expert >= 0) & (expert < num_experts):
                weight = tl.load(topk_w_ptr + edge)
                w_base = w_ptr + expert.to(tl.int64) * stride_we
                ws_base = ws_ptr + expert.to(tl.int64) * stride_wse
                a_row = a_ptr + edge.to(tl.int64) * stride_am
                part, _ = _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KW, stride_wn, stride_wsn,
                                    stride_wsk, False, FMT, PTX, BLOCK_N, NS, EVEN_N, EVEN_K, PREFETCH, STAGES, H2,
                                    PDL)
                acc += weight * part
        if PDL:  # a program whose slots were all elsewhere has not waited yet (stage 1 zeroes `out`)
            gdc_wait()
        o_ptrs = out_ptr + r.to(tl.int64) * stride_om + offs_n
        if ATOMIC:
            tl.atomic_add(o_ptrs, acc, mask=n_mask, sem="relaxed")
        else:
            tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def launch_4bit(a, w, w_scale, out, ids, topk_w, *, num_rows, top_k, n, k, fmt, gated, cfg, chunks=1, zero=None):
    """`gemv._launch` for w4a16 / mxfp4 weights whose rows are whole words (`rows_are_words`); cfg holds
    BLOCK_N, NS (32-k slices per K step and row) and num_warps, and PDL: stage 1 triggers and stage 2 is launched
    as a programmatic dependent (where `platform.has_pdl`; correct either way, each stage keeps its own launch);
    PTX (default: `platform.has_ptx`) and H2: the packed-half products (`_slice_dot_h2`), for 16-bit activations
    only (float32 activations keep float32 products)."""
    pdl = bool(cfg.get("PDL", False)) and a.is_cuda and has_pdl(a.device.index or 0)
    code = FMT_CODE[fmt]
    ptx = cfg.get("PTX", has_ptx())
    h2 = cfg.get("H2", False) and a.dtype in (torch.float16, torch.bfloat16)  # float32 activations: float32 math
    bn, ns = cfg["BLOCK_N"], cfg["NS"]
    words = w.view(torch.int32)
    kw = words.shape[2]
    ns = min(ns, triton.next_power_of_2(triton.cdiv(kw, 4)))  # a K step no longer than the row (short K: TP slices)
    grid = (num_rows * chunks * triton.cdiv(n, bn),)
    zblock = 0 if zero is None else max(128, triton.next_power_of_2(triton.cdiv(zero.numel(), grid[0])))
    kernel = _gemv_4bit_kernel[grid](
        a, words, w_scale, out, ids, topk_w if topk_w is not None else a, zero if zero is not None else out,
        num_rows, chunks, triton.cdiv(top_k, chunks), top_k, w.shape[0], n, k, kw,
        0 if zero is None else zero.numel(),
        a.stride(0), words.stride(0), words.stride(1), w_scale.stride(0), w_scale.stride(1), w_scale.stride(2),
        out.stride(0),
        GATED=gated, ATOMIC=chunks > 1, FMT=code, PTX=ptx, BLOCK_N=bn, NS=ns, ZBLOCK=zblock,
        EVEN_N=n % bn == 0, EVEN_K=k % (ns * 32) == 0 and kw % (ns * 4) == 0, PREFETCH=cfg.get("PREFETCH", False),
        STAGES=1 if cfg.get("PREFETCH", False) else cfg.get("num_stages", 1), PDL=pdl, H2=h2,
        num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 1),
        **(dict(launch_pdl=True) if pdl and not gated else {}),
    )
    if RECORD_LAUNCHES:
        LAST_LAUNCH.update(gated=gated, grid=grid[0], num_warps=cfg["num_warps"], n_regs=getattr(kernel, "n_regs", None))
