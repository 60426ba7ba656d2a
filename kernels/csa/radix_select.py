"""Exact radix-select top-k of one contiguous range per program (Triton): the fallback path of CSA top-K.

Maps floats to order-preserving 32-bit keys and finds the k-th largest with histogram passes over 8-bit
(or 11/11/10-bit) digits (`tl.histogram`), each restricted to the prefix chosen before and stopping early
once the chosen bin holds exactly the entries still needed; a last pass writes every entry above the
threshold and the first `needed` equal to it, in position order. Exact for any input (all ties, sorted
data), but each pass re-reads the range and `tl.histogram` is slow on NVIDIA, so `zoe_kernels.csa.topk`
uses it only when its threshold filter overflows (see topk.py); also selectable with method="radix".
"""

import triton
import triton.language as tl

# radix_bits=11: three digits of 11, 11 and 10 bits (2048-bin histograms); radix_bits=8: four 8-bit digits.
RADIX_BINS = {11: 2048, 8: 256}


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
def _radix_topk_range(row_val, row_idx, c_lo, c_hi, lo, out_idx, out_val, K,
                      HAS_IDX: tl.constexpr, WRITE_VAL: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr):
    """Top K of row_val[c_lo:c_hi] into out_idx[0:K] (ids = position - lo, or source ids when HAS_IDX),
    ascending position order, -1 padded; with WRITE_VAL the scores go to out_val (padding -inf)."""
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

    _radix_topk_range(row_val, row_idx, c_lo, c_hi, lo, out_idx, out_val, K, HAS_IDX, WRITE_VAL, NB, BLOCK)
