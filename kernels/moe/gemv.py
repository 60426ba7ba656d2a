"""The small-M path of the fused MoE: grouped GEMV stages without `tl.dot`, two launches in all.

At decode sizes an expert sees one or two tokens, so a `tl.dot` tile (16 rows at least) is mostly padding
and its dequantize-then-MMA K loop is not pipelined (bench/kernels/moe_README.md). Here each program
streams a block of weight rows with wide coalesced loads, dequantizes them in registers, multiplies by one
token's activations and reduces along K, one scale group at a time:

- stage 1 (`gemv_gate_up`): a program per (edge, block of BLOCK_N rows of I) computes the gate and up rows
  and writes silu(gate) * up for that edge; edges with an expert id outside [0, E) are skipped;
- stage 2 (`gemv_down_combine`): a program per (token, chunk of top-k slots, block of BLOCK_N rows of H)
  accumulates weight * (inter[edge] . w2[e, n]) in registers. With one chunk (many tokens) it stores the
  output row in its final dtype: no atomics, no zero-fill, no cast. With several (few tokens: more programs
  in flight) the chunks add with float32 atomics into a buffer that stage 1 zero-fills on its way.

The 4-bit formats run `gemv_4bit.py`'s word-wise kernel instead (same grid and contract) wherever the packed
weight rows are whole int32 words (`cfg["WORDS"]` from `config.gemv_config`); the 4-bit branch here serves
the other shapes. No align launch and no activation quantization (fp8 runs weight-only: activations stay in
16 bits): two launches, plus the cast of the float32 buffer when the slots are split. Programs are ordered
block-of-rows major, so the programs that read the same rows of an expert (several tokens routed to it) run
together and the repeats come from L2.

Dequantization uses bit tricks instead of int -> float conversions (slow on GPUs):
- int4 nibble u: bits 0x4B000000 | u are the float 2^23 + u, minus (2^23 + 8) is u - 8 exactly;
- e2m1 nibble s|e1 e0|m: bits (s << 31) | (e1 e0 m << 22) are the float v * 2^-126 (e = 0 lands on a
  subnormal, which is also exact), times 2^126 is v;
fp8 weights take the hardware conversion (`.to(float32)`), which measured faster than a bit trick on the H200.
Plain float32 multiplies keep subnormals on NVIDIA and in the interpreter (tests check these codes exactly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.moe.gemv_4bit import launch_4bit, rows_are_words

# Scale group along K of each format (fp8 also groups 128 rows per scale).
GROUP = {0: 128, 1: 128, 2: 128, 3: 32}
FMT_CODE = {"bf16": 0, "fp8": 1, "w4a16": 2, "mxfp4": 3}


@triton.jit
def _dequant_group(w_base, ws_base, rows, row_mask, kk, K, KP, a,
                   stride_wn, stride_wsn, stride_wsk,
                   FMT: tl.constexpr, G: tl.constexpr):
    """sum_k W[rows, kk:kk+G] * a[k] (float32 [BLOCK_N]) for one scale group starting at kk, scale applied.
    `a` is the group's activations, float32 [G], zero past K; KP is the bytes per weight row of the 4-bit
    formats (a separate argument, so that Triton sees its divisibility and loads 16 bytes at a time)."""
    if FMT == 0 or FMT == 1:
        offs_k = kk + tl.arange(0, G)
        w = tl.load(w_base + rows[:, None] * stride_wn + offs_k[None, :],
                    mask=row_mask[:, None] & (offs_k[None, :] < K), other=0.0)
        wf = w.to(tl.float32)
        part = tl.sum(wf * a[None, :], axis=1)
        if FMT == 1:
            s = tl.load(ws_base + (rows // 128) * stride_wsn + (kk // 128) * stride_wsk, mask=row_mask, other=0.0)
            part = part * s
    else:
        offs_kp = kk // 2 + tl.arange(0, G // 2)
        p = tl.load(w_base + rows[:, None] * stride_wn + offs_kp[None, :],
                    mask=row_mask[:, None] & (offs_kp[None, :] < KP), other=0).to(tl.uint32)
        if FMT == 2:
            lo = ((p & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0  # 2^23 + 8
            hi = ((p >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0
        else:
            lo = (((p & 0x7) << 22) | ((p & 0x8) << 28)).to(tl.float32, bitcast=True) * 8.507059173023462e37
            hi = (((p & 0x70) << 18) | ((p & 0x80) << 24)).to(tl.float32, bitcast=True) * 8.507059173023462e37
        # interleave back to k order (low nibble = even k): the new axis stays inside a thread
        wf = tl.reshape(tl.join(lo, hi), (lo.shape[0], G))
        part = tl.sum(wf * a[None, :], axis=1)
        s = tl.load(ws_base + rows * stride_wsn + (kk // G) * stride_wsk, mask=row_mask, other=0)
        if FMT == 2:
            part = part * s.to(tl.float32)
        else:  # e8m0 byte b is 2^(b - 127): exponent bits b, and b = 0 is the subnormal 2^-127
            sb = s.to(tl.uint32)
            part = part * tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)
    return part


@triton.jit
def _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KP, stride_wn, stride_wsn, stride_wsk,
              BOTH: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr, GPI: tl.constexpr, BLOCK_N: tl.constexpr):
    """(a_row . W[offs_n], a_row . W[N + offs_n] if BOTH else zeros) over the whole K, float32 [BLOCK_N] each:
    GPI scale groups per step, the activations of a group loaded once for both row sets."""
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, G * GPI):
        for gi in tl.static_range(GPI):
            kk = k0 + gi * G
            offs_k = kk + tl.arange(0, G)
            a = tl.load(a_row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            acc += _dequant_group(w_base, ws_base, offs_n, n_mask, kk, K, KP, a, stride_wn,
                                  stride_wsn, stride_wsk, FMT, G)
            if BOTH:
                acc2 += _dequant_group(w_base, ws_base, N + offs_n, n_mask, kk, K, KP, a, stride_wn,
                                       stride_wsn, stride_wsk, FMT, G)
    return acc, acc2


@triton.jit
def _gemv_kernel(
    a_ptr, w_ptr, ws_ptr, out_ptr, ids_ptr, topk_w_ptr, zero_ptr,
    num_rows, num_chunks, slots_per_chunk, top_k, num_experts, N, K, KP, zero_numel,
    stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_wsk, stride_om,
    GATED: tl.constexpr, ATOMIC: tl.constexpr, FMT: tl.constexpr, G: tl.constexpr, GPI: tl.constexpr,
    BLOCK_N: tl.constexpr, ZBLOCK: tl.constexpr,
):
    """GATED: row r is an edge; out[r, n] = silu(a[token] . w[e, n]) * (a[token] . w[e, N + n]), and the
    programs first zero `zero_ptr[:zero_numel]` (float32; ZBLOCK > 0), stage 2's accumulator.
    Not GATED: row r is a token and its top-k slots are cut into num_chunks chunks of slots_per_chunk;
    out[r, n] (+)= sum_{s in chunk} topk_w[r, s] * (a[r * top_k + s] . w[ids[r, s], n]), with float32
    atomics when ATOMIC (several chunks), a plain store in out's dtype otherwise."""
    pid = tl.program_id(0)
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
        acc, acc_up = _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KP, stride_wn, stride_wsn,
                                stride_wsk, True, FMT, G, GPI, BLOCK_N)
        h = acc / (1.0 + tl.exp(-acc)) * acc_up
        tl.store(out_ptr + r.to(tl.int64) * stride_om + offs_n, h.to(out_ptr.dtype.element_ty),
                 mask=n_mask)
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
                part, _ = _rows_dot(a_row, w_base, ws_base, offs_n, n_mask, N, K, KP, stride_wn, stride_wsn,
                                    stride_wsk, False, FMT, G, GPI, BLOCK_N)
                acc += weight * part
        o_ptrs = out_ptr + r.to(tl.int64) * stride_om + offs_n
        if ATOMIC:
            tl.atomic_add(o_ptrs, acc, mask=n_mask, sem="relaxed")
        else:
            tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def _launch(a, w, w_scale, out, ids, topk_w, *, num_rows, top_k, n, k, fmt, gated, cfg, chunks=1, zero=None):
    code = FMT_CODE[fmt]
    if a.stride(1) != 1 or w.stride(2) != 1 or out.stride(1) != 1:
        raise ValueError("the GEMV path takes activations, weights and outputs with a contiguous last axis")
    if cfg.get("WORDS") and rows_are_words(w):  # the 4-bit formats, decoded a word at a time (gemv_4bit.py)
        launch_4bit(a, w, w_scale, out, ids, topk_w, num_rows=num_rows, top_k=top_k, n=n, k=k, fmt=fmt,
                    gated=gated, cfg=cfg["WORDS"], chunks=chunks, zero=zero)
        return
    bn = cfg["BLOCK_N"]
    w_scale = w_scale if w_scale is not None else w
    ws_strides = (w_scale.stride(0), w_scale.stride(1), w_scale.stride(2)) if w_scale.dim() == 3 else (0, 0, 0)
    grid = (num_rows * chunks * triton.cdiv(n, bn),)
    zblock = 0 if zero is None else max(128, triton.next_power_of_2(triton.cdiv(zero.numel(), grid[0])))
    _gemv_kernel[grid](
        a, w, w_scale, out, ids, topk_w if topk_w is not None else a, zero if zero is not None else out,
        num_rows, chunks, triton.cdiv(top_k, chunks), top_k, w.shape[0], n, k, w.shape[2],
        0 if zero is None else zero.numel(),
        a.stride(0), w.stride(0), w.stride(1), *ws_strides, out.stride(0),
        GATED=gated, ATOMIC=chunks > 1, FMT=code, G=GROUP[code], GPI=cfg["GPI"], BLOCK_N=bn,
        ZBLOCK=zblock, num_warps=cfg["num_warps"], num_stages=cfg.get("num_stages", 1),
    )


def gemv_gate_up(x: torch.Tensor, w13: torch.Tensor, w13_scale, inter: torch.Tensor, topk_ids: torch.Tensor, *,
                 fmt: str, cfg: dict, zero: torch.Tensor | None = None) -> None:
    """Stage 1: inter[edge] = silu(x[token] W_gate^T) * (x[token] W_up^T) for every edge with a valid id.

    x [M, H] float; w13 [E, 2I, H(/2)] in `fmt`; inter [M*top_k, I]; topk_ids [M, top_k] contiguous.
    `zero` (float32, contiguous), if given, is zero-filled on the way (stage 2's atomic accumulator).
    """
    _launch(x, w13, w13_scale, inter, topk_ids, None, num_rows=inter.shape[0], top_k=topk_ids.shape[1],
            n=inter.shape[1], k=x.shape[1], fmt=fmt, gated=True, cfg=cfg, zero=zero)


def gemv_down_combine(inter: torch.Tensor, w2: torch.Tensor, w2_scale, out: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, *, fmt: str, cfg: dict) -> None:
    """Stage 2: out[token] (+)= sum_slot topk_weights[token, slot] * inter[edge] W2[e]^T.

    inter [M*top_k, I]; w2 [E, H, I(/2)]; topk_weights float32 and topk_ids [M, top_k] contiguous.
    With cfg["CHUNKS"] = c > 1 the slots are split over c programs per output block that add into `out`
    (float32, zeroed by the caller, e.g. through `gemv_gate_up(zero=out)`); with 1, one program sums all
    slots and stores `out` [M, H] in its own dtype.
    """
    chunks = min(cfg.get("CHUNKS", 1), topk_ids.shape[1])
    if chunks > 1 and out.dtype != torch.float32:
        raise ValueError("stage 2 with several slot chunks accumulates into a float32 output")
    _launch(inter, w2, w2_scale, out, topk_ids, topk_weights, num_rows=out.shape[0], top_k=topk_ids.shape[1],
            n=out.shape[1], k=inter.shape[1], fmt=fmt, gated=False, cfg=cfg, chunks=chunks)
