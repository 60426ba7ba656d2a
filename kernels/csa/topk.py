"""Exact, deterministic top-k selection over ragged rows of float32 scores (Triton radix select).

Used twice in zoe: CSA top-K (top 512 of up to ~1M compressed-entry scores per request, DeepSeek-V4-Pro,
seed table A3) and the DSA indexer's top 2048 (`zoe_kernels.dsa.indexer_topk`).

Selection rule (deterministic ties): a row's selected set is the k largest entries ordered by
(value descending, position ascending): among equal values the lower position wins. The indices are
returned in ascending position order (not by value), followed by -1 padding when a row has fewer than
k valid entries. NaN scores are not supported (they would rank above +inf); -inf is a valid score.

Method: each program owns one contiguous chunk of a row. It maps every float to an order-preserving
32-bit key and finds the k-th largest key of its chunk by radix select: three histogram passes over
11, 11 and 10 bits (or four of 8 bits) (`tl.histogram`), each restricted to the prefix chosen by the pass before, stopping
early once the chosen bin holds exactly the entries still needed. A last pass writes every entry above
the threshold and the first `needed` entries equal to it, in position order (a running cumsum), so no
sort and no candidate buffer is needed. Long rows are split over 8, 16 or 32 chunks (by length); each
chunk's top k are written as candidates, and a second launch selects the row's top k among them. The
candidates of a chunk keep position order and chunks are in position order, so the merged output is
again in ascending position order and ties resolve to the lowest positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# radix_bits=11: three digits of 11, 11 and 10 bits (2048-bin histograms); radix_bits=8: four 8-bit digits.
_BINS = {11: 2048, 8: 256}


@triton.jit
def _order_key(x):
    """fp32 -> int64 in [0, 2^32) whose integer order is the float order (-inf lowest, +inf highest)."""
    b = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b < 0, ~b, b | 0x80000000)


@triton.jit
def _load_chunk_tile(val_ptr, idx_ptr, offs, c_hi, HAS_IDX: tl.constexpr):
    """Loads one tile of a chunk: (order keys, valid mask, source ids or positions)."""
    m = offs < c_hi
    x = tl.load(val_ptr + offs, mask=m, other=0.0)
    if HAS_IDX:
        src = tl.load(idx_ptr + offs, mask=m, other=-1)
        m = m & (src >= 0)
    else:
        src = offs
    return _order_key(x), m, src


@triton.jit
def _radix_pass(val_ptr, idx_ptr, c_lo, c_hi, prefix, remaining, done, shift,
                SHIFT: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
                HAS_IDX: tl.constexpr):
    """One radix digit: histogram the digit at SHIFT of keys whose higher bits equal `prefix`, pick the
    bin holding the `remaining`-th largest, and narrow (prefix, remaining) to it."""
    new_prefix = prefix
    new_remaining = remaining
    new_done = done
    new_shift = shift
    if not done:
        hist = tl.zeros([NB], dtype=tl.int32)
        for start in range(c_lo, c_hi, BLOCK):
            u, m, _ = _load_chunk_tile(val_ptr, idx_ptr, start + tl.arange(0, BLOCK), c_hi, HAS_IDX)
            m = m & ((u >> (SHIFT + BITS)) == prefix)
            digit = ((u >> SHIFT) & (NB - 1)).to(tl.int32)
            hist += tl.histogram(digit, NB, mask=m)
        # count of keys in bins >= d, for every d (non-increasing in d)
        count_ge = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        bins = tl.arange(0, NB)
        chosen = tl.sum((count_ge >= remaining).to(tl.int32), axis=0) - 1
        in_bin = tl.sum(tl.where(bins == chosen, hist, 0), axis=0)
        above = tl.sum(tl.where(bins == chosen, count_ge, 0), axis=0) - in_bin
        new_remaining = remaining - above
        new_prefix = (prefix << BITS) | chosen.to(tl.int64)
        new_done = in_bin == new_remaining
        new_shift = tl.full([], SHIFT, tl.int32)
    return new_prefix, new_remaining, new_done, new_shift


@triton.jit
def _chunk_topk_kernel(
    val_ptr, idx_ptr, lo_ptr, hi_ptr, out_idx_ptr, out_val_ptr,
    n_cols, stride_val_row, stride_out_row, K,
    HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, HAS_IDX: tl.constexpr, WRITE_VAL: tl.constexpr,
    NB: tl.constexpr, BLOCK: tl.constexpr,
):
    """Program (row r, chunk s of S): the top K of positions [lo_r, hi_r) ∩ chunk s of row r.

    lo_r / hi_r come from lo_ptr / hi_ptr when HAS_LO / HAS_HI (clamped to [0, n_cols]), else 0 / n_cols.

    Writes K slots of out row r*S + s: output ids (position - lo_r, or the source id when HAS_IDX)
    in ascending position order, then -1; with WRITE_VAL also the scores (padding -inf)."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    lo = 0
    hi = n_cols
    if HAS_LO:
        lo = tl.minimum(tl.maximum(tl.load(lo_ptr + row), 0), n_cols)
    if HAS_HI:
        hi = tl.minimum(tl.maximum(tl.load(hi_ptr + row), 0), n_cols)
    n = tl.maximum(hi - lo, 0)
    chunk = tl.cdiv(tl.cdiv(n, num_splits), BLOCK) * BLOCK
    c_lo = lo + split * chunk
    c_hi = tl.minimum(c_lo + chunk, hi)
    row_val = val_ptr + row.to(tl.int64) * stride_val_row
    row_idx = idx_ptr + row.to(tl.int64) * stride_val_row
    out_row = row.to(tl.int64) * num_splits + split
    out_idx = out_idx_ptr + out_row * stride_out_row
    out_val = out_val_ptr + out_row * stride_out_row

    # valid entries of the chunk (all of them, unless source ids mark padding with -1)
    if HAS_IDX:
        n_valid = 0
        for start in range(c_lo, c_hi, BLOCK):
            _, m, _ = _load_chunk_tile(row_val, row_idx, start + tl.arange(0, BLOCK), c_hi, HAS_IDX)
            n_valid += tl.sum(m.to(tl.int32), axis=0)
    else:
        n_valid = tl.maximum(c_hi - c_lo, 0)
    needed = tl.minimum(n_valid, K)

    # radix select of the needed-th largest key; prefix holds the resolved top bits
    prefix = tl.zeros([], dtype=tl.int64)
    remaining = needed
    done = needed == n_valid  # everything is taken: no threshold needed
    shift = tl.full([], 32, tl.int32)  # keys compare on their bits above `shift`
    if NB == 256:  # four 8-bit digits: smaller histograms, one more pass
        for p in tl.static_range(4):
            prefix, remaining, done, shift = _radix_pass(row_val, row_idx, c_lo, c_hi, prefix, remaining, done,
                                                         shift, 24 - 8 * p, 8, NB, BLOCK, HAS_IDX)
    else:  # 11, 11 and 10 bits
        prefix, remaining, done, shift = _radix_pass(row_val, row_idx, c_lo, c_hi, prefix, remaining, done,
                                                     shift, 21, 11, NB, BLOCK, HAS_IDX)
        prefix, remaining, done, shift = _radix_pass(row_val, row_idx, c_lo, c_hi, prefix, remaining, done,
                                                     shift, 10, 11, NB, BLOCK, HAS_IDX)
        prefix, remaining, done, shift = _radix_pass(row_val, row_idx, c_lo, c_hi, prefix, remaining, done,
                                                     shift, 0, 10, NB, BLOCK, HAS_IDX)

    # write pass: keys above the threshold, and the first `remaining` keys equal to it
    taken = tl.zeros([], dtype=tl.int32)
    eq_seen = tl.zeros([], dtype=tl.int32)
    start = c_lo
    while (start < c_hi) & (taken < needed):
        offs = start + tl.arange(0, BLOCK)
        u, m, src = _load_chunk_tile(row_val, row_idx, offs, c_hi, HAS_IDX)
        top = u >> shift
        eq = m & (top == prefix)
        eq_i = eq.to(tl.int32)
        eq_rank = eq_seen + tl.cumsum(eq_i, axis=0) - eq_i
        take = (m & (top > prefix)) | (eq & (eq_rank < remaining))
        take_i = take.to(tl.int32)
        pos = taken + tl.cumsum(take_i, axis=0) - take_i
        if HAS_IDX:
            out_id = src
        else:
            out_id = src - lo
        tl.store(out_idx + pos, out_id.to(tl.int32), mask=take)
        if WRITE_VAL:
            tl.store(out_val + pos, tl.load(row_val + offs, mask=take, other=0.0), mask=take)
        taken += tl.sum(take_i, axis=0)
        eq_seen += tl.sum(eq_i, axis=0)
        start += BLOCK
    for pad in range(0, K, BLOCK):
        offs = pad + tl.arange(0, BLOCK)
        m = (offs >= taken) & (offs < K)
        tl.store(out_idx + offs, tl.full([BLOCK], -1, tl.int32), mask=m)
        if WRITE_VAL:
            tl.store(out_val + offs, tl.full([BLOCK], float("-inf"), tl.float32), mask=m)


def auto_splits(max_len: int) -> int:
    """Chunks per row: one per 32K entries, as a power of two capped at 32 (so 8/16/32 at 256K/512K/1M)."""
    chunks = -(-max_len // 32768)
    return min(32, 1 << max(0, chunks - 1).bit_length())


def topk_ranges(scores: torch.Tensor, starts: torch.Tensor | None, ends: torch.Tensor, k: int, *,
                splits: int | None = None, block: int = 4096, num_warps: int = 8, radix_bits: int = 11,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k positions of each row's valid range [starts[r], ends[r]) of `scores` [R, N] float32.

    Returns int32 [R, k]: positions relative to starts[r] (starts=None: 0), ascending, -1 padded (see the module doc for
    the tie rule). `splits` chunks per row (default `auto_splits`); `block` is the tile of one loop step;
    `out` an optional preallocated contiguous int32 [R, k] tensor; radix_bits 11 (3 passes) or 8 (4 passes).
    """
    if radix_bits not in _BINS:
        raise ValueError(f"radix_bits must be one of {sorted(_BINS)}, got {radix_bits}")
    nb = _BINS[radix_bits]
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be a 2-D float32 tensor, got {tuple(scores.shape)} {scores.dtype}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    rows, n = scores.shape
    if (starts is not None and starts.shape != (rows,)) or ends.shape != (rows,):
        got = (tuple(starts.shape) if starts is not None else None, tuple(ends.shape))
        raise ValueError(f"starts/ends must have shape ({rows},), got {got}")
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    # no clamping here: the kernel clamps, so a call is just its launches (cheap to capture in a graph)
    if starts is not None:
        starts = starts.to(device=scores.device, dtype=torch.int32).contiguous()
    ends = ends.to(device=scores.device, dtype=torch.int32).contiguous()
    lo_arg = starts if starts is not None else ends
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
    elif out.shape != (rows, k) or out.dtype != torch.int32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int32 [{rows}, {k}] tensor, got {tuple(out.shape)} {out.dtype}")
    if rows == 0:
        return out
    if splits is None:
        splits = auto_splits(n)
    if splits <= 1:
        _chunk_topk_kernel[(rows, 1)](
            scores, scores, lo_arg, ends, out, scores, n, scores.stride(0), k, k,
            HAS_LO=starts is not None, HAS_HI=True, HAS_IDX=False, WRITE_VAL=False,
            NB=nb, BLOCK=block, num_warps=num_warps)
        return out
    cand_idx = torch.empty((rows, splits * k), dtype=torch.int32, device=scores.device)
    cand_val = torch.empty((rows, splits * k), dtype=torch.float32, device=scores.device)
    _chunk_topk_kernel[(rows, splits)](
        scores, scores, lo_arg, ends, cand_idx, cand_val, n, scores.stride(0), k, k,
        HAS_LO=starts is not None, HAS_HI=True, HAS_IDX=False, WRITE_VAL=True,
        NB=nb, BLOCK=block, num_warps=num_warps)
    _chunk_topk_kernel[(rows, 1)](
        cand_val, cand_idx, ends, ends, out, cand_val, splits * k, cand_val.stride(0), k, k,
        HAS_LO=False, HAS_HI=False, HAS_IDX=True, WRITE_VAL=False,
        NB=nb, BLOCK=block, num_warps=num_warps)
    return out


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512, *, splits: int | None = None,
         block: int = 4096, num_warps: int = 8, radix_bits: int = 11,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """CSA top-K: the k best compressed entries of each request.

    scores: [B, N] float32, entry j of request b valid for j < lengths[b] (lengths [B], any int dtype,
    clamped to [0, N]). Returns int32 [B, k]: entry positions (0-based from the request's first entry,
    which is what vLLM's and SGLang's sparse-attention kernels expect before they map positions to KV
    slots), ascending, padded with -1 when lengths[b] < k. Ties: the larger value first, then the lower
    position. Rows longer than 32K are split over up to 32 programs (`auto_splits`) and merged.
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    if lengths.shape != (scores.shape[0],):
        raise ValueError(f"lengths must have shape ({scores.shape[0]},), got {tuple(lengths.shape)}")
    return topk_ranges(scores, None, lengths, k, splits=splits, block=block, num_warps=num_warps,
                       radix_bits=radix_bits, out=out)
