"""Exact, deterministic top-k selection over ragged rows of float32 scores (Triton).

Used twice in zoe: CSA top-K (top 512 of up to ~1M compressed-entry scores per request, DeepSeek-V4-Pro,
seed table A3) and the DSA indexer's top 2048 (`zoe_kernels.dsa.indexer_topk`).

Selection rule (deterministic ties): a row's selected set is the k largest entries ordered by
(value descending, position ascending): among equal values the lower position wins. The indices are
returned in ascending position order (not by value), followed by -1 padding when a row has fewer than
k valid entries. NaN scores are not supported; -inf is a valid score; -0.0 ranks under +0.0 (the keys' order).

Method "sample" (no sorting network anywhere, so compiles stay short):
1. threshold: read a fixed sample of S entries of the row (S/SB aligned blocks of SB contiguous entries
   spread evenly; the whole row when it has <= S entries) and find, by a bitwise search over the
   order-preserving int32 keys (one reduction per bit, stopped early: `_rank_bound` in topk_search.py), a key
   T that about MARGIN*k to 1.5*MARGIN*k entries of the row should reach. On a row of <= S entries T is a key exactly
   min(k, n) entries reach, or the exact k-th largest key. On long rows the search first runs over each 32-entry
   group's two largest keys (PAIR_SEARCH), and a full-width row's sample is loaded before its length
   (SPECULATIVE_SAMPLE).
2. filter: every entry with key >= T is a candidate. Each tile of TILE entries counts its candidates,
   reserves that many consecutive slots of the row's SLOTS with one atomic add, and writes (key, position)
   there in position order (a cumsum per tile): one segment per tile. Up to HISTOGRAM_MAX_ENTRIES entries in all
   it also counts each candidate in a histogram of SLOTS bins above T. From FLOAT_FILTER_MIN_ROWS rows the split
   filter compares the floats themselves against T's float (`_key_float`) and writes (bits, position) pairs.
3. finish: over the candidate slots, the same search, started from T (or from the histogram's bin that holds
   the kk-th largest), finds a bound exactly kk candidates reach (taken whole) or else the exact kk-th largest
   value v*; everything above v* is taken, and among entries equal to v* the lowest positions (a binary search
   on positions, when ties straddle the k-th place); a taken entry's output slot is (taken in earlier tiles) +
   (taken before it in its segment), found with `tl.gather` in registers, so positions come out ascending.
The result is exact whenever the candidates include the top k, i.e. when at least min(k, n) entries
reached T and they fit the SLOTS; otherwise (adversarial layouts that fool the sample, massive
ties) the finish falls back to the exact radix select of radix_select.py over the whole row. Both
conditions are checked on the device, so a call is a fixed set of launches (CUDA-graph friendly).

Methods: "auto" (default) uses the radix select alone for fewer than 64 rows of at most 4096 entries (one
launch, faster there), "sample" (the above) otherwise.

Launches: many rows (indexer prefill) or short rows use one program per row that does all three steps
(`_topk_row_kernel`); few long rows (CSA decode) use three launches: one threshold program per row, one filter
program per SPLIT_TILE-entry tile (SPLIT_TILE_MANY from MANY_ROWS rows; or `splits` programs per row taking every
splits-th tile), one finish program per row. On CUDA the one-tile filter loads 16 bytes wide and stores its
candidates as inline PTX in that layout (VECTOR_LOADS). A single row takes two launches: its last filter program to
arrive runs the finish (FUSED_FINISH_MAX_ROWS, on FUSED_TILE-entry tiles at the finish's warps). With pdl (by
default for one row and from PDL_MIN_ROWS rows on CUDA sm_90+) the filter and finish are programmatic dependent
launches: they start while the launch before still runs (the filter issues its tile's load first), then wait for
it (`gdc_wait`) before reading what it wrote; at one row the threshold launch is a dependent too
(PDL_THRESHOLD_MAX_ROWS). Every tuning constant below says why it has its value and how to retune it; the
measurements behind them, and the variants measured slower and removed, are in bench/kernels/sparse_README.md.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.radix_select import RADIX_BINS, _chunk_topk_kernel, _radix_topk_range
from zoe_kernels.csa.topk_search import (MIN32, _bits_key, _group_top_two, _key_float, _pair_bound, _rank_bound,
                                         _select, _signed_key, _unsigned)
from zoe_kernels.platform import gdc_launch_dependents, gdc_wait, has_pdl, has_ptx

# Retune any of these with bench/kernels/sparse_sweep.py (top-K variants at B=1, 8, 32 over 64K-1M entries) and
# check them with bench/kernels/sparse_bench.py; each line says what its value buys.
SAMPLE = 16384  # entries read to pick the threshold (64 KB of float32): enough that MARGIN * k candidates is a tight aim
SAMPLE_BLOCK = 8  # contiguous entries per sample block: one 32-byte sector, the blocks spread over the whole row
MARGIN = 3  # the threshold aims at MARGIN * k candidates: under k happens with ~1e-5 odds on i.i.d. rows
SPLIT_TILE = 2048  # entries per filter tile (one candidate segment) in split mode under MANY_ROWS rows
MAX_TILES = 512  # candidate segments per row under MANY_ROWS rows (the finish reads one per tile); longer rows
# get larger tiles
MANY_ROWS = 8  # from this many rows: SPLIT_TILE_MANY-entry tiles (more programs resident: fewer registers each)
SPLIT_TILE_MANY = 1024  # with up to twice MAX_TILES segments per row (`max_tiles`)
VECTOR_LOADS = True  # one-tile filters on CUDA: 16-byte loads and inline-PTX stores in their layout (no conversion)
FILTER_PROGRAMS = 1 << 15  # filter programs over all rows in split mode (see auto_splits): B=32 x 1M, one per tile
ROW_TILE = 4096  # entries per loop step in one-program-per-row mode
RADIX_MAX_LEN = 4096  # "auto" takes the one-launch radix select for few rows this short (three launches cost more)
THRESHOLD_WARPS = 16  # warps of the threshold program (S = 16384 sampled entries: 32 per thread; 32 were no faster)
FINISH_WARPS = 8  # warps of a finish launch per 4096 candidate slots (16 slots per thread), at most 16
PDL_MAX_ROWS = 1  # pdl up to this many rows (it slowed B=8: the filter's early programs wait holding slots)
PDL_MIN_ROWS = 32  # and from this many rows on
HISTOGRAM_MAX_ENTRIES = 1 << 21  # up to this many entries in all the filter also fills a histogram of its candidates
# (the finish then starts its search from the bin holding the k-th largest: `_histogram_start`); above it the
# filter is bound by instruction issue and the histogram's adds cost more than the search steps they save
FLOAT_FILTER_MIN_ROWS = MANY_ROWS  # from here the filter compares floats (`_key_float`) and stores 8-byte pairs:
# fewer instructions per entry, where the filter's issue rate bounds the call (not at one row: the finish's loads grow)
HALF_SCAN = True  # one-tile filters count two half-tiles' candidates as one packed int32: one scan chain, not two
PAIR_SEARCH = True  # long rows' threshold search first runs over each 32-entry group's two largest keys (`_pair_bound`)
SPECULATIVE_SAMPLE = True  # a full-width row's sample is loaded before its length arrives (no dependent load first)
FUSED_FINISH_MAX_ROWS = 1  # up to this many rows the last filter program runs the finish: one launch fewer
FUSED_TILE = 4096  # the fused filter's tiles: 16 entries per thread at the finish's 8 warps (one wave at B=1 x 1M)
FINISH_PTX_STORE = True  # CUDA: the finish stores its positions as inline PTX in the candidates' layout (no barriers)
PDL_THRESHOLD_MAX_ROWS = 1  # with pdl, up to this many rows the threshold launch waits on the kernel before it
PAIR_MAX_RANK = tl.constexpr(48)
PAIR_GROUPS = tl.constexpr(512)


@triton.jit
def _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO: tl.constexpr):
    lo = 0
    if HAS_LO:
        lo = tl.minimum(tl.maximum(tl.load(lo_ptr + row), 0), n_cols)
    hi = tl.minimum(tl.maximum(tl.load(hi_ptr + row), 0), n_cols)
    return lo, tl.maximum(hi, lo)


@triton.jit
def _sample_offsets(i, lo, n, S: tl.constexpr, SB: tl.constexpr):
    """The sampled positions of the row [lo, lo + n), n > S: S/SB blocks of SB entries, `step` apart (a multiple of
    SB: aligned 16-byte loads, and no 64-bit division per entry), spread over the row."""
    step = tl.multiple_of(((n - SB) // (S // SB - 1)) // SB * SB, SB)
    return lo + (i // SB).to(tl.int64) * step + i % SB


@triton.jit
def _sample_threshold(row_val, lo, n, K, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr,
                      PAIRS: tl.constexpr = False, n_cols=0, SPEC: tl.constexpr = False, PTX: tl.constexpr = False):
    """Step 1: the candidate threshold of the row [lo, lo + n) (see the module doc), and the largest key read.

    SPEC (lo = 0 and n_cols > S): the sample of a row as long as the tensor is loaded before the row's length
    arrives (no dependent load on the way), and loaded again where the row is shorter (PTX: the loads pinned
    before the branch on the length by an inline-PTX move).

    PAIRS (sampled rows aiming at r + r // 2 <= PAIR_MAX_RANK entries): the search first runs over the two largest
    keys of each group of 32 sampled entries (`_group_top_two`: 2 compares per thread and count instead of 32), then
    one count over the whole sample checks its bound; where a group held more than two keys over it (the count then
    exceeds r + r // 2), the exact search goes on from that bound. The bound found reaches r to r + r // 2 sampled
    entries either way."""
    i = tl.arange(0, S)
    if SPEC:
        key_full = _signed_key(tl.load(row_val + _sample_offsets(i, 0, n_cols, S, SB)))
        if PTX:  # pinned before the branch on the length (else the compiler sinks the loads into it)
            key_full = _pinned(key_full)
    sampled = n > S
    if sampled:
        if SPEC:
            key = key_full
            if n != n_cols:
                key = _signed_key(tl.load(row_val + _sample_offsets(i, 0, n, S, SB)))
        else:
            key = _signed_key(tl.load(row_val + _sample_offsets(i, lo, n, S, SB)))
    else:
        key = tl.where(i < n, _signed_key(tl.load(row_val + lo + i, mask=i < n, other=0.0)), MIN32)
    n_ok = tl.minimum(n, S)
    r_sampled = tl.minimum((MARGIN_ * K * S + n - 1) // tl.maximum(n, 1), S)
    r = tl.where(sampled, r_sampled, tl.minimum(K, n))
    # sampled: any bound that r to 1.5 r sample entries reach will do (~3k to ~4.5k candidates expected,
    # well inside the 8k slots); exact rows: a bound exactly min(k, n) entries reach, or the k-th largest
    slack = tl.where(sampled, r // 2, 0)
    if PAIRS:
        c, top = _pair_search(key, r, slack, n_ok, sampled & (r + slack <= PAIR_MAX_RANK))
    else:
        top = tl.max(key, axis=0)
        c, _ = _rank_bound(key, r, tl.zeros([], tl.int64), n_ok, _unsigned(top), slack)
    return (c - 2147483648).to(tl.int32), top


@triton.jit
def _pair_search(key, r, slack, n_ok, use_pairs):
    """`_sample_threshold`'s search with PAIRS: (bound c, largest key). The groups' search decides two bits per
    count, its first count taken with the maximum (`_pair_bound`)."""
    if use_pairs:
        best = _group_top_two(key, PAIR_GROUPS)
        c, _, top = _pair_bound(best, r, slack)
        cnt = tl.sum((key >= (c - 2147483648).to(tl.int32)).to(tl.int32), axis=0)
        if cnt > r + slack:  # some group held more than two keys over c: the exact search goes on from c
            c, _ = _rank_bound(key, r, c, cnt, _unsigned(top), slack)
    else:
        top = tl.max(key, axis=0)
        c, _ = _rank_bound(key, r, tl.zeros([], tl.int64), n_ok, _unsigned(top), slack)
    return c, top


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
    thresh, _ = _sample_threshold(row_val, lo, n, K, S, SB, MARGIN_)
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
        take = _select(key, pos, total, kk, thresh, n <= S, 0, 0, True, False)
        take_i = take.to(tl.int32)
        tl.store(out_row + tl.cumsum(take_i, axis=0) - take_i, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


@triton.jit
def _split_threshold_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, n_cols, stride_row, K,
                            HAS_LO: tl.constexpr, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr,
                            SLOTS: tl.constexpr, HIST: tl.constexpr, FLT: tl.constexpr, PDL: tl.constexpr,
                            PAIRS: tl.constexpr = False, SPEC: tl.constexpr = False, PTX: tl.constexpr = False,
                            FUSED: tl.constexpr = False, WAIT: tl.constexpr = False):
    """Program per row: the threshold (thresh[row, 0]), and the row's count of filled slots reset for the filter
    launch (FUSED: also its filter programs' ticket, fill[rows + row]). FLT (the float filter): a threshold of +0.0
    (key 0, which no float compare matches) becomes -0.0 (key -1): a lower threshold only adds candidates (the -0.0
    entries), and the finish then skips the exact-row shortcut. HIST: also the histogram's bin width 2^shift (thresh[row, 1]: the sampled keys from the threshold to
    their maximum span under SLOTS / 2 bins) and its SLOTS bins zeroed.
    PDL: the filter launch may start at once (it waits for this grid before reading what it writes). PAIRS, SPEC,
    PTX: see `_sample_threshold`. WAIT: this launch is itself a programmatic dependent of the kernel before it (whatever
    that is: it may write the scores), so it waits for that grid before reading or writing anything, and lets the
    filter launch only then (the filter loads its tile before its own wait)."""
    row = tl.program_id(0)
    if WAIT:
        gdc_wait()
    if PDL:
        gdc_launch_dependents()
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    thresh, top = _sample_threshold(row_val, lo, hi - lo, K, S, SB, MARGIN_, PAIRS, n_cols, SPEC, PTX)
    if FLT:
        thresh = tl.where(thresh == 0, -1, thresh)
    tl.store(thresh_ptr + row * 2, thresh)
    tl.store(fill_ptr + row, 0)
    if FUSED:
        tl.store(fill_ptr + tl.num_programs(0) + row, 0)
    if HIST:
        span = tl.maximum(_unsigned(top) - _unsigned(thresh), 0)
        shift = tl.zeros([], tl.int32)
        while (span >> shift) >= SLOTS // 2:
            shift += 1
        tl.store(thresh_ptr + row * 2 + 1, shift)
        tl.store(hist_ptr + row.to(tl.int64) * SLOTS + tl.arange(0, SLOTS), tl.zeros([SLOTS], tl.int32))


@triton.jit
def _finish_row(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr,
                out_ptr, n_cols, stride_row, K, row, HAS_LO: tl.constexpr, S: tl.constexpr, SLOTS: tl.constexpr,
                MAXT: tl.constexpr, TILE: tl.constexpr, HIST: tl.constexpr, FLT: tl.constexpr, PDL: tl.constexpr,
                PTX_OUT: tl.constexpr = False):
    """Step 3 for one row: selects among the row's candidate segments (one per tile) and writes the top k in
    position order. Reads what other programs wrote (after the launch boundary), through L2 (`.cg`).

    The output slot of a taken candidate i of tile t is (taken in tiles < t) + (taken before i in t's
    segment) = before[t] + E[i] - E[first[t]], with E the exclusive cumsum of `take` in slot order, read at the
    segments' ends, and before[t] at each candidate's tile, by `tl.gather` in registers (not through global
    memory: three round trips through L2); the segments' first and last taken counts come from one gather of the
    inclusive sums. FLT: the slots hold (float bits, position) pairs, int64 in cand_key_ptr. HIST: the search
    starts from the filter's histogram in hist_ptr. The candidates, segments, histogram, threshold and bin width
    are loaded with the slot count (unmasked, before the branch on it), so their latencies overlap. PTX_OUT
    (CUDA): the taken positions are stored as inline PTX in the candidates' layout (`_store_scattered`): a tl.store
    through the scattered output slots converts the pointers, positions and mask to a layout of its own through
    shared memory first (sm_90a SASS: 14 block barriers)."""
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * K
    base_row = row.to(tl.int64) * SLOTS
    r = tl.arange(0, SLOTS)
    c = tl.arange(0, MAXT)
    n_tiles = tl.cdiv(hi - lo, TILE)
    seg = seg_ptr + (row * MAXT + c) * 2
    if PDL:  # launched before the filter grid ended: wait for it (and its writes) here
        gdc_wait()
    # unmasked (16-byte) loads of all SLOTS: the slots past `total` hold garbage, never used
    bits, pos, first, cnt, hist = _load_candidates(cand_key_ptr + base_row, cand_pos_ptr + base_row, seg,
                                                   hist_ptr + base_row, c < n_tiles, SLOTS, HIST, FLT)
    thresh = tl.load(thresh_ptr + row * 2)
    shift = tl.load(thresh_ptr + row * 2 + 1)
    total = tl.load(fill_ptr + row, cache_modifier=".cg")
    kk = tl.minimum(K, hi - lo)
    if (total > SLOTS) | (total < kk):  # threshold missed: exact radix select
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, TILE)
    else:
        ok = r < total
        key = tl.where(ok, bits, MIN32)
        exact = hi - lo <= S
        if FLT:
            exact = exact & (thresh != -1)  # -1 may be a lowered +0.0 (see _split_threshold_kernel)
        take = _select(key, pos, total, kk, thresh, exact, hist, shift, False, HIST)
        take_i = take.to(tl.int32)
        incl = tl.cumsum(take_i, axis=0)
        excl = incl - take_i
        has = (c < n_tiles) & (cnt > 0)  # (every segment ends inside the SLOTS here: total <= SLOTS)
        # both ends from the inclusive sums: the one before the first slot, and the last slot
        ends = tl.gather(incl, tl.reshape(tl.join(tl.maximum(first - 1, 0), first + cnt - 1), [2 * MAXT]), 0)
        before_first, at_last = tl.split(tl.reshape(ends, [MAXT, 2]))
        e_first = tl.where(has & (first > 0), before_first, 0)
        taken = tl.where(has, at_last, 0) - e_first
        delta = tl.cumsum(taken, axis=0) - taken - e_first
        slot = tl.gather(delta, tl.where(take, pos // TILE, 0), 0) + excl
        if PTX_OUT:
            _store_scattered(out_row + slot, pos, take)
        else:
            tl.store(out_row + slot, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


@triton.jit
def _load_candidates(cand_key, cand_pos, seg, hist, seg_ok, SLOTS: tl.constexpr, HIST: tl.constexpr,
                     FLT: tl.constexpr):
    """A row's SLOTS candidate slots as (keys, or FLT float bits converted to keys; positions), its segments (first
    slot, count; 0 where not seg_ok) and (HIST) its histogram's SLOTS bins, read through L2."""
    r = tl.arange(0, SLOTS)
    if FLT:
        pair = tl.load(cand_key + r, cache_modifier=".cg")
        key = _bits_key(pair.to(tl.int32))
        pos = (pair >> 32).to(tl.int32)
    else:
        key = tl.load(cand_key + r, cache_modifier=".cg")
        pos = tl.load(cand_pos + r, cache_modifier=".cg")
    first = tl.load(seg, mask=seg_ok, other=0, cache_modifier=".cg")
    cnt = tl.load(seg + 1, mask=seg_ok, other=0, cache_modifier=".cg")
    counts = tl.zeros([SLOTS], tl.int32)
    if HIST:
        counts = tl.load(hist + r, cache_modifier=".cg")
    return key, pos, first, cnt, counts


@triton.jit
def _tile_offsets(start, TILE: tl.constexpr, HALVES: tl.constexpr):
    """Positions start .. start + TILE - 1, flat, or (HALVES) as [2, TILE // 2]: the tile's two halves as rows."""
    if HALVES:
        offs = start + tl.arange(0, 2)[:, None] * (TILE // 2) + tl.arange(0, TILE // 2)[None, :]
    else:
        offs = start + tl.arange(0, TILE)
    return offs


@triton.jit
def _load_tile(row_val, start, n, TILE: tl.constexpr, FLT: tl.constexpr, HALVES: tl.constexpr = False):
    """row_val[start : start + TILE] (past n: 0.0, FLT NaN; HALVES: as [2, TILE // 2]): a full tile without a
    mask, so the loads are 16 bytes wide (a masked load of unknown alignment compiles to one 4-byte load per
    entry)."""
    start = tl.multiple_of(start, TILE)
    offs = _tile_offsets(start, TILE, HALVES)
    if start + TILE <= n:
        x = tl.load(row_val + offs)
    else:
        x = tl.load(row_val + offs, mask=offs < n, other=float("nan") if FLT else 0.0)
    return x


@triton.jit
def _store_scattered(ptr, val, mask):
    """ptr[i] = val[i] where mask[i], as inline PTX (CUDA only): a tl.store through a non-contiguous pointer
    gets a layout of its own (one entry per thread in turn), so the values of a 16-byte load would be converted
    through shared memory first; this store stays in the producer's layout."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptr, val, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _store_pair_scattered(base, slot, lo, hi, mask):
    """base[slot[i]] = (lo[i], hi[i]) (int64 slots: two int32 as one 8-byte store, lo at the lower address) where
    mask[i], as inline PTX in the producer's layout (CUDA only; see `_store_scattered`); the address is one wide
    multiply-add of the 32-bit slot."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b64 a; setp.ne.b32 p, $5, 0; mad.wide.s32 a, $2, 8, $1; "
        "@p st.global.v2.b32 [a], {$3, $4}; mov.b32 $0, 0; }",
        "=r,l,r,r,r,r", [base, slot, lo, hi, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _add_one_scattered(ptr, mask):
    """ptr[i] += 1 where mask[i] (a fire-and-forget `red`), as inline PTX in the producer's layout (CUDA only;
    see `_store_scattered`)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p red.global.add.u32 [$1], 1; mov.b32 $0, 0; }",
        "=r,l,r", [ptr, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _pinned(x):
    """x through an inline-PTX move (CUDA only): the compiler keeps it (and the loads it waits for) where it is."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _filter_tile(x, offs, t, n, thresh, shift, fill, cand_key, cand_pos, seg, hist, SLOTS: tl.constexpr,
                 TILE: tl.constexpr, HIST: tl.constexpr, VEC: tl.constexpr, FLT: tl.constexpr,
                 HALVES: tl.constexpr = False):
    """Step 2 for tile t (entries x at positions offs, the same layout as x's load: no conversion): reserve
    slots for its candidates (one atomic add), write them in position order, record the segment (first slot,
    count) in seg[t]. HIST: count each candidate in its bin of the row's histogram (key >> shift from the
    threshold's, the last bin open above; see `_histogram_start`). VEC: the stores (and the histogram's adds)
    as inline PTX in x's layout (`_store_scattered`). FLT: x holds NaN past n; floats compared against the
    threshold's float, (float bits, position) written as one 8-byte store to cand_key (int64 slots). HALVES: x
    and offs are [2, TILE // 2], the tile's halves as rows (each thread's entries of both halves in its registers);
    the two halves' candidates are counted as one packed int32 (16 bits each), so the slots come from one scan chain
    over TILE // 2 instead of a cumsum over TILE's two register chains."""
    if FLT:
        take = x >= _key_float(thresh)  # NaN past n: never taken
    else:
        key = _signed_key(x)
        take = (offs < n) & (key >= thresh)
    take_i = take.to(tl.int32)
    if HALVES:  # in-thread sum over the halves, then one block reduction of (first half, second half) counts
        half = tl.arange(0, 2)[:, None]
        packed = tl.sum(take_i << (half * 16), axis=0, keep_dims=True)  # [1, TILE // 2]: the loads' layout
        both = tl.sum(tl.sum(packed, axis=1), axis=0)
        n_low = both & 0xFFFF
        count = n_low + (both >> 16)
    else:
        count = tl.sum(take_i, axis=0)
    first = tl.zeros([], tl.int32)
    if count > 0:
        first = tl.atomic_add(fill, count, sem="relaxed")
        if HALVES:  # the second half's candidates follow the first half's n_low
            excl = tl.cumsum(packed, axis=1) - packed
            slot = first + tl.where(half == 0, excl & 0xFFFF, n_low + (excl >> 16))
        else:
            slot = first + tl.cumsum(take_i, axis=0) - take_i
        keep = take & (slot < SLOTS)
        if FLT:
            bits = x.to(tl.int32, bitcast=True)
            if VEC:
                _store_pair_scattered(cand_key, slot, bits, offs, keep)
            else:
                pair = (offs.to(tl.int64) << 32) | (bits.to(tl.int64) & 0xFFFFFFFF)
                tl.store(cand_key + slot, pair, mask=keep)
        elif VEC:
            _store_scattered(cand_key + slot, key, keep)
            _store_scattered(cand_pos + slot, offs, keep)
        else:
            tl.store(cand_key + slot, key, mask=keep)
            tl.store(cand_pos + slot, offs, mask=keep)
        if HIST:  # min before the difference: no overflow for keys far above the sample's maximum
            if FLT:
                key = _signed_key(x)
            base = thresh >> shift
            b = tl.minimum(key >> shift, base + (SLOTS - 1)) - base
            if VEC:
                _add_one_scattered(hist + b, take)
            else:
                tl.atomic_add(hist + b, 1, mask=take, sem="relaxed")
    if t * TILE < n:
        tl.store(seg + t * 2, first)
        tl.store(seg + t * 2 + 1, count)


@triton.jit
def _split_filter_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, cand_key_ptr, cand_pos_ptr,
                         seg_ptr, out_ptr, n_cols, stride_row, K, P, HAS_LO: tl.constexpr, S: tl.constexpr,
                         SLOTS: tl.constexpr, MAXT: tl.constexpr, TILE: tl.constexpr, HIST: tl.constexpr,
                         ONE_TILE: tl.constexpr, VEC: tl.constexpr, FLT: tl.constexpr, PDL: tl.constexpr,
                         HALVES: tl.constexpr = False, FUSED: tl.constexpr = False, PTX_OUT: tl.constexpr = False):
    """Program (row, p) of P: tiles p, p + P, ... of the row. Per tile: count its candidates, reserve that
    many consecutive slots with one atomic add (each tile is one segment, in position order inside), write
    them, record the segment (first slot, count) in seg[row, tile]. The next tile's load is issued before the
    current tile's reduction, atomic and stores, so a program always has a load in flight.

    PDL: launched while the threshold grid still runs, a program
    issues its tile's load, then waits for that grid (the threshold and the reset counters) and lets the
    finish launch start. FUSED: the row's last program to arrive (a ticket, fill[rows + row], taken with
    acquire-release semantics after a block barrier) runs the finish (`_finish_row`; PTX_OUT there), so
    there is no finish launch."""
    row = tl.program_id(0)
    p = tl.program_id(1)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    n = hi - lo
    row_val = val_ptr + row.to(tl.int64) * stride_row + lo
    base_row = row.to(tl.int64) * SLOTS
    if ONE_TILE:  # P covers the row: no loop, fewer registers, more programs resident
        # without VEC a start of unknown alignment (min with n) gives one 4-byte load per entry in the layout
        # tl.store gives the scattered candidate stores; 16-byte loads would be converted to it through shared
        # memory (slower). VEC: 16-byte loads of an aligned tile and inline-PTX stores in their layout
        if VEC | HALVES:
            offs = _tile_offsets(p * TILE, TILE, HALVES)
            x = _load_tile(row_val, p * TILE, n, TILE, FLT, HALVES)
        else:
            offs = tl.minimum(p * TILE, n) + tl.arange(0, TILE)
            x = tl.load(row_val + offs, mask=offs < n, other=float("nan") if FLT else 0.0)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        _filter_tile(x, offs, p, n, tl.load(thresh_ptr + row * 2), tl.load(thresh_ptr + row * 2 + 1), fill_ptr + row,
                     cand_key_ptr + base_row, cand_pos_ptr + base_row, seg_ptr + row * MAXT * 2, hist_ptr + base_row,
                     SLOTS, TILE, HIST, VEC, FLT, HALVES)
    else:
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        thresh = tl.load(thresh_ptr + row * 2)
        shift = tl.load(thresh_ptr + row * 2 + 1)
        x = _load_tile(row_val, p * TILE, n, TILE, FLT)
        for t in range(p, tl.cdiv(n, TILE), P):
            x_next = _load_tile(row_val, (t + P) * TILE, n, TILE, FLT)
            _filter_tile(x, t * TILE + tl.arange(0, TILE), t, n, thresh, shift, fill_ptr + row,
                         cand_key_ptr + base_row, cand_pos_ptr + base_row, seg_ptr + row * MAXT * 2,
                         hist_ptr + base_row, SLOTS, TILE, HIST, VEC, FLT)
            x = x_next
    if FUSED:
        tl.debug_barrier()  # every thread's candidate stores precede the release
        if tl.atomic_add(fill_ptr + tl.num_programs(0) + row, 1, sem="acq_rel", scope="gpu") == P - 1:
            _finish_row(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr,
                        out_ptr, n_cols, stride_row, K, row, HAS_LO, S, SLOTS, MAXT, TILE, HIST, FLT, False, PTX_OUT)


@triton.jit
def _split_finish_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, cand_key_ptr, cand_pos_ptr,
                         seg_ptr, out_ptr, n_cols, stride_row, K, HAS_LO: tl.constexpr, S: tl.constexpr,
                         SLOTS: tl.constexpr, MAXT: tl.constexpr, TILE: tl.constexpr, HIST: tl.constexpr,
                         FLT: tl.constexpr, PDL: tl.constexpr, PTX_OUT: tl.constexpr = False):
    """Program per row: the finish (step 3; PTX_OUT: see `_finish_row`)."""
    _finish_row(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, hist_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                n_cols, stride_row, K, tl.program_id(0), HAS_LO, S, SLOTS, MAXT, TILE, HIST, FLT, PDL, PTX_OUT)


def max_tiles(rows: int) -> int:
    """Candidate segments (filter tiles) per row in split mode: MAX_TILES, twice that from MANY_ROWS rows."""
    return MAX_TILES * SPLIT_TILE // SPLIT_TILE_MANY if rows >= MANY_ROWS else MAX_TILES


def split_tile(max_len: int, tile: int | None = None, rows: int = 1) -> int:
    """Entries per filter tile (one candidate segment each) in split mode: `tile`, or SPLIT_TILE (SPLIT_TILE_MANY
    from MANY_ROWS rows), doubled until a row has at most `max_tiles(rows)` tiles (one row: 2048 up to 1M
    entries, 4096 up to 2M; 8 rows or more: 1024 up to 1M)."""
    tile = tile or (SPLIT_TILE_MANY if rows >= MANY_ROWS else SPLIT_TILE)
    while -(-max_len // tile) > max_tiles(rows):
        tile *= 2
    return tile


def auto_splits(rows: int, max_len: int, tile: int | None = None) -> int:
    """Filter programs per row in split mode: one per tile, up to FILTER_PROGRAMS in all (B=32 x 1M: 1024 per
    row, 32768 programs)."""
    tiles = -(-max_len // split_tile(max_len, tile, rows))
    return max(1, min(tiles, FILTER_PROGRAMS // max(rows, 1)))


def splits_for(rows: int, n: int, splits: int | None, tile: int | None) -> int:
    """Filter programs per row: one program per row for >= 64 rows (plenty of programs), else `auto_splits`."""
    if splits is None:
        splits = 1 if rows >= 64 else auto_splits(rows, n, tile)
    return max(1, int(splits))


def pdl_default(scores: torch.Tensor, rows: int) -> bool:
    """Whether split launches are programmatic dependents by default: at most PDL_MAX_ROWS or at least PDL_MIN_ROWS
    rows on a device that has it (faster at B=1 and B=32 on an H200, slower at B=8)."""
    few_or_many = rows <= PDL_MAX_ROWS or rows >= PDL_MIN_ROWS
    return scores.is_cuda and few_or_many and has_pdl(scores.device.index or 0)


def _warps_for(elements: int) -> int:
    """Warps for a program holding `elements` values per tensor: 16 to 32 per thread, 4 to 16 warps."""
    return max(4, min(16, elements // 512))


def topk_ranges(scores: torch.Tensor, starts: torch.Tensor | None, ends: torch.Tensor, k: int, *,
                splits: int | None = None, method: str = "auto", tile: int | None = None, num_warps: int = 4,
                row_chunk: int = 4096, sample: int = SAMPLE, pdl: bool | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k positions of each row's valid range [starts[r], ends[r]) of `scores` [R, N] float32.

    Returns int32 [R, k]: positions relative to starts[r] (starts=None: 0), ascending, -1 padded (see
    the module doc for the tie rule). splits: filter programs per row (default: one program per row for
    everything when there are >= 64 rows, else `auto_splits(R, N, tile)`; each program takes every
    splits-th tile of its row); method "sample" ("filter" is
    accepted as its former name), "radix" (one program per row, radix select only) or "auto" (default:
    radix for fewer than 64 rows of at most RADIX_MAX_LEN entries, sample otherwise); tile: entries per
    loop step (split mode: also one candidate segment, default 2048, 1024 from MANY_ROWS rows, FUSED_TILE up to
    FUSED_FINISH_MAX_ROWS rows, doubled while a row has more than `max_tiles(R)` tiles; one program per row: default
    4096); num_warps: warps of the split filter programs (the radix method under "auto" uses 8; filter programs that
    run the finish, up to FUSED_FINISH_MAX_ROWS rows, take the finish's); row_chunk: rows per launch in one-program-per-row mode (bounds the candidate workspace to row_chunk * 8k * 8 bytes); sample:
    entries read to pick the threshold (a power of two >= 512; smaller only to test the sampled path on
    short rows); pdl: the split filter and finish launches start before
    the launch they depend on has ended (programmatic dependent launch; default: `pdl_default`; up to
    PDL_THRESHOLD_MAX_ROWS rows the threshold launch too, after the kernel before it);
    out: optional preallocated int32 [R, k].
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
    pdl = pdl_default(scores, rows) if pdl is None else bool(pdl)
    if pdl and gdc_wait is None:
        raise ValueError("pdl=True needs a Triton with triton.language.extra.cuda.gdc_wait")
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
    fused = method != "radix" and rows <= FUSED_FINISH_MAX_ROWS and splits_for(rows, n, splits, tile) > 1
    if tile is None:
        split_base = SPLIT_TILE_MANY if rows >= MANY_ROWS else SPLIT_TILE
        tile = split_base if splits_for(rows, n, splits, None) > 1 else ROW_TILE
        if fused:
            tile = FUSED_TILE
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
    tile = split_tile(n, tile, rows)
    maxt = max_tiles(rows)
    thresh = torch.empty((rows, 2), dtype=torch.int32, device=dev)  # threshold key, histogram bin shift
    # slots filled (and fused: the filter programs' tickets), zeroed by the threshold launch
    fill = torch.empty((2 * rows if fused else rows,), dtype=torch.int32, device=dev)
    flt = rows >= FLOAT_FILTER_MIN_ROWS
    if flt:  # (float bits, position) pairs
        cand_key = cand_pos = torch.empty((rows, slots), dtype=torch.int64, device=dev)
    else:
        cand_key = torch.empty((rows, slots), dtype=torch.int32, device=dev)
        cand_pos = torch.empty((rows, slots), dtype=torch.int32, device=dev)
    seg = torch.empty((rows, maxt, 2), dtype=torch.int32, device=dev)
    with_hist = rows * n <= HISTOGRAM_MAX_ENTRIES
    hist = torch.empty((rows, slots) if with_hist else (1,), dtype=torch.int32, device=dev)  # zeroed there too
    bufs = (thresh, fill, hist, cand_key, cand_pos, seg, out, n, scores.stride(0), k)
    shapes = dict(**common, S=sample, SLOTS=slots, MAXT=maxt, TILE=tile, HIST=with_hist, FLT=flt, PDL=pdl)
    dependent = dict(launch_pdl=True) if pdl else {}  # the interpreter knows no such option
    wait = pdl and rows <= PDL_THRESHOLD_MAX_ROWS  # the threshold launch a dependent of the kernel before it
    ptx = scores.is_cuda and has_ptx()  # inline PTX: NVIDIA only
    _split_threshold_kernel[(rows,)](scores, lo_arg, ends, thresh, fill, hist, n, scores.stride(0), k, **common,
                                     **sampling, SLOTS=slots, HIST=with_hist, FLT=flt, PDL=pdl,
                                     PAIRS=PAIR_SEARCH and sample >= 4 * PAIR_GROUPS,
                                     SPEC=SPECULATIVE_SAMPLE and not has_lo and n > sample, PTX=ptx,
                                     FUSED=fused, WAIT=wait, num_warps=THRESHOLD_WARPS,
                                     **(dependent if wait else {}))
    one_tile = splits >= triton.cdiv(n, tile)
    # inline PTX: CUDA only; the programs taking several tiles were not timed with it
    vec = VECTOR_LOADS and one_tile and ptx
    finish_warps = min(16, FINISH_WARPS * slots // 4096)
    finish = dict(PTX_OUT=FINISH_PTX_STORE and ptx)
    _split_filter_kernel[(rows, splits)](scores, lo_arg, ends, *bufs, splits, **shapes, ONE_TILE=one_tile, VEC=vec,
                                         HALVES=HALF_SCAN and one_tile, FUSED=fused, **finish,
                                         num_warps=finish_warps if fused else num_warps, num_stages=1, **dependent)
    if not fused:
        _split_finish_kernel[(rows,)](scores, lo_arg, ends, *bufs, **shapes, **finish, num_warps=finish_warps,
                                      **dependent)
    return out


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512, *, splits: int | None = None,
         method: str = "auto", tile: int | None = None, num_warps: int = 4, sample: int = SAMPLE,
         pdl: bool | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """CSA top-K: the k best compressed entries of each request.

    scores: [B, N] float32, entry j of request b valid for j < lengths[b] (lengths [B], any int dtype,
    clamped to [0, N]). Returns int32 [B, k]: entry positions (0-based from the request's first entry,
    which is what vLLM's and SGLang's sparse-attention kernels expect before they map positions to KV
    slots), ascending, padded with -1 when lengths[b] < k. Ties: the larger value first, then the lower
    position. With fewer than 64 rows each long row is split over several filter programs (`auto_splits`).
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    if lengths.shape != (scores.shape[0],):
        raise ValueError(f"lengths must have shape ({scores.shape[0]},), got {tuple(lengths.shape)}")
    return topk_ranges(scores, None, lengths, k, splits=splits, method=method, tile=tile, num_warps=num_warps,
                       sample=sample, pdl=pdl, out=out)
