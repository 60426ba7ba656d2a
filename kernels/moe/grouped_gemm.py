"""The two GEMM stages of the fused MoE, over the tile work list built by `align.moe_align`.

Stage 1 (`gate_up_swiglu`): for every edge j = token * top_k + slot routed to expert e,
    inter[j, n] = silu(x[token] . w13[e, n]) * (x[token] . w13[e, I + n])        n < I
with SwiGLU in the epilogue, so gate and up never reach HBM.
Stage 2 (`down_combine`): out[token, h] = sum_slot topk_weights[token, slot] * (inter[j] . w2[e, h]),
with the top-k weighted combine in the epilogue (fp32 atomics for top-k > 1, plain stores for top-1).

One program computes a BLOCK_M x BLOCK_N tile of one expert; tiles past `num_padded` exit at once, so the
grid depends on the shapes alone (graph capture). With `align` = (topk_ids flattened, None, None) every edge
is its own tile (row 0; the M=1 mode of `config.DOT_M1_TILES`, no align launch). Optional: stage 1 zeroes a
float32 buffer (stage 2's accumulator) and, on the M=1 tiles, writes the intermediate quantized to fp8 as well
(`quant_out`: the last program to finish a 128-column group quantizes it, counted by an atomic), stage 2 splits K
over SPLIT_K programs, a launch covers only the experts of a chunk (the dequant path's workspace), and a launch
computes only align's tiles with an edge in their upper half, or only the lower halves of the others
(`TileRows`, `config.FOUR_BIT_HALF_TILES`), and stage 1 at M=1 can start as a programmatic dependent of x's
quantization (`config.DOT_M1_PDL`). Stage 1 can multiply gate and up in one dot (`GU_ONE_DOT`: the
weight rows interleaved gate, up, gate, ..., the accumulator's column pairs split after the loop; the 4-bit joined
tiles), and at M=1 prefetch the first of stage 2's weights into L2 after its K loop (`_prefetch_next_stage`). The K
loop is software-pipelined (`num_stages`): the next weight tile is loaded while the current one is multiplied; where
K is whole K steps (`EVEN_K`) the loads keep only their row masks.

The weight format is a compile-time constant (`KernelFormat`, from `kernel_format`). fp8 runs w8a8 (activations
quantized per token group, fp8 products) by default; the w8a16 mode (weights upcast in registers, activations kept
in 16 bits) measured slower on the H200, where e4m3 -> bf16 takes several instructions per element. The 4-bit
formats decode each K tile's low nibbles (even k) and high nibbles (odd k) as two halves. On narrow tiles the
activations, one pipelined load, are split into the matching halves in registers (two dots per step); on tiles of
`config.JOIN_K_MIN_BLOCK_M` rows or more (`JOIN_K`) the decoded halves are interleaved into one K tile instead, so
the activations feed the MMA from shared memory, and the group scales are applied inside the decode (int4: the scale
rounded to the 16-bit dtype, one paired fma per two weights; mxfp4: the row's scale bytes of 128 k as one 32-bit
word where K is whole words, `mx_word_scales_supported`). int4 decodes by a magic-number or (PTX where
`platform.has_ptx`, `dot_decode.py`); mxfp4 uses `tl.dot_scaled` where the hardware scales natively (gfx950), with
the activations quantized to MXFP8 (`act_quant_mx.py`) so both operands feed the scaled f8f6f4 MFMA, and in-register
dequantization elsewhere. mxfp4 on tiles of up to 32 rows (`SWAP_AB`, from `config.stage_config`) swaps the operands,
out^T = W @ x^T: the decoded weights become wgmma's register operand and the row's e8m0 scales one 32-bit load per
K step applied inside the decode (`_dot_w_mx_swapped`).
"""

from __future__ import annotations

import enum

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.act_quant import quantize_groups
from zoe_kernels.moe.dot_decode import (
    MX_BF16_SHIFT,
    _e2m1_scaled_halves,
    _int4_halves,
    _int4_scaled_halves,
    _int4_scaled_words,
    _int4_words_to_tile,
)
from zoe_kernels.moe.formats import FP8_BLOCK, INT4_GROUP, MX_GROUP
from zoe_kernels.platform import fp8_max, gdc_wait, has_ptx, interpreting

FP8_GROUP = FP8_BLOCK  # the fp8 activations' quantization group along K


class KernelFormat(enum.IntEnum):
    """The weight format the stage kernel is compiled for (its FMT constexpr; the kernel compares FMT with the
    constexpr copies below, which Triton code can read)."""

    FLOAT = 0  # weights in the activations' dtype
    FP8_W8A8 = 1  # fp8 weights and activations quantized per token group, fp8 products, both scales on the result
    INT4 = 2  # int4 with group scales of 128
    MXFP4 = 3  # e2m1 with e8m0 scales per 32, dequantized in registers
    FP8_W8A16 = 4  # fp8 weights upcast in registers, activations kept in 16 bits
    MXFP4_NATIVE = 5  # e2m1 weights and MXFP8 activations through `tl.dot_scaled` (hardware-scaled MMA)


class TileRows(enum.IntEnum):
    """Which of align's tiles a launch computes (its TILE_ROWS constexpr). A tile whose upper half holds no edge
    (an expert's last tile, at most half full) can run as a tile of half the height: `fused_moe` then launches a
    stage twice, UPPER_USED at BLOCK_M rows and LOWER_HALF at BLOCK_M / 2 over the same align (config.HALF_TILES)."""

    ALL = 0  # every tile, BLOCK_M rows
    UPPER_USED = 1  # the tiles with an edge in their upper half, BLOCK_M rows
    LOWER_HALF = 2  # the other tiles, their lower half only: BLOCK_M rows of tiles of 2 BLOCK_M


_ALL_TILES = tl.constexpr(int(TileRows.ALL))
_LOWER_HALF = tl.constexpr(int(TileRows.LOWER_HALF))
_FLOAT = tl.constexpr(int(KernelFormat.FLOAT))
_FP8_W8A8 = tl.constexpr(int(KernelFormat.FP8_W8A8))
_INT4 = tl.constexpr(int(KernelFormat.INT4))
_MXFP4 = tl.constexpr(int(KernelFormat.MXFP4))
_FP8_W8A16 = tl.constexpr(int(KernelFormat.FP8_W8A16))
_MXFP4_NATIVE = tl.constexpr(int(KernelFormat.MXFP4_NATIVE))


@triton.jit
def _load_a(a_ptr, as_ptr, rows, row_mask, k0, K, stride_am, stride_ak, stride_asm, stride_ask,
            FMT: tl.constexpr, BLOCK_K: tl.constexpr, FP8_GROUP: tl.constexpr, EVEN_K: tl.constexpr):
    """The A tile of one K step and, for fp8 w8a8, its activation scale per row (EVEN_K: every K step whole, no
    K mask)."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:  # the row mask alone (tl.load broadcasts it): no per-step compare and select
        mask = row_mask[:, None]
    else:
        mask = row_mask[:, None] & (offs_k[None, :] < K)
    a = tl.load(a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak, mask=mask, other=0.0)
    if FMT == _FP8_W8A8:
        a_s = tl.load(as_ptr + rows * stride_asm + (k0 // FP8_GROUP) * stride_ask, mask=row_mask, other=0.0)
    else:
        a_s = tl.zeros_like(rows).to(tl.float32)
    return a, a_s


@triton.jit
def _int4_scales(ws_base, wrows, wrow_mask, k0, k_hi, stride_wsn, stride_wsk, INT4_GROUP: tl.constexpr):
    """The int4 group scales of the K step at k0 as float32 (zeros past k_hi: the prefetch after the last step)."""
    in_k = (wrows * 0 + k0) < k_hi  # a tensor, as the interpreter's masks must be
    w_s = tl.load(ws_base + wrows * stride_wsn + (k0 // INT4_GROUP) * stride_wsk, mask=wrow_mask & in_k, other=0.0)
    return w_s.to(tl.float32)


@triton.jit
def _dot_w(acc, a, a2, w_base, ws_base, ws_pre, wrows, wrow_mask, k0, K, KP,
           stride_wn, stride_wk, stride_wsn, stride_wsk,
           FMT: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
           FP8_GROUP: tl.constexpr, INT4_GROUP: tl.constexpr, MX_GROUP: tl.constexpr, PTX: tl.constexpr,
           JOIN_K: tl.constexpr, MX_WORD: tl.constexpr, MX_BF16_SHIFT: tl.constexpr, EVEN_K: tl.constexpr):
    """acc += A @ W[wrows, k0:k0+BLOCK_K].T for the weight format FMT; a2 is the activation scale (fp8 w8a8)
    or, for the 4-bit formats (int4, mxfp4) without JOIN_K, the odd-K half of A (`a` is then the even-K half). With
    JOIN_K the decoded even-k and odd-k weight halves are interleaved into one [BLOCK_K, BLOCK_N] tile and `a` is
    the whole A tile (one dot whose A operand stays in shared memory); ws_pre the int4 scales of this K step
    (int4, loaded ahead by the caller), applied in the decode (`_int4_scaled_halves`). mxfp4 with MX_WORD (JOIN_K
    where `mx_word_scales_supported`) takes the row's scale bytes as one 32-bit word per 128 k, applied in the
    decode (`_e2m1_scaled_halves`; bf16 weights then carry 2^-MX_BF16_SHIFT, which the caller takes back). KP is the packed row length (bytes) of the 4-bit formats: their
    masks use it, not K, so that the JIT's divisibility of KP keeps the byte loads 16 bytes wide (and
    pipelined: cp.async), which (K + 1) // 2 did not (one byte per load). EVEN_K: every K step is whole (K a
    multiple of BLOCK_K), so the weight loads keep only the row mask."""
    if FMT == _FLOAT:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = wrow_mask[None, :] if EVEN_K else wrow_mask[None, :] & (offs_k[:, None] < K)
        w = tl.load(w_base + wrows[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=kmask, other=0.0)
        acc = tl.dot(a, w, acc)
    elif FMT == _FP8_W8A8 or FMT == _FP8_W8A16:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = wrow_mask[None, :] if EVEN_K else wrow_mask[None, :] & (offs_k[:, None] < K)
        w = tl.load(w_base + wrows[None, :] * stride_wn + offs_k[:, None] * stride_wk, mask=kmask, other=0.0)
        w_s = tl.load(ws_base + (wrows // FP8_GROUP) * stride_wsn + (k0 // FP8_GROUP) * stride_wsk,
                      mask=wrow_mask, other=0.0)
        if FMT == _FP8_W8A8:  # w8a8: fp8 x fp8 products, both scales on the result
            acc += tl.dot(a, w) * a2[:, None] * w_s[None, :]
        else:  # w8a16: the weight tile is upcast in registers, its block scale goes on the result
            acc += tl.dot(a, w.to(a.dtype)) * w_s[None, :]
    elif FMT == _INT4:
        # int4: low nibbles are the even k, high nibbles the odd k; two dots over the halves need no
        # interleave. The group scale (one per column and step) goes on the result.
        offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kmask = wrow_mask[None, :] if EVEN_K else wrow_mask[None, :] & (offs_kp[:, None] < KP)
        p = tl.load(w_base + wrows[None, :] * stride_wn + offs_kp[:, None] * stride_wk,
                    mask=kmask)  # zero fill: cp.async, no select
        if JOIN_K and PTX and a.dtype != tl.float32:  # each byte's two weights decoded into one word
            acc = tl.dot(a, _int4_words_to_tile(_int4_scaled_words(p, ws_pre[None, :], a.dtype), a.dtype, BLOCK_K,
                                                BLOCK_N), acc)
        elif JOIN_K:  # the step's group scale (a K step lies in one group) on the weights: one MMA chain into acc
            lo, hi = _int4_scaled_halves(p, tl.broadcast_to(ws_pre[None, :], p.shape), a.dtype, PTX)
            acc = tl.dot(a, _join_k(lo, hi, BLOCK_K, BLOCK_N), acc)
        else:
            lo, hi = _int4_halves(p, a.dtype, PTX)
            d = tl.dot(a, lo)
            d = tl.dot(a2, hi, d)
            acc += d * ws_pre[None, :]
    elif MX_WORD:  # mxfp4, JOIN_K: rows of packed bytes, the step's scales one word per row
        offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kmask = wrow_mask[:, None] if EVEN_K else wrow_mask[:, None] & (offs_kp[None, :] < KP)
        p = tl.load(w_base + wrows[:, None] * stride_wn + offs_kp[None, :] * stride_wk,
                    mask=kmask)  # zero fill: cp.async, no select
        sw = tl.load((ws_base + wrows * stride_wsn + k0 // (4 * MX_GROUP) * 4).to(tl.pointer_type(tl.int32)),
                     mask=wrow_mask, other=0)
        lo, hi = _e2m1_scaled_halves(p, sw, a.dtype, BLOCK_K, MX_GROUP, MX_BF16_SHIFT, PTX,
                                     k0 % (4 * MX_GROUP) // MX_GROUP)
        acc = tl.dot(a, tl.trans(tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))), acc)
    else:
        # mxfp4 without native scaled MMA: an e2m1 nibble s|e1 e0|m placed at fp16 bits 15|11 10|9 is the
        # fp16 number v * 2^-14, subnormals included; the e8m0 byte b becomes the float 2^(b - 127 + 14).
        offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        kmask = wrow_mask[None, :] & (offs_kp[:, None] < KP)
        p = tl.load(w_base + wrows[None, :] * stride_wn + offs_kp[:, None] * stride_wk, mask=kmask, other=0)
        sb = tl.load(ws_base + wrows[None, :] * stride_wsn + (offs_kp // (MX_GROUP // 2))[:, None] * stride_wsk,
                     mask=kmask, other=127)
        scale = ((sb.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)
        p16 = p.to(tl.uint16)
        lo = (((p16 & 0x7) << 9) | ((p16 & 0x8) << 12)).to(tl.uint16).to(tl.float16, bitcast=True)
        hi = (((p16 & 0x70) << 5) | ((p16 & 0x80) << 8)).to(tl.uint16).to(tl.float16, bitcast=True)
        lo = (lo.to(tl.float32) * scale).to(a.dtype)
        hi = (hi.to(tl.float32) * scale).to(a.dtype)
        if JOIN_K:
            acc = tl.dot(a, _join_k(lo, hi, BLOCK_K, BLOCK_N), acc)
        else:
            acc = tl.dot(a, lo, acc)
            acc = tl.dot(a2, hi, acc)
    return acc


@triton.jit
def _join_k(lo, hi, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_K/2, BLOCK_N] even-k and odd-k weight halves -> the [BLOCK_K, BLOCK_N] tile, k = 2 kp + (0 | 1)."""
    return tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), (BLOCK_K, BLOCK_N))


@triton.jit
def _dot_w_mx_swapped(acc_t, a_t, a2_t, w_base, ws_base, wrows, wrow_mask, k0, KP, stride_wn, stride_wk, stride_wsn,
                      BLOCK_K: tl.constexpr, MX_GROUP: tl.constexpr, MX_BF16_SHIFT: tl.constexpr, PTX: tl.constexpr):
    """mxfp4 with the operands swapped: acc_t [BLOCK_N, BLOCK_M] += W[wrows, k0:k0+BLOCK_K] @ A^T, with a_t, a2_t
    [BLOCK_K/2, BLOCK_M] the even-k and odd-k halves of A transposed. The decoded weights are the MMA's first
    operand (wgmma where BLOCK_N >= 64) and the activation tile the second; the row's 4 e8m0 bytes of the K step
    are one int32 load (the caller guarantees 4-byte aligned rows and K % BLOCK_K == 0), applied in the decode."""
    offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    p = tl.load(w_base + wrows[:, None] * stride_wn + offs_kp[None, :] * stride_wk,
                mask=wrow_mask[:, None] & (offs_kp[None, :] < KP))  # zero fill: cp.async, no select
    sw = tl.load((ws_base + wrows * stride_wsn + k0 // MX_GROUP).to(tl.pointer_type(tl.int32)), mask=wrow_mask,
                 other=0)
    lo, hi = _e2m1_scaled_halves(p, sw, a_t.dtype, BLOCK_K, MX_GROUP, MX_BF16_SHIFT, PTX)
    acc_t = tl.dot(lo, a_t, acc_t)
    return tl.dot(hi, a2_t, acc_t)


@triton.jit
def _dot_w_mx_native(acc, a, a_s, w_base, ws_base, wrows, wrow_mask, k0, K, stride_wn, stride_wk, stride_wsn,
                     stride_wsk, A_FMT: tl.constexpr, BLOCK_K: tl.constexpr, MX_GROUP: tl.constexpr):
    """mxfp4 through `tl.dot_scaled` (native scaled MFMA on gfx950); `a` is the whole K tile (e4m3) and `a_s` its
    e8m0 scales [BLOCK_M, BLOCK_K / MX_GROUP]."""
    offs_kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    p = tl.load(w_base + wrows[None, :] * stride_wn + offs_kp[:, None] * stride_wk,
                mask=wrow_mask[None, :] & (offs_kp[:, None] < (K + 1) // 2), other=0)
    offs_ks = k0 // MX_GROUP + tl.arange(0, BLOCK_K // MX_GROUP)
    w_s = tl.load(ws_base + wrows[:, None] * stride_wsn + offs_ks[None, :] * stride_wsk,
                  mask=wrow_mask[:, None] & (offs_ks[None, :] < (K + MX_GROUP - 1) // MX_GROUP), other=127)
    return tl.dot_scaled(a, a_s, A_FMT, p, w_s, "e2m1", acc)


@triton.jit
def _prefetch_l2(ptrs):
    """`prefetch.global.L2::evict_last` of the 128-byte lines at `ptrs` (PTX targets only): the lines are fetched into
    L2 with the priority to stay, nothing is returned to the thread."""
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_next_stage(pf_ptr, ids_ptr, p, slice_bytes, total_bytes, expert_bytes, stride_pe, num_edges,
                         num_experts, PF_LINES: tl.constexpr):
    """Stage 1 at M=1, after its K loop: program p prefetches into L2 its slice of the first `total_bytes` of stage
    2's weights in the order stage 2 reads them (edge 0's expert, edge 1's, ...; `expert_bytes` contiguous per
    expert), so that the stage's tail, when fewer programs stream, fetches bytes stage 2 would read from HBM."""
    line = tl.arange(0, PF_LINES)
    offs = p.to(tl.int64) * slice_bytes + line * 128
    edge = offs // expert_bytes
    valid = (line * 128 < slice_bytes) & (offs < total_bytes) & (edge < num_edges)
    expert = tl.load(ids_ptr + edge, mask=valid, other=0).to(tl.int64)
    valid = valid & (expert >= 0) & (expert < num_experts)
    _prefetch_l2(tl.where(valid, pf_ptr + expert * stride_pe + offs % expert_bytes, pf_ptr))


@triton.jit
def _last_arrival(count_ptr, idx, arrivals):
    """Whether this program is the last of `arrivals` programs to reach counter `idx` (int32, zeroed before the
    launch). The barrier puts every thread's writes before the counter's release; the acquire puts the reads that
    follow a True after every earlier arrival's writes."""
    tl.debug_barrier()
    return tl.atomic_add(count_ptr + idx, 1, sem="acq_rel", scope="gpu") == arrivals - 1


@triton.jit
def _quantize_when_last(inter_ptr, q_ptr, qs_ptr, count_ptr, row, group, groups, arrivals, N, stride_im, stride_in,
                        stride_qm, stride_qsm, FP8_GROUP: tl.constexpr, FP8_MAX: tl.constexpr,
                        ROUND_E4M3: tl.constexpr):
    """Stage 1 at M=1: the last program to finish its columns of (row, group) reads the group's 16-bit values back
    (from L2: `.cg`) and writes them quantized to fp8 with their scale (`act_quant.quantize_groups`), so stage 2
    needs no quantization launch."""
    if _last_arrival(count_ptr, row * groups + group, arrivals):
        offs = group * FP8_GROUP + tl.arange(0, FP8_GROUP)
        mask = offs < N
        v = tl.load(inter_ptr + row * stride_im + offs * stride_in, mask=mask, other=0.0, cache_modifier=".cg")
        q, s = quantize_groups(v.to(tl.float32)[None, :], FP8_MAX, ROUND_E4M3)
        tl.store(q_ptr + row * stride_qm + offs[None, :], q.to(q_ptr.dtype.element_ty), mask=mask[None, :])
        tl.store(qs_ptr + row * stride_qsm + group + tl.arange(0, 1), s)


@triton.jit
def _expert_gemm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, topk_w_ptr,
    sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    num_edges, top_k, N, K, KP,
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_we, stride_wn, stride_wk, stride_wse, stride_wsn, stride_wsk,
    stride_om, stride_on,
    zero_ptr, zero_numel, expert_lo, expert_hi,
    count_ptr, q_ptr, qs_ptr, stride_qm, stride_qsm,
    pf_ptr, pf_slice, pf_total, pf_expert_bytes, stride_pe,
    GATED: tl.constexpr, ATOMIC: tl.constexpr, FMT: tl.constexpr, A_FMT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP8_GROUP: tl.constexpr, INT4_GROUP: tl.constexpr, MX_GROUP: tl.constexpr,
    EDGE_TILES: tl.constexpr,
    SPLIT_K: tl.constexpr, ZBLOCK: tl.constexpr, PTX: tl.constexpr, JOIN_K: tl.constexpr,
    SWAP_AB: tl.constexpr, MX_WORD: tl.constexpr, MX_BF16_SHIFT: tl.constexpr,
    QUANT_OUT: tl.constexpr, FP8_MAX: tl.constexpr, ROUND_E4M3: tl.constexpr,
    TILE_ROWS: tl.constexpr, ALIGN_M: tl.constexpr, EVEN_K: tl.constexpr, GU_ONE_DOT: tl.constexpr,
    PF_LINES: tl.constexpr, PDL_WAIT: tl.constexpr,
):
    pid = tl.program_id(0)
    if ZBLOCK > 0:  # stage 1 zeroes stage 2's float32 accumulator (saves a memset launch)
        offs_z = pid * ZBLOCK + tl.arange(0, ZBLOCK)
        tl.store(zero_ptr + offs_z, tl.zeros([ZBLOCK], dtype=tl.float32), mask=offs_z < zero_numel)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_k = pid % SPLIT_K
    pid_m = pid // SPLIT_K // num_n
    pid_n = pid // SPLIT_K % num_n
    if EDGE_TILES:
        # one tile per edge (row 0 of the tile), its expert read from topk_ids itself: no align launch
        expert = tl.load(sorted_ids_ptr + pid_m).to(tl.int64)
        if (expert < expert_lo) | (expert >= expert_hi):
            return
        offs_m = tl.arange(0, BLOCK_M)
        row_mask = offs_m == 0
        edge = tl.where(row_mask, pid_m, num_edges)
    else:
        if pid_m * ALIGN_M >= tl.load(num_padded_ptr):
            return
        expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
        if (expert < expert_lo) | (expert >= expert_hi):  # another chunk's expert (or past the end: -1)
            return
        if TILE_ROWS != _ALL_TILES:  # an expert's edges fill its tiles from the top: the upper half's first row
            upper_used = tl.load(sorted_ids_ptr + pid_m * ALIGN_M + ALIGN_M // 2) < num_edges
            if TILE_ROWS == _LOWER_HALF:
                if upper_used:
                    return
            elif not upper_used:
                return
        offs_m = pid_m * ALIGN_M + tl.arange(0, BLOCK_M)
        edge = tl.load(sorted_ids_ptr + offs_m)
        row_mask = edge < num_edges
    token = (edge // top_k).to(tl.int64)
    if GATED:
        a_rows = token  # stage 1 reads the token's hidden state
    else:
        a_rows = edge.to(tl.int64)  # stage 2 reads the edge's intermediate row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w_base = w_ptr + (expert - expert_lo) * stride_we
    ws_base = ws_ptr + (expert - expert_lo) * stride_wse
    # The weight rows of one dot: BLOCK_N of them, or with GU_ONE_DOT (stage 1) gate and up rows interleaved
    # (gate n, up n, gate n+1, ...), 2 BLOCK_N columns in one accumulator whose column pairs split into gate and up
    # after the loop: one MMA per K step, twice as wide, instead of two.
    if GU_ONE_DOT:
        j = tl.arange(0, 2 * BLOCK_N)
        wrows = pid_n * BLOCK_N + j // 2 + (j % 2) * N
        wrow_mask = pid_n * BLOCK_N + j // 2 < N
    else:
        wrows = offs_n
        wrow_mask = n_mask
    WN: tl.constexpr = 2 * BLOCK_N if GU_ONE_DOT else BLOCK_N
    SEPARATE_UP: tl.constexpr = GATED and not GU_ONE_DOT

    if SWAP_AB:  # mxfp4 with the weights as the MMA's first operand: acc^T = W @ A^T
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, WN), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SPLIT_K == 1:  # the whole K (the common case keeps its bounds simple)
        k_lo = 0
        k_hi = K
    else:  # split-K: this program's share of K, whole K steps
        k_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_lo = pid_k * k_split
        k_hi = tl.minimum(K, k_lo + k_split)
    if PDL_WAIT:  # a programmatic dependent of the launch that writes A: A is read from here on
        gdc_wait()
    # int4 group scales (one per column and K step): loaded one K step ahead, since Triton's pipeliner does not
    # pipeline these loads (they feed the result, not the dot) and the loop would wait on each
    ws_gate = tl.zeros((WN,), dtype=tl.float32)
    ws_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if FMT == _INT4:
        ws_gate = _int4_scales(ws_base, wrows, wrow_mask, k_lo, k_hi, stride_wsn, stride_wsk, INT4_GROUP)
        if SEPARATE_UP:
            ws_up = _int4_scales(ws_base, N + offs_n, n_mask, k_lo, k_hi, stride_wsn, stride_wsk, INT4_GROUP)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ws_g = ws_gate
        ws_u = ws_up
        if FMT == _INT4:
            ws_gate = _int4_scales(ws_base, wrows, wrow_mask, k0 + BLOCK_K, k_hi, stride_wsn, stride_wsk,
                                   INT4_GROUP)
            if SEPARATE_UP:
                ws_up = _int4_scales(ws_base, N + offs_n, n_mask, k0 + BLOCK_K, k_hi, stride_wsn, stride_wsk,
                                     INT4_GROUP)
        if FMT == _MXFP4_NATIVE:
            a, _ = _load_a(a_ptr, as_ptr, a_rows, row_mask, k0, K, stride_am, stride_ak, stride_asm,
                           stride_ask, _FLOAT, BLOCK_K, FP8_GROUP, EVEN_K)
            offs_as = k0 // MX_GROUP + tl.arange(0, BLOCK_K // MX_GROUP)
            a_s = tl.load(as_ptr + a_rows[:, None] * stride_asm + offs_as[None, :] * stride_ask,
                          mask=row_mask[:, None] & (offs_as[None, :] < (K + MX_GROUP - 1) // MX_GROUP), other=127)
            acc = _dot_w_mx_native(acc, a, a_s, w_base, ws_base, offs_n, n_mask, k0, K, stride_wn, stride_wk,
                                   stride_wsn, stride_wsk, A_FMT, BLOCK_K, MX_GROUP)
            if GATED:
                acc_up = _dot_w_mx_native(acc_up, a, a_s, w_base, ws_base, N + offs_n, n_mask, k0, K, stride_wn,
                                          stride_wk, stride_wsn, stride_wsk, A_FMT, BLOCK_K, MX_GROUP)
        else:
            if FMT == _INT4 or FMT == _MXFP4:
                # one contiguous (cp.async-pipelined) load; without JOIN_K split into the even-k and odd-k halves
                a, a2 = _load_a(a_ptr, as_ptr, a_rows, row_mask, k0, K, stride_am, stride_ak, stride_asm,
                                stride_ask, _FLOAT, BLOCK_K, FP8_GROUP, EVEN_K)
                if not JOIN_K:
                    a, a2 = tl.split(tl.reshape(a, (BLOCK_M, BLOCK_K // 2, 2)))
            else:
                a, a2 = _load_a(a_ptr, as_ptr, a_rows, row_mask, k0, K, stride_am, stride_ak, stride_asm,
                                stride_ask, FMT, BLOCK_K, FP8_GROUP, EVEN_K)
            if SWAP_AB:
                a_t = tl.trans(a)
                a2_t = tl.trans(a2)
                acc = _dot_w_mx_swapped(acc, a_t, a2_t, w_base, ws_base, offs_n, n_mask, k0, KP, stride_wn,
                                        stride_wk, stride_wsn, BLOCK_K, MX_GROUP, MX_BF16_SHIFT, PTX)
                if GATED:
                    acc_up = _dot_w_mx_swapped(acc_up, a_t, a2_t, w_base, ws_base, N + offs_n, n_mask, k0, KP,
                                               stride_wn, stride_wk, stride_wsn, BLOCK_K, MX_GROUP, MX_BF16_SHIFT, PTX)
            else:
                acc = _dot_w(acc, a, a2, w_base, ws_base, ws_g, wrows, wrow_mask, k0, K, KP, stride_wn, stride_wk,
                             stride_wsn, stride_wsk, FMT, BLOCK_K, WN, FP8_GROUP, INT4_GROUP, MX_GROUP, PTX,
                             JOIN_K, MX_WORD, MX_BF16_SHIFT, EVEN_K)
                if SEPARATE_UP:
                    acc_up = _dot_w(acc_up, a, a2, w_base, ws_base, ws_u, N + offs_n, n_mask, k0, K, KP, stride_wn,
                                    stride_wk, stride_wsn, stride_wsk, FMT, BLOCK_K, BLOCK_N, FP8_GROUP, INT4_GROUP,
                                    MX_GROUP, PTX, JOIN_K, MX_WORD, MX_BF16_SHIFT, EVEN_K)

    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    if PF_LINES > 0:  # stage 1 at M=1: its slice of stage 2's weights into L2 (`_prefetch_next_stage`)
        _prefetch_next_stage(pf_ptr, sorted_ids_ptr, pid_m * num_n + pid_n, pf_slice, pf_total, pf_expert_bytes,
                             stride_pe, num_edges, expert_hi, PF_LINES)
    if GU_ONE_DOT:  # columns (gate n, up n) side by side: a thread holds both (the MMA layout's column pairs)
        acc, acc_up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
    if SWAP_AB or MX_WORD:
        if MX_BF16_SHIFT > 0:  # the bf16 decode's 2^-MX_BF16_SHIFT (exact: a power of two)
            acc = acc * (2.0 ** MX_BF16_SHIFT)
            acc_up = acc_up * (2.0 ** MX_BF16_SHIFT)
    out_mask = row_mask[:, None] & n_mask[None, :]
    if GATED:
        h = acc / (1.0 + tl.exp(-acc)) * acc_up
        o_ptrs = out_ptr + edge.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(o_ptrs, h.to(out_ptr.dtype.element_ty), mask=out_mask)
        if QUANT_OUT:  # the last of the programs of this edge's 128-column group quantizes the group
            group = pid_n * BLOCK_N // FP8_GROUP
            arrivals = tl.cdiv(tl.minimum(FP8_GROUP, N - group * FP8_GROUP), BLOCK_N)
            _quantize_when_last(out_ptr, q_ptr, qs_ptr, count_ptr, pid_m, group, tl.cdiv(N, FP8_GROUP), arrivals,
                                N, stride_om, stride_on, stride_qm, stride_qsm, FP8_GROUP, FP8_MAX, ROUND_E4M3)
    else:
        weight = tl.load(topk_w_ptr + edge, mask=row_mask, other=0.0)
        y = acc * weight[:, None]
        o_ptrs = out_ptr + token[:, None] * stride_om + offs_n[None, :] * stride_on
        if ATOMIC:
            tl.atomic_add(o_ptrs, y, mask=out_mask, sem="relaxed")
        else:
            tl.store(o_ptrs, y.to(out_ptr.dtype.element_ty), mask=out_mask)


def kernel_format(fmt: str, *, fp8_act_quant: bool, mx_native: bool) -> KernelFormat:
    """The kernel's weight format for a MoE format (`formats.FORMATS`) and mode."""
    if fmt == "bf16":
        return KernelFormat.FLOAT
    if fmt == "fp8":
        return KernelFormat.FP8_W8A8 if fp8_act_quant else KernelFormat.FP8_W8A16
    if fmt == "w4a16":
        return KernelFormat.INT4
    if fmt == "mxfp4":
        return KernelFormat.MXFP4_NATIVE if mx_native else KernelFormat.MXFP4
    raise ValueError(f"unknown MoE format {fmt!r}")


def _a_fmt(dtype: torch.dtype) -> str:
    """`tl.dot_scaled`'s name for the activations' element type (read by the MXFP4_NATIVE format only)."""
    if dtype == torch.float8_e4m3fn:
        return "e4m3"
    return "bf16" if dtype == torch.bfloat16 else "fp16"


def mx_word_scales_supported(w_scale: torch.Tensor, k: int) -> bool:
    """Whether mxfp4 can take its scales as words (`_dot_w_mx_swapped`, `_dot_w` MX_WORD): one 4-byte aligned
    int32 per row and 128 k, so K must be whole words of 4 scale groups and the scale rows word-aligned (strides
    and base); every model shape is. Elsewhere the launch keeps the per-byte decode."""
    return (k % (4 * MX_GROUP) == 0 and w_scale.stride(2) == 1 and w_scale.stride(1) % 4 == 0
            and w_scale.stride(0) % 4 == 0 and w_scale.data_ptr() % 4 == 0)


def mx_swap_supported(w_scale: torch.Tensor, k: int, block_k: int) -> bool:
    """Whether mxfp4 can run swapped (`_dot_w_mx_swapped`): word scales (`mx_word_scales_supported`) and K steps
    of exactly one word (BLOCK_K = 4 * MX_GROUP, the tiles config gives mxfp4)."""
    return block_k == 4 * MX_GROUP and mx_word_scales_supported(w_scale, k)


def _launch(a, a_scale, w, w_scale, out, topk_weights, align, *, num_edges, top_k, n, k, kfmt, gated,
            atomic, cfg, zero=None, experts=None, quant_out=None, prefetch=None, pdl=False):
    sorted_ids, block_expert, num_padded = align
    edge_tiles = block_expert is None  # align = (topk_ids flattened, None, None): one tile per edge
    split_k = cfg.get("SPLIT_K", 1)
    if quant_out is not None and not (edge_tiles and experts is None):
        raise ValueError("the quantizing epilogue runs on the M=1 tiles (one per edge) only")
    if quant_out is not None and (not gated or FP8_GROUP % cfg["BLOCK_N"]):
        raise ValueError(f"the quantizing epilogue is stage 1's, with BLOCK_N dividing {FP8_GROUP}")
    if kfmt == KernelFormat.FP8_W8A8 and a_scale is None:
        raise ValueError("fp8 w8a8 takes the activations quantized (`act_quant.quantize_act_fp8`) with their scales")
    if kfmt == KernelFormat.MXFP4_NATIVE and (a_scale is None or a.dtype != torch.float8_e4m3fn):
        raise ValueError("native mxfp4 takes MXFP8 activations (`act_quant_mx.quantize_act_mxfp8`) with their scales")
    if split_k > 1 and not atomic:
        raise ValueError("split-K adds partial sums with atomics: stage 2 with top_k > 1 only")
    a_scale = a_scale if a_scale is not None else a  # read only by fp8 w8a8 and native mxfp4
    w_scale = w_scale if w_scale is not None else w  # unused by the float format
    topk_w = topk_weights if topk_weights is not None else a
    tile_rows = cfg.get("TILE_ROWS", TileRows.ALL)  # ALIGN_M: the rows of align's tiles
    if tile_rows != TileRows.ALL and edge_tiles:
        raise ValueError("TILE_ROWS selects among align's tiles: not with one tile per edge")
    tiles_m = num_edges if edge_tiles else block_expert.numel()
    programs = tiles_m * triton.cdiv(n, cfg["BLOCK_N"]) * split_k
    zblock = 0 if zero is None else max(16, triton.next_power_of_2(triton.cdiv(zero.numel(), max(1, programs))))
    scaled_a = kfmt in (KernelFormat.FP8_W8A8, KernelFormat.MXFP4_NATIVE)
    a_s_strides = (a_scale.stride(0), a_scale.stride(1)) if scaled_a else (0, 0)
    ws_strides = (w_scale.stride(0), w_scale.stride(1), w_scale.stride(2)) if w_scale.dim() == 3 else (0, 0, 0)
    swap = (bool(cfg.get("SWAP_AB", False)) and kfmt == KernelFormat.MXFP4
            and mx_swap_supported(w_scale, k, cfg["BLOCK_K"]))
    mx_word = (not swap and kfmt == KernelFormat.MXFP4 and bool(cfg.get("JOIN_K", False))
               and mx_word_scales_supported(w_scale, k))
    counts = None
    q_strides = (0, 0)
    if quant_out is not None:  # (fp8 [edges, n], float32 scales [edges, ceil(n/128)], int32 counters, zeroed)
        *quant_out, counts = quant_out
        q_strides = (quant_out[0].stride(0), quant_out[1].stride(0))
    pf_args, pf_lines = (out, 0, 0, 1, 0), 0
    if prefetch is not None:  # (stage 2's weights [E, H, I'] contiguous, bytes to prefetch) for the M=1 tiles
        pw, nbytes = prefetch
        if not (edge_tiles and gated and pw.is_contiguous()):
            raise ValueError("the L2 prefetch of stage 2's weights runs in stage 1's M=1 tiles, contiguous weights")
        pw = pw.view(torch.uint8)  # byte addresses
        expert_bytes = pw[0].numel()
        total = min(nbytes, num_edges * expert_bytes)
        slice_bytes = triton.cdiv(triton.cdiv(total, programs), 128) * 128
        pf_lines = triton.next_power_of_2(max(1, slice_bytes // 128)) if total > 0 else 0
        pf_args = (pw, slice_bytes, total, expert_bytes, pw.stride(0))
    _expert_gemm_kernel[(programs,)](
        a, a_scale, w, w_scale, out, topk_w,
        sorted_ids, sorted_ids if edge_tiles else block_expert, sorted_ids if edge_tiles else num_padded,
        num_edges, top_k, n, k, w.shape[2],
        a.stride(0), a.stride(1), *a_s_strides,
        w.stride(0), w.stride(1), w.stride(2), *ws_strides,
        out.stride(0), out.stride(1),
        zero if zero is not None else out, 0 if zero is None else zero.numel(), *(experts or (0, w.shape[0])),
        counts if counts is not None else out, *(quant_out or (out, out)), q_strides[0], q_strides[1],
        *pf_args,
        GATED=gated, ATOMIC=atomic, FMT=int(kfmt), A_FMT=_a_fmt(a.dtype),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        FP8_GROUP=FP8_GROUP, INT4_GROUP=INT4_GROUP, MX_GROUP=MX_GROUP,
        EDGE_TILES=edge_tiles, SPLIT_K=split_k,
        ZBLOCK=zblock, PTX=has_ptx(), JOIN_K=cfg.get("JOIN_K", False), SWAP_AB=swap, MX_WORD=mx_word,
        MX_BF16_SHIFT=MX_BF16_SHIFT if a.dtype == torch.bfloat16 else 0,
        QUANT_OUT=quant_out is not None, TILE_ROWS=int(tile_rows), EVEN_K=k % cfg["BLOCK_K"] == 0,
        PF_LINES=pf_lines, PDL_WAIT=pdl,
        GU_ONE_DOT=(gated and not swap and kfmt != KernelFormat.MXFP4_NATIVE and bool(cfg.get("GU_ONE_DOT", False))),
        ALIGN_M=cfg["BLOCK_M"] * (2 if tile_rows == TileRows.LOWER_HALF else 1),
        FP8_MAX=fp8_max(quant_out[0].dtype) if quant_out is not None else 1.0, ROUND_E4M3=interpreting(),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **(dict(launch_pdl=True) if pdl else {}),
    )


def gate_up_swiglu(x, x_scale, w13, w13_scale, inter, align, *, top_k: int, kfmt: int, cfg: dict,
                   zero: torch.Tensor | None = None, experts: tuple[int, int] | None = None,
                   quant_out: tuple | None = None, prefetch: tuple | None = None, pdl: bool = False) -> None:
    """Stage 1: inter[edge] = silu(x[token] W_gate^T) * (x[token] W_up^T), for every routed edge.

    x [M, H] (fp8 w8a8: fp8 with x_scale [M, ceil(H/128)]; native mxfp4: e4m3 with e8m0 uint8 x_scale
    [M, ceil(H/32)]; else 16-bit with x_scale None), w13 [E, 2I, H(/2)],
    inter [M*top_k, I]. `align` is `moe_align`'s triple, or (topk_ids flattened, None, None) for one tile per edge.
    `zero` (float32, contiguous) is zeroed on the way. `experts` = (lo, hi): only tiles of experts lo <= e < hi
    run, with w13[0] holding expert lo (a chunk of dequantized experts); None: every expert, w13 whole.
    `quant_out` = (fp8 [M*top_k, I], float32 scales [M*top_k, ceil(I/128)], int32 counters [M*top_k*ceil(I/128)]
    zeroed): the M=1 tiles also write inter quantized per token group of 128 (as `act_quant.quantize_act_fp8`).
    `prefetch` = (w2 contiguous, bytes): the M=1 tiles, after their K loop, prefetch the first `bytes` of the weights
    stage 2 reads (edge by edge) into L2 (PTX targets; `_prefetch_next_stage`). `pdl`: launched as a programmatic
    dependent of the launch that writes x (`platform.has_pdl`; that launch triggers at its start), each program
    waiting for x (`gdc_wait`) after its set-up, before its K loop.
    """
    _launch(x, x_scale, w13, w13_scale, inter, None, align, num_edges=inter.shape[0], top_k=top_k,
            n=inter.shape[1], k=x.shape[1], kfmt=kfmt, gated=True, atomic=False, cfg=cfg, zero=zero, experts=experts,
            quant_out=quant_out, prefetch=prefetch, pdl=pdl)


def down_combine(inter, inter_scale, w2, w2_scale, out, topk_weights, align, *, top_k: int, kfmt: int,
                 cfg: dict, experts: tuple[int, int] | None = None) -> None:
    """Stage 2: out[token] (+)= topk_weights[edge] * inter[edge] W2[e]^T.

    inter [M*top_k, I] (fp8 w8a8: fp8 with inter_scale [M*top_k, ceil(I/128)]; native mxfp4: e4m3 with e8m0
    inter_scale [M*top_k, ceil(I/32)]), w2 [E, H, I(/2)], out [M, H]:
    fp32 and accumulated with atomics when top_k > 1 (the caller zeroes it; cfg SPLIT_K > 1 then also
    splits K over programs), any float dtype and plainly stored when top_k == 1. `experts` as in `gate_up_swiglu`.
    """
    _launch(inter, inter_scale, w2, w2_scale, out, topk_weights.reshape(-1), align, num_edges=inter.shape[0],
            top_k=top_k, n=out.shape[1], k=inter.shape[1], kfmt=kfmt, gated=False, atomic=top_k > 1, cfg=cfg,
            experts=experts)
