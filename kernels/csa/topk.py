"""Exact, deterministic top-k selection over ragged rows of float32 scores (Triton).

Used twice in zoe: CSA top-K (top 512 of up to ~1M compressed-entry scores per request, DeepSeek-V4-Pro,
seed table A3) and the DSA indexer's top 2048 (`zoe_kernels.dsa.indexer_topk`).

Selection rule (deterministic ties): a row's selected set is the k largest entries ordered by
(value descending, position ascending): among equal values the lower position wins. The indices are
returned in ascending position order (not by value), followed by -1 padding when a row has fewer than
k valid entries. NaN scores are not supported; -inf is a valid score.

Method "sample" (no sorting network anywhere, so compiles stay short):
1. threshold: read a fixed sample of S entries of the row (S/SB blocks of SB contiguous entries spread
   evenly; the whole row when it has <= S entries) and find, by a bitwise binary search over the
   order-preserving int32 keys (one reduction per bit), a key T that about MARGIN*k entries of the row
   should reach. On a row of <= S entries T is exactly the k-th largest key.
2. filter: every entry with key >= T is a candidate. Each of the P programs of a row (P chunks) counts
   its candidates, reserves that many consecutive slots of the row's SLOTS with one atomic add, and
   writes (key, position) there in position order (a cumsum per tile): one segment per chunk.
3. finish: over the candidate slots, the same binary search finds the exact k-th largest value v* (or
   takes T when it was exact); everything above v* is taken, and among entries equal to v* the lowest
   positions (a binary search on positions, when ties straddle the k-th place); a taken entry's output
   slot is (taken in earlier chunks) + (taken before it in its segment), so positions come out ascending.
The result is exact whenever the candidates include the top k, i.e. when at least min(k, n) entries
reached T and they fit the SLOTS; otherwise (adversarial layouts that fool the sample, massive
ties) the finish falls back to the exact radix select of radix_select.py over the whole row. Both
conditions are checked on the device, so a call is a fixed set of launches (CUDA-graph friendly).

Methods: "auto" (default) uses the radix select alone for fewer than 64 rows of at most 4096 entries (one
launch, faster there), "sample" (the above) otherwise.

Launches: many rows (indexer prefill) or short rows use one program per row that does all three steps
(`_topk_row_kernel`); few long rows (CSA decode) use three launches: one threshold program per row,
P = n/2048 (<= 512) filter programs per row, one finish program per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.radix_select import RADIX_BINS, _chunk_topk_kernel, _radix_topk_range

MIN32 = tl.constexpr(-(2**31))  # an inline -2147483648 literal would be typed int64
SAMPLE = 16384  # entries read to pick the threshold (64 KB of float32)
SAMPLE_BLOCK = 8  # contiguous entries per sample block: one 32-byte sector, spread over the whole row
MARGIN = 3  # the threshold aims at MARGIN * k candidates: under k happens with ~1e-5 odds on i.i.d. rows
SPLIT_TILE = 2048  # entries per filter program (one tile) in split mode: P = n / SPLIT_TILE, at most MAX_SPLITS
MAX_SPLITS = 512
ROW_TILE = 4096  # entries per loop step in one-program-per-row mode
# "auto" takes the radix select for few rows this short: H200 run 5, B=1, 4096 entries: 15.8 us against 31.1
# for the sampled threshold, whose three launches and serial search steps cost ~30 us at any length
RADIX_MAX_LEN = 4096


@triton.jit
def _signed_key(x):
    """fp32 -> int32 whose signed order is the float order (-inf < ... < +inf)."""
    b = x.to(tl.int32, bitcast=True)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO: tl.constexpr):
    lo = 0
    if HAS_LO:
        lo = tl.minimum(tl.maximum(tl.load(lo_ptr + row), 0), n_cols)
    hi = tl.minimum(tl.maximum(tl.load(hi_ptr + row), 0), n_cols)
    return lo, tl.maximum(hi, lo)


@triton.jit
def _kth_largest_key(key, r, nbits):
    """Largest int32 t with at least r keys >= t, searched on its top `nbits` bits (the rest zero, so t
    rounds down). Invalid lanes must hold MIN32 (NaN's key, never a real score's).

    One reduction per bit. A 16-way variant (4 bits per step, [16, n] compares) measured 2x slower on an
    H200 (run 4: 59.6 us against 33.2 us for a 1M-entry row), so the steps' compares, not only their
    synchronisation, cost."""
    c = tl.zeros([], tl.int64)  # the answer + 2^31 (unsigned order), built bit by bit from the top
    for i in range(nbits):
        cand = c | (tl.full([], 1, tl.int64) << (31 - i))
        cnt = tl.sum((key >= (cand - 2147483648).to(tl.int32)).to(tl.int32), axis=0)
        c = tl.where(cnt >= r, cand, c)
    return (c - 2147483648).to(tl.int32)


@triton.jit
def _sample_threshold(row_val, lo, n, K, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr):
    """Step 1: the candidate threshold of the row [lo, lo + n) (see the module doc)."""
    i = tl.arange(0, S)
    sampled = n > S
    blk = (i // SB).to(tl.int64)
    start = (blk * tl.maximum(n - SB, 0)) // (S // SB - 1) + i % SB  # S/SB evenly spread blocks
    offs = lo + tl.where(sampled, start, i)
    ok = i < tl.where(sampled, S, n)
    key = tl.where(ok, _signed_key(tl.load(row_val + offs, mask=ok, other=0.0)), MIN32)
    r_sampled = tl.minimum((MARGIN_ * K * S + n - 1) // tl.maximum(n, 1), S)
    r = tl.where(sampled, r_sampled, tl.minimum(K, n))
    # 16 bits (sign, exponent, 7 mantissa bits) are plenty for a sampled estimate; exact rows need all 32
    return _kth_largest_key(key, r, tl.where(sampled, 16, 32))


@triton.jit
def _tile_candidates(row_val, offs, end, thresh):
    """Keys of row_val[offs] (masked at `end`) and which of them reach the threshold (bool and int32)."""
    ok = offs < end
    key = _signed_key(tl.load(row_val + offs, mask=ok, other=0.0))
    take = ok & (key >= thresh)
    return key, take, take.to(tl.int32)


@triton.jit
def _filter_range(row_val, c_lo, c_hi, lo, thresh, cand_key, cand_pos, cap, TILE: tl.constexpr):
    """Step 2 over [c_lo, c_hi): appends (key, position - lo) of entries >= thresh in position order to at
    most `cap` slots; returns the number of candidates (which may exceed cap)."""
    count = tl.zeros([], tl.int32)
    for start in range(c_lo, c_hi, TILE):
        offs = start + tl.arange(0, TILE)
        key, take, take_i = _tile_candidates(row_val, offs, c_hi, thresh)
        n_take = tl.sum(take_i, axis=0)
        if n_take > 0:
            slot = count + tl.cumsum(take_i, axis=0) - take_i
            keep = take & (slot < cap)
            tl.store(cand_key + slot, key, mask=keep)
            tl.store(cand_pos + slot, (offs - lo).to(tl.int32), mask=keep)
        count += n_take
    return count


@triton.jit
def _select(key, pos, total, kk, thresh, exact, IN_ORDER: tl.constexpr):
    """Step 3: which of `total` candidates (invalid slots: key MIN32) are the top kk. Everything above the
    kk-th largest value v* is taken, and among entries equal to v* the lowest positions. When the threshold
    came from the whole row (`exact`), it already is v*. IN_ORDER: the slots hold the candidates in
    position order (the first ties are the lowest positions); otherwise the last position to take is found
    by a second binary search (only when ties straddle the k-th place)."""
    vstar = tl.full([], MIN32, tl.int32)
    if total > kk:
        if exact:
            vstar = thresh
        else:
            vstar = _kth_largest_key(key, kk, 32)
    gt = key > vstar
    need = kk - tl.sum(gt.to(tl.int32), axis=0)
    eq = (key == vstar) & (key != MIN32)
    eq_i = eq.to(tl.int32)
    if IN_ORDER:
        take = gt | (eq & (tl.cumsum(eq_i, axis=0) - eq_i < need))
    else:
        last = tl.full([], 2147483647, tl.int32)
        if tl.sum(eq_i, axis=0) > need:  # the need-th smallest tied position
            c = tl.zeros([], tl.int32)
            for i in range(31):
                cand = c | (1 << (30 - i))
                if tl.sum((eq & (pos < cand)).to(tl.int32), axis=0) < need:
                    c = cand
            last = c
        take = gt | (eq & (pos <= last))
    return take


@triton.jit
def _pad(out_row, kk, K, SLOTS: tl.constexpr):
    r = tl.arange(0, SLOTS)
    tl.store(out_row + r, tl.full([SLOTS], -1, tl.int32), mask=(r >= kk) & (r < K))


@triton.jit
def _topk_row_kernel(val_ptr, lo_ptr, hi_ptr, cand_key_ptr, cand_pos_ptr, out_ptr, n_cols, stride_row, K, row0,
                     HAS_LO: tl.constexpr, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr,
                     SLOTS: tl.constexpr, TILE: tl.constexpr):
    """One program per row: threshold, candidates (in position order), selection."""
    row = row0 + tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    n = hi - lo
    row_val = val_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * K
    cand_key = cand_key_ptr + tl.program_id(0).to(tl.int64) * SLOTS
    cand_pos = cand_pos_ptr + tl.program_id(0).to(tl.int64) * SLOTS
    thresh = _sample_threshold(row_val, lo, n, K, S, SB, MARGIN_)
    total = _filter_range(row_val, lo, hi, lo, thresh, cand_key, cand_pos, SLOTS, TILE)
    tl.debug_barrier()  # the candidates were stored by other threads of this program
    kk = tl.minimum(K, n)
    if (total > SLOTS) | (total < kk):  # threshold missed: exact radix select over the whole row
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, TILE)
    else:
        r = tl.arange(0, SLOTS)
        ok = r < total
        key = tl.where(ok, tl.load(cand_key + r, mask=ok, other=0), MIN32)
        pos = tl.load(cand_pos + r, mask=ok, other=0)
        take = _select(key, pos, total, kk, thresh, n <= S, True)
        take_i = take.to(tl.int32)
        tl.store(out_row + tl.cumsum(take_i, axis=0) - take_i, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


@triton.jit
def _split_threshold_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, n_cols, stride_row, K,
                            HAS_LO: tl.constexpr, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr):
    """Program per row: the threshold, and the row's slot counter reset for the filter launch."""
    row = tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    tl.store(thresh_ptr + row, _sample_threshold(row_val, lo, hi - lo, K, S, SB, MARGIN_))
    tl.store(fill_ptr + row, 0)


@triton.jit
def _split_chunk(lo, hi, P, p, TILE: tl.constexpr):
    """Chunk p of the row's P equal chunks (a multiple of TILE entries, so every tile starts aligned)."""
    chunk = tl.cdiv(tl.cdiv(hi - lo, P), TILE) * TILE
    return chunk, tl.minimum(lo + p * chunk, hi), tl.minimum(lo + (p + 1) * chunk, hi)


@triton.jit
def _split_filter_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr,
                         n_cols, stride_row, P, HAS_LO: tl.constexpr, SLOTS: tl.constexpr, TILE: tl.constexpr):
    """Program (row, p): counts chunk p's candidates, reserves that many consecutive slots with one atomic
    add (so every chunk is one segment, in position order inside), writes them, and records the segment
    (first slot, count) in seg[row, p]. Chunks of one tile are filtered once, from registers."""
    row = tl.program_id(0)
    p = tl.program_id(1)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    _, c_lo, c_hi = _split_chunk(lo, hi, P, p, TILE)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    thresh = tl.load(thresh_ptr + row)
    base_row = row.to(tl.int64) * SLOTS
    if c_hi - c_lo <= TILE:
        offs = c_lo + tl.arange(0, TILE)
        key, take, take_i = _tile_candidates(row_val, offs, c_hi, thresh)
        count = tl.sum(take_i, axis=0)
        first = tl.zeros([], tl.int32)
        if count > 0:
            first = tl.atomic_add(fill_ptr + row, count, sem="relaxed")
            slot = first + tl.cumsum(take_i, axis=0) - take_i
            keep = take & (slot < SLOTS)
            tl.store(cand_key_ptr + base_row + slot, key, mask=keep)
            tl.store(cand_pos_ptr + base_row + slot, (offs - lo).to(tl.int32), mask=keep)
    else:
        count = tl.zeros([], tl.int32)
        for start in range(c_lo, c_hi, TILE):
            tile_take = _tile_candidates(row_val, start + tl.arange(0, TILE), c_hi, thresh)[2]
            count += tl.sum(tile_take, axis=0)
        first = tl.zeros([], tl.int32)
        if count > 0:
            first = tl.atomic_add(fill_ptr + row, count, sem="relaxed")
            room = tl.maximum(tl.minimum(SLOTS - first, count), 0)
            _filter_range(row_val, c_lo, c_hi, lo, thresh, cand_key_ptr + base_row + first,
                          cand_pos_ptr + base_row + first, room, TILE)
    tl.store(seg_ptr + (row * P + p) * 2, first)
    tl.store(seg_ptr + (row * P + p) * 2 + 1, count)


@triton.jit
def _split_finish_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                         n_cols, stride_row, K, P, HAS_LO: tl.constexpr, S: tl.constexpr, SLOTS: tl.constexpr,
                         MAXP: tl.constexpr, TILE: tl.constexpr):
    """Program per row: selects among the row's candidate segments and writes the top k in position order.

    The output slot of a taken candidate i of chunk c is (taken in chunks < c) + (taken before i in c's
    segment) = before[c] + E[i] - E[first[c]], with E the exclusive cumsum of `take` in slot order."""
    row = tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * K
    total = tl.load(fill_ptr + row)
    kk = tl.minimum(K, hi - lo)
    if (total > SLOTS) | (total < kk):  # threshold missed: exact radix select
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, TILE)
    else:
        base_row = row.to(tl.int64) * SLOTS
        r = tl.arange(0, SLOTS)
        ok = r < total
        key = tl.where(ok, tl.load(cand_key_ptr + base_row + r, mask=ok, other=0), MIN32)
        pos = tl.load(cand_pos_ptr + base_row + r, mask=ok, other=0)
        take = _select(key, pos, total, kk, tl.load(thresh_ptr + row), hi - lo <= S, False)
        take_i = take.to(tl.int32)
        excl = tl.cumsum(take_i, axis=0) - take_i
        # E and E + take go through the consumed candidate slots, so each chunk can read them at its
        # segment's first and last slot
        tl.debug_barrier()
        tl.store(cand_key_ptr + base_row + r, excl, mask=ok)
        tl.store(cand_pos_ptr + base_row + r, excl + take_i, mask=ok)
        tl.debug_barrier()
        c = tl.arange(0, MAXP)
        seg = seg_ptr + (row * P + c) * 2
        first = tl.load(seg, mask=c < P, other=0)
        cnt = tl.load(seg + 1, mask=c < P, other=0)
        has = (c < P) & (cnt > 0)
        e_first = tl.load(cand_key_ptr + base_row + first, mask=has, other=0)
        taken = tl.load(cand_pos_ptr + base_row + first + cnt - 1, mask=has, other=0) - e_first
        delta = tl.cumsum(taken, axis=0) - taken - e_first
        tl.debug_barrier()
        tl.store(seg, delta, mask=c < P)
        tl.debug_barrier()
        chunk_len, _, _ = _split_chunk(lo, hi, P, 0, TILE)
        slot = tl.load(seg_ptr + (row * P + pos // tl.maximum(chunk_len, 1)) * 2, mask=take, other=0) + excl
        tl.store(out_row + slot, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


def auto_splits(max_len: int, tile: int = SPLIT_TILE) -> int:
    """Filter programs per row in split mode: one per tile of entries, at most 512 (2048-entry tiles: 128 at
    256K, 512 at 1M)."""
    return max(1, min(MAX_SPLITS, -(-max_len // tile)))


def splits_for(rows: int, n: int, splits: int | None, tile: int | None) -> int:
    """Filter programs per row: one program per row for >= 64 rows (plenty of programs), else `auto_splits`."""
    if splits is None:
        splits = 1 if rows >= 64 else auto_splits(n, tile or SPLIT_TILE)
    return max(1, min(int(splits), MAX_SPLITS))


def _warps_for(elements: int) -> int:
    """Warps for a program holding `elements` values per tensor: 16 to 32 per thread, 4 to 16 warps."""
    return max(4, min(16, elements // 512))


def topk_ranges(scores: torch.Tensor, starts: torch.Tensor | None, ends: torch.Tensor, k: int, *,
                splits: int | None = None, method: str = "auto", tile: int | None = None, num_warps: int = 4,
                row_chunk: int = 4096, sample: int = SAMPLE, out: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k positions of each row's valid range [starts[r], ends[r]) of `scores` [R, N] float32.

    Returns int32 [R, k]: positions relative to starts[r] (starts=None: 0), ascending, -1 padded (see
    the module doc for the tie rule). splits: filter programs per row (default: one program per row for
    everything when there are >= 64 rows, else `auto_splits(N, tile)`); method "sample" ("filter" is
    accepted as its former name), "radix" (one program per row, radix select only) or "auto" (default:
    radix for fewer than 64 rows of at most RADIX_MAX_LEN entries, sample otherwise); tile: entries per
    loop step (split mode: also the chunk of one filter program, default 2048, so a 1M row is 512 one-tile
    chunks; one program per row: default 4096); num_warps: warps of the split filter programs (small
    programs, many per multiprocessor, hide the latency of their load -> atomic -> store chain; the radix
    method under "auto" uses 8); row_chunk: rows per launch in one-program-per-row mode (bounds the candidate workspace to row_chunk * 8k * 8 bytes); sample:
    entries read to pick the threshold (a power of two >= 512; smaller only to test the sampled path on
    short rows); out: optional preallocated int32 [R, k].
    """
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be a 2-D float32 tensor, got {tuple(scores.shape)} {scores.dtype}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if method not in ("auto", "sample", "filter", "radix"):
        raise ValueError(f"method must be 'auto', 'sample' or 'radix', got {method!r}")
    if sample < 512 or sample & (sample - 1):
        raise ValueError(f"sample must be a power of two >= 512, got {sample}")
    rows, n = scores.shape
    if (starts is not None and starts.shape != (rows,)) or ends.shape != (rows,):
        got = (tuple(starts.shape) if starts is not None else None, tuple(ends.shape))
        raise ValueError(f"starts/ends must have shape ({rows},), got {got}")
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    dev = scores.device
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=dev)
    elif out.shape != (rows, k) or out.dtype != torch.int32 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int32 [{rows}, {k}] tensor, got {tuple(out.shape)} {out.dtype}")
    if rows == 0:
        return out
    # no clamping here: the kernels clamp, so a call is only its launches (cheap to capture in a graph)
    if starts is not None:
        starts = starts.to(device=dev, dtype=torch.int32).contiguous()
    ends = ends.to(device=dev, dtype=torch.int32).contiguous()
    lo_arg = starts if starts is not None else ends
    has_lo = starts is not None
    if method == "auto":
        short = rows < 64 and n <= RADIX_MAX_LEN and splits is None
        method, tile, num_warps = ("radix", tile or 4096, 8) if short else ("sample", tile, num_warps)
    if tile is None:
        tile = SPLIT_TILE if splits_for(rows, n, splits, None) > 1 else ROW_TILE
    if method == "radix":
        _chunk_topk_kernel[(rows, 1)](
            scores, scores, lo_arg, ends, out, scores, n, scores.stride(0), k, k,
            HAS_LO=has_lo, HAS_HI=True, HAS_IDX=False, WRITE_VAL=False, NB=RADIX_BINS[8], BLOCK=tile,
            num_warps=num_warps)
        return out
    # >= ~2.7x the expected candidates (MARGIN * k); one size for every k <= 512 keeps specialisations few
    slots = max(4096, 8 * triton.next_power_of_2(k))
    common = dict(HAS_LO=has_lo)
    sampling = dict(S=sample, SB=SAMPLE_BLOCK, MARGIN_=MARGIN)
    splits = splits_for(rows, n, splits, tile)
    if splits == 1:
        warps = _warps_for(max(sample, slots))
        for row0 in range(0, rows, row_chunk):
            nrows = min(row_chunk, rows - row0)
            cand_key = torch.empty((nrows, slots), dtype=torch.int32, device=dev)
            cand_pos = torch.empty((nrows, slots), dtype=torch.int32, device=dev)
            _topk_row_kernel[(nrows,)](scores, lo_arg, ends, cand_key, cand_pos, out, n, scores.stride(0), k, row0,
                                       **common, **sampling, SLOTS=slots, TILE=tile, num_warps=warps)
        return out
    thresh = torch.empty((rows,), dtype=torch.int32, device=dev)
    fill = torch.empty((rows,), dtype=torch.int32, device=dev)  # zeroed by the threshold launch
    cand_key = torch.empty((rows, slots), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((rows, slots), dtype=torch.int32, device=dev)
    seg = torch.empty((rows, splits, 2), dtype=torch.int32, device=dev)
    _split_threshold_kernel[(rows,)](scores, lo_arg, ends, thresh, fill, n, scores.stride(0), k, **common,
                                     **sampling, num_warps=_warps_for(sample))
    _split_filter_kernel[(rows, splits)](scores, lo_arg, ends, thresh, fill, cand_key, cand_pos, seg, n,
                                         scores.stride(0), splits, **common, SLOTS=slots, TILE=tile,
                                         num_warps=num_warps)
    _split_finish_kernel[(rows,)](scores, lo_arg, ends, thresh, fill, cand_key, cand_pos, seg, out, n,
                                  scores.stride(0), k, splits, **common, S=sample, SLOTS=slots, MAXP=MAX_SPLITS,
                                  TILE=tile, num_warps=_warps_for(slots))
    return out


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512, *, splits: int | None = None,
         method: str = "auto", tile: int | None = None, num_warps: int = 4, sample: int = SAMPLE,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """CSA top-K: the k best compressed entries of each request.

    scores: [B, N] float32, entry j of request b valid for j < lengths[b] (lengths [B], any int dtype,
    clamped to [0, N]). Returns int32 [B, k]: entry positions (0-based from the request's first entry,
    which is what vLLM's and SGLang's sparse-attention kernels expect before they map positions to KV
    slots), ascending, padded with -1 when lengths[b] < k. Ties: the larger value first, then the lower
    position. With fewer than 64 rows each long row is split over up to 512 filter programs (`auto_splits`).
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    if lengths.shape != (scores.shape[0],):
        raise ValueError(f"lengths must have shape ({scores.shape[0]},), got {tuple(lengths.shape)}")
    return topk_ranges(scores, None, lengths, k, splits=splits, method=method, tile=tile, num_warps=num_warps,
                       sample=sample, out=out)
