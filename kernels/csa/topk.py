"""Exact, deterministic top-k selection over ragged rows of float32 scores (Triton).

Used twice in zoe: CSA top-K (top 512 of up to ~1M compressed-entry scores per request, DeepSeek-V4-Pro,
seed table A3) and the DSA indexer's top 2048 (`zoe_kernels.dsa.indexer_topk`).

Selection rule (deterministic ties): a row's selected set is the k largest entries ordered by
(value descending, position ascending): among equal values the lower position wins. The indices are
returned in ascending position order (not by value), followed by -1 padding when a row has fewer than
k valid entries. NaN scores are not supported; -inf is a valid score.

Method "sample" (no sorting network anywhere, so compiles stay short):
1. threshold: read a fixed sample of S entries of the row (S/SB aligned blocks of SB contiguous entries
   spread evenly; the whole row when it has <= S entries) and find, by a bitwise search over the
   order-preserving int32 keys (one reduction per bit, stopped early: `_rank_bound` in topk_search.py), a key
   T that about MARGIN*k to 1.5*MARGIN*k entries of the row should reach. On a row of <= S entries T is a key exactly
   min(k, n) entries reach, or the exact k-th largest key.
2. filter: every entry with key >= T is a candidate. Each tile of TILE entries counts its candidates,
   reserves that many consecutive slots of the row's SLOTS with one atomic add, and writes (key, position)
   there in position order (a cumsum per tile): one segment per tile.
3. finish: over the candidate slots, the same search, started from T, finds a bound exactly kk candidates
   reach (taken whole) or else the exact kk-th largest value v*; everything above v* is taken, and among
   entries equal to v* the lowest positions (a binary search on positions, when ties straddle the k-th
   place); a taken entry's output slot is (taken in earlier tiles) + (taken before it in its segment), so
   positions come out ascending.
The result is exact whenever the candidates include the top k, i.e. when at least min(k, n) entries
reached T and they fit the SLOTS; otherwise (adversarial layouts that fool the sample, massive
ties) the finish falls back to the exact radix select of radix_select.py over the whole row. Both
conditions are checked on the device, so a call is a fixed set of launches (CUDA-graph friendly).

Methods: "auto" (default) uses the radix select alone for fewer than 64 rows of at most 4096 entries (one
launch, faster there), "sample" (the above) otherwise.

Launches: many rows (indexer prefill) or short rows use one program per row that does all three steps
(`_topk_row_kernel`); few long rows (CSA decode) use three launches: one threshold program per row,
one filter program per 2048-entry tile (or `splits` programs per row taking every splits-th tile), one
finish program per row. Having the last filter program of a row run the finish (two launches) measured slower
on an H200 (run 8: B=1 x 1M 25.6 against 21.4 us, B=32 245.6 against 104.2: the fused kernel's registers
halve the resident filter programs) and was removed; `git show 3174776:kernels/csa/topk.py` has it.
With pdl (default for one row on CUDA sm_90+) the filter and finish are programmatic dependent launches: they
start while the launch before still runs (the filter issues its tile's load first), then wait for it
(`gdc_wait`) before reading what it wrote; H200 run 9: B=1 x 1M 19.8 against 21.4 us.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.radix_select import RADIX_BINS, _chunk_topk_kernel, _radix_topk_range
from zoe_kernels.csa.topk_search import MIN32, _rank_bound, _select, _signed_key, _unsigned

try:  # programmatic dependent launch (Hopper and later); absent from older Triton releases
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - the launcher then refuses pdl=True
    gdc_launch_dependents = gdc_wait = None

SAMPLE = 16384  # entries read to pick the threshold (64 KB of float32)
SAMPLE_BLOCK = 8  # contiguous entries per sample block: one 32-byte sector, spread over the whole row
MARGIN = 3  # the threshold aims at MARGIN * k candidates: under k happens with ~1e-5 odds on i.i.d. rows
SPLIT_TILE = 2048  # entries per filter tile (one candidate segment) in split mode
MAX_TILES = 512  # candidate segments per row (the finish reads one per tile); longer rows get larger tiles
FILTER_PROGRAMS = 1 << 14  # filter programs over all rows in split mode (see auto_splits)
ROW_TILE = 4096  # entries per loop step in one-program-per-row mode
# "auto" takes the radix select for few rows this short: H200 run 5, B=1, 4096 entries: 15.8 us against 31.1
# for the sampled threshold, whose three launches and serial search steps cost ~30 us at any length
RADIX_MAX_LEN = 4096
THRESHOLD_WARPS = 16  # warps of the threshold program (S = 16384 sampled entries: 32 per thread)
FINISH_WARPS = 8  # warps of a finish launch per 4096 candidate slots (16 slots per thread), at most 16
# filter and finish launched as programmatic dependents of the launch before (CUDA, compute capability >= 9),
# by default for a single row only: H200 run 9, B=1 x 1M 19.8 against 21.4 us, 256K 14.5 against 16.0, but
# B=8 x 256K 25.0 against 24.2 and B=32 x 1M 105.2 against 104.3
PDL_MAX_ROWS = 1
# split mode's candidate placement: "atomic" (one returned atomic add per tile reserves slots in the row's
# shared SLOTS) or "tile" (each tile writes to its own TILE slots of a row-sized workspace and publishes a plain
# count; the finish prefix-sums the counts): see `_filter_tile_own`
COMPACT = "atomic"
FILTER_STAGES = 3  # tile-compacting programs that take several tiles: pipeline depth of their loads
FILTER_MAXNREG = None  # register cap of the split filter programs on CUDA (None: the compiler's choice)


@triton.jit
def _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO: tl.constexpr):
    lo = 0
    if HAS_LO:
        lo = tl.minimum(tl.maximum(tl.load(lo_ptr + row), 0), n_cols)
    hi = tl.minimum(tl.maximum(tl.load(hi_ptr + row), 0), n_cols)
    return lo, tl.maximum(hi, lo)


@triton.jit
def _sample_threshold(row_val, lo, n, K, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr):
    """Step 1: the candidate threshold of the row [lo, lo + n) (see the module doc)."""
    i = tl.arange(0, S)
    sampled = n > S
    if sampled:
        # S/SB blocks of SB entries, `step` apart (a multiple of SB: aligned 16-byte loads, and no 64-bit
        # division per entry), spread over the row
        step = tl.multiple_of(((n - SB) // (S // SB - 1)) // SB * SB, SB)
        offs = lo + (i // SB).to(tl.int64) * step + i % SB
        key = _signed_key(tl.load(row_val + offs))
    else:
        key = tl.where(i < n, _signed_key(tl.load(row_val + lo + i, mask=i < n, other=0.0)), MIN32)
    n_ok = tl.minimum(n, S)
    r_sampled = tl.minimum((MARGIN_ * K * S + n - 1) // tl.maximum(n, 1), S)
    r = tl.where(sampled, r_sampled, tl.minimum(K, n))
    # sampled: any bound that r to 1.5 r sample entries reach will do (~3k to ~4.5k candidates expected,
    # well inside the 8k slots); exact rows: a bound exactly min(k, n) entries reach, or the k-th largest
    slack = tl.where(sampled, r // 2, 0)
    c, _ = _rank_bound(key, r, tl.zeros([], tl.int64), n_ok, _unsigned(tl.max(key, axis=0)), slack)
    return (c - 2147483648).to(tl.int32)


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
                            HAS_LO: tl.constexpr, S: tl.constexpr, SB: tl.constexpr, MARGIN_: tl.constexpr,
                            PDL: tl.constexpr):
    """Program per row: the threshold, and the row's count of filled slots reset for the filter launch. PDL: the filter launch may start at once (it waits for this grid before reading
    what it writes)."""
    row = tl.program_id(0)
    if PDL:
        gdc_launch_dependents()
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    tl.store(thresh_ptr + row, _sample_threshold(row_val, lo, hi - lo, K, S, SB, MARGIN_))
    tl.store(fill_ptr + row, 0)


@triton.jit
def _finish_row(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                n_cols, stride_row, K, row, HAS_LO: tl.constexpr, S: tl.constexpr, SLOTS: tl.constexpr,
                MAXT: tl.constexpr, TILE: tl.constexpr, PDL: tl.constexpr):
    """Step 3 for one row: selects among the row's candidate segments (one per tile) and writes the top k in
    position order. Reads what other programs wrote (after the launch boundary), through L2 (`.cg`).

    The output slot of a taken candidate i of tile t is (taken in tiles < t) + (taken before i in t's
    segment) = before[t] + E[i] - E[first[t]], with E the exclusive cumsum of `take` in slot order."""
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * K
    if PDL:  # launched before the filter grid ended: wait for it (and its writes) here
        gdc_wait()
    total = tl.load(fill_ptr + row, cache_modifier=".cg")
    kk = tl.minimum(K, hi - lo)
    if (total > SLOTS) | (total < kk):  # threshold missed: exact radix select
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, TILE)
    else:
        base_row = row.to(tl.int64) * SLOTS
        r = tl.arange(0, SLOTS)
        ok = r < total
        # unmasked (16-byte) loads of all SLOTS: the slots past `total` hold garbage, never used
        key = tl.where(ok, tl.load(cand_key_ptr + base_row + r, cache_modifier=".cg"), MIN32)
        pos = tl.load(cand_pos_ptr + base_row + r, cache_modifier=".cg")
        take = _select(key, pos, total, kk, tl.load(thresh_ptr + row), hi - lo <= S, False)
        take_i = take.to(tl.int32)
        excl = tl.cumsum(take_i, axis=0) - take_i
        # E and E + take go through the consumed candidate slots, so each tile can read them at its
        # segment's first and last slot
        tl.debug_barrier()
        tl.store(cand_key_ptr + base_row + r, excl, mask=ok)
        tl.store(cand_pos_ptr + base_row + r, excl + take_i, mask=ok)
        tl.debug_barrier()
        c = tl.arange(0, MAXT)
        n_tiles = tl.cdiv(hi - lo, TILE)
        seg = seg_ptr + (row * MAXT + c) * 2
        first = tl.load(seg, mask=c < n_tiles, other=0, cache_modifier=".cg")
        cnt = tl.load(seg + 1, mask=c < n_tiles, other=0, cache_modifier=".cg")
        has = (c < n_tiles) & (cnt > 0)
        e_first = tl.load(cand_key_ptr + base_row + first, mask=has, other=0, cache_modifier=".cg")
        taken = tl.load(cand_pos_ptr + base_row + first + cnt - 1, mask=has, other=0, cache_modifier=".cg") - e_first
        delta = tl.cumsum(taken, axis=0) - taken - e_first
        tl.debug_barrier()
        tl.store(seg, delta, mask=c < n_tiles)
        tl.debug_barrier()
        slot = tl.load(seg_ptr + (row * MAXT + pos // TILE) * 2, mask=take, other=0, cache_modifier=".cg") + excl
        tl.store(out_row + slot, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


@triton.jit
def _load_tile(row_val, start, n, TILE: tl.constexpr):
    """row_val[start : start + TILE] (0.0 past n): a full tile without a mask, so the loads are 16 bytes wide
    (a masked load of unknown alignment compiles to one 4-byte load per entry)."""
    start = tl.multiple_of(start, TILE)
    offs = start + tl.arange(0, TILE)
    if start + TILE <= n:
        x = tl.load(row_val + offs)
    else:
        x = tl.load(row_val + offs, mask=offs < n, other=0.0)
    return x


@triton.jit
def _filter_tile(x, offs, t, n, thresh, fill, cand_key, cand_pos, seg, SLOTS: tl.constexpr, TILE: tl.constexpr):
    """Step 2 for tile t (entries x at positions offs, the same layout as x's load: no conversion): reserve
    slots for its candidates (one atomic add), write them in position order, record the segment (first slot,
    count) in seg[t]."""
    key = _signed_key(x)
    take = (offs < n) & (key >= thresh)
    take_i = take.to(tl.int32)
    count = tl.sum(take_i, axis=0)
    first = tl.zeros([], tl.int32)
    if count > 0:
        first = tl.atomic_add(fill, count, sem="relaxed")
        slot = first + tl.cumsum(take_i, axis=0) - take_i
        keep = take & (slot < SLOTS)
        tl.store(cand_key + slot, key, mask=keep)
        tl.store(cand_pos + slot, offs, mask=keep)
    if t * TILE < n:
        tl.store(seg + t * 2, first)
        tl.store(seg + t * 2 + 1, count)


@triton.jit
def _filter_tile_own(x, offs, t, n, thresh, cand_key, cand_pos, cnt, TILE: tl.constexpr):
    """Step 2 for tile t with no atomic: its candidates go, in position order, to the tile's own TILE slots
    (t * TILE onwards: no overflow, no reservation), and their count to cnt[t] for the finish's prefix sum."""
    key = _signed_key(x)
    take = (offs < n) & (key >= thresh)
    take_i = take.to(tl.int32)
    count = tl.sum(take_i, axis=0)
    if count > 0:
        slot = t * TILE + tl.cumsum(take_i, axis=0) - take_i
        tl.store(cand_key + slot, key, mask=take)
        tl.store(cand_pos + slot, offs, mask=take)
    if t * TILE < n:
        tl.store(cnt + t, count)


@triton.jit
def _split_filter_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                         n_cols, stride_row, K, P, cand_stride, HAS_LO: tl.constexpr, S: tl.constexpr,
                         SLOTS: tl.constexpr, MAXT: tl.constexpr, TILE: tl.constexpr, ONE_TILE: tl.constexpr,
                         OWN: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr):
    """Program (row, p) of P: tiles p, p + P, ... of the row. Per tile: its candidates, in position order,
    either (OWN) into the tile's own slots of a row-sized workspace with their count in seg[row, tile], or
    into consecutive slots reserved with one atomic add on the row's shared SLOTS, the segment (first slot,
    count) in seg[row, tile]. Several tiles per program: the next tile's load is issued before the current
    tile's reduction and stores, so a program always has a load in flight.

    PDL: launched while the threshold grid still runs, a program
    issues its tile's load, then waits for that grid (the threshold and the reset counters) and lets the
    finish launch start."""
    row = tl.program_id(0)
    p = tl.program_id(1)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    n = hi - lo
    row_val = val_ptr + row.to(tl.int64) * stride_row + lo
    base_row = row.to(tl.int64) * cand_stride
    if ONE_TILE:  # P covers the row: no loop, fewer registers, more programs resident
        # a start of unknown alignment (min with n) gives one 4-byte load per entry in the layout the
        # candidate stores need; a known-aligned start gives 16-byte loads in another layout, converted
        # through shared memory before the stores: 159 against 118 us at B=32 x 1M (H200 run 7 vs run 5)
        offs = tl.minimum(p * TILE, n) + tl.arange(0, TILE)
        x = tl.load(row_val + offs, mask=offs < n, other=0.0)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        if OWN:
            _filter_tile_own(x, offs, p, n, tl.load(thresh_ptr + row), cand_key_ptr + base_row,
                             cand_pos_ptr + base_row, seg_ptr + row * MAXT, TILE)
        else:
            _filter_tile(x, offs, p, n, tl.load(thresh_ptr + row), fill_ptr + row, cand_key_ptr + base_row,
                         cand_pos_ptr + base_row, seg_ptr + row * MAXT * 2, SLOTS, TILE)
    else:
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        thresh = tl.load(thresh_ptr + row)
        if OWN:  # software-pipelined: STAGES - 1 tiles in flight as asynchronous copies into shared memory
            # (cp.async, 16 bytes when the row width is a multiple of 4; masked by the width, so the last
            # tile reads up to TILE - 1 entries past the row's length, which the filter then ignores)
            for t in tl.range(p, tl.cdiv(n, TILE), P, num_stages=STAGES):
                offs = t * TILE + tl.arange(0, TILE)
                x = tl.load(row_val + offs, mask=offs < n_cols - lo, other=0.0)
                _filter_tile_own(x, offs, t, n, thresh, cand_key_ptr + base_row, cand_pos_ptr + base_row,
                                 seg_ptr + row * MAXT, TILE)
            return
        x = _load_tile(row_val, p * TILE, n, TILE)
        for t in range(p, tl.cdiv(n, TILE), P):
            x_next = _load_tile(row_val, (t + P) * TILE, n, TILE)
            _filter_tile(x, t * TILE + tl.arange(0, TILE), t, n, thresh, fill_ptr + row, cand_key_ptr + base_row,
                         cand_pos_ptr + base_row, seg_ptr + row * MAXT * 2, SLOTS, TILE)
            x = x_next


@triton.jit
def _finish_row_own(val_ptr, lo_ptr, hi_ptr, thresh_ptr, cand_key_ptr, cand_pos_ptr, cnt_ptr, out_ptr, n_cols,
                    stride_row, K, cand_stride, row, HAS_LO: tl.constexpr, S: tl.constexpr, SLOTS: tl.constexpr,
                    MAXT: tl.constexpr, TILE: tl.constexpr, PDL: tl.constexpr):
    """Step 3 for one row whose tiles wrote their candidates to their own slots (`_filter_tile_own`): the
    per-tile counts' prefix sum places candidate s of the row (in position order) in tile t(s) = the number
    of tiles whose inclusive end is <= s, found by a binary search over the ends in registers (`tl.gather`,
    log2(MAXT) steps), at slot t * TILE + s - start[t]. The candidates are then in ascending position order:
    the first ties are the lowest positions and the output slot of a taken one is the count taken before it."""
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    n = hi - lo
    row_val = val_ptr + row.to(tl.int64) * stride_row
    out_row = out_ptr + row.to(tl.int64) * K
    if PDL:  # launched before the filter grid ended: wait for it (and its writes) here
        gdc_wait()
    c = tl.arange(0, MAXT)
    cnt = tl.load(cnt_ptr + row * MAXT + c, mask=c < tl.cdiv(n, TILE), other=0, cache_modifier=".cg")
    end = tl.cumsum(cnt, axis=0)
    total = tl.sum(cnt, axis=0)
    kk = tl.minimum(K, n)
    if (total > SLOTS) | (total < kk):  # threshold missed: exact radix select
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, TILE)
    else:
        s = tl.arange(0, SLOTS)
        t = tl.zeros([SLOTS], tl.int32)
        for b in tl.static_range(1, 16):  # steps MAXT/2, MAXT/4, ..., 1 (unrolled)
            if (MAXT >> b) >= 1:
                t = tl.where(tl.gather(end, t + ((MAXT >> b) - 1), axis=0) <= s, t + (MAXT >> b), t)
        ok = s < total
        slot = row.to(tl.int64) * cand_stride + t * TILE + s - tl.gather(end - cnt, t, axis=0)
        key = tl.where(ok, tl.load(cand_key_ptr + slot, mask=ok, other=0, cache_modifier=".cg"), MIN32)
        pos = tl.load(cand_pos_ptr + slot, mask=ok, other=0, cache_modifier=".cg")
        take = _select(key, pos, total, kk, tl.load(thresh_ptr + row), n <= S, True)
        take_i = take.to(tl.int32)
        tl.store(out_row + tl.cumsum(take_i, axis=0) - take_i, pos, mask=take)
        _pad(out_row, kk, K, SLOTS)


@triton.jit
def _split_finish_kernel(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                         n_cols, stride_row, K, P, cand_stride, HAS_LO: tl.constexpr, S: tl.constexpr,
                         SLOTS: tl.constexpr, MAXT: tl.constexpr, TILE: tl.constexpr, OWN: tl.constexpr,
                         PDL: tl.constexpr):
    """Program per row: the finish (step 3). P: unused (the filter's argument list)."""
    if OWN:
        _finish_row_own(val_ptr, lo_ptr, hi_ptr, thresh_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr, n_cols,
                        stride_row, K, cand_stride, tl.program_id(0), HAS_LO, S, SLOTS, MAXT, TILE, PDL)
    else:
        _finish_row(val_ptr, lo_ptr, hi_ptr, thresh_ptr, fill_ptr, cand_key_ptr, cand_pos_ptr, seg_ptr, out_ptr,
                    n_cols, stride_row, K, tl.program_id(0), HAS_LO, S, SLOTS, MAXT, TILE, PDL)


def split_tile(max_len: int, tile: int | None = None) -> int:
    """Entries per filter tile (one candidate segment each) in split mode: `tile` or SPLIT_TILE, doubled
    until a row has at most MAX_TILES tiles (2048 up to 1M entries, 4096 up to 2M)."""
    tile = tile or SPLIT_TILE
    while -(-max_len // tile) > MAX_TILES:
        tile *= 2
    return tile


def auto_splits(rows: int, max_len: int, tile: int = SPLIT_TILE) -> int:
    """Filter programs per row in split mode: one per tile, up to FILTER_PROGRAMS in all (B=32 x 1M: 512 per
    row, 16384 programs)."""
    tiles = -(-max_len // split_tile(max_len, tile))
    return max(1, min(tiles, FILTER_PROGRAMS // max(rows, 1)))


def splits_for(rows: int, n: int, splits: int | None, tile: int | None) -> int:
    """Filter programs per row: one program per row for >= 64 rows (plenty of programs), else `auto_splits`."""
    if splits is None:
        splits = 1 if rows >= 64 else auto_splits(rows, n, tile or SPLIT_TILE)
    return max(1, int(splits))


@functools.lru_cache(maxsize=None)
def _has_pdl(device_index: int) -> bool:
    """Programmatic dependent launch: CUDA (not ROCm) at compute capability >= 9, and a Triton that has it."""
    return (gdc_wait is not None and torch.version.hip is None
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


def pdl_default(scores: torch.Tensor, rows: int) -> bool:
    """Whether split launches are programmatic dependents by default: at most PDL_MAX_ROWS rows on a device
    that has it (faster at B=1 on an H200, slower at B=8 and B=32: run 9)."""
    return scores.is_cuda and rows <= PDL_MAX_ROWS and _has_pdl(scores.device.index or 0)


def _warps_for(elements: int) -> int:
    """Warps for a program holding `elements` values per tensor: 16 to 32 per thread, 4 to 16 warps."""
    return max(4, min(16, elements // 512))


def topk_ranges(scores: torch.Tensor, starts: torch.Tensor | None, ends: torch.Tensor, k: int, *,
                splits: int | None = None, method: str = "auto", tile: int | None = None, num_warps: int = 4,
                row_chunk: int = 4096, sample: int = SAMPLE, pdl: bool | None = None, compact: str | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k positions of each row's valid range [starts[r], ends[r]) of `scores` [R, N] float32.

    Returns int32 [R, k]: positions relative to starts[r] (starts=None: 0), ascending, -1 padded (see
    the module doc for the tie rule). splits: filter programs per row (default: one program per row for
    everything when there are >= 64 rows, else `auto_splits(R, N, tile)`; each program takes every
    splits-th tile of its row); method "sample" ("filter" is
    accepted as its former name), "radix" (one program per row, radix select only) or "auto" (default:
    radix for fewer than 64 rows of at most RADIX_MAX_LEN entries, sample otherwise); tile: entries per
    loop step (split mode: also one candidate segment, default 2048, doubled while a row has more than
    MAX_TILES tiles; one program per row: default 4096); num_warps: warps of the split filter programs (the radix
    method under "auto" uses 8); row_chunk: rows per launch in one-program-per-row mode (bounds the candidate workspace to row_chunk * 8k * 8 bytes); sample:
    entries read to pick the threshold (a power of two >= 512; smaller only to test the sampled path on
    short rows); pdl: the split filter and finish launches start before
    the launch they depend on has ended (programmatic dependent launch; default: `pdl_default`);
    compact: split mode's candidate placement, "atomic" or "tile" (default COMPACT; "tile" takes a workspace
    of 8 bytes per score); out: optional preallocated int32 [R, k].
    """
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be a 2-D float32 tensor, got {tuple(scores.shape)} {scores.dtype}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if method not in ("auto", "sample", "filter", "radix"):
        raise ValueError(f"method must be 'auto', 'sample' or 'radix', got {method!r}")
    compact = compact or COMPACT
    if compact not in ("tile", "atomic"):
        raise ValueError(f"compact must be 'tile' or 'atomic', got {compact!r}")
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
    tile = split_tile(n, tile)
    n_tiles = triton.cdiv(n, tile)
    own = compact == "tile"
    thresh = torch.empty((rows,), dtype=torch.int32, device=dev)
    fill = torch.empty((rows,), dtype=torch.int32, device=dev)  # slots filled: zeroed by the threshold launch
    if own:  # every tile's own slots: a row-sized workspace (only candidates are written), counts per tile
        maxt = max(16, triton.next_power_of_2(n_tiles))
        cand_stride = n_tiles * tile
        seg = torch.empty((rows, maxt), dtype=torch.int32, device=dev)
    else:
        maxt, cand_stride = MAX_TILES, slots
        seg = torch.empty((rows, MAX_TILES, 2), dtype=torch.int32, device=dev)
    cand_key = torch.empty((rows, cand_stride), dtype=torch.int32, device=dev)
    cand_pos = torch.empty((rows, cand_stride), dtype=torch.int32, device=dev)
    bufs = (thresh, fill, cand_key, cand_pos, seg, out, n, scores.stride(0), k, splits, cand_stride)
    shapes = dict(**common, S=sample, SLOTS=slots, MAXT=maxt, TILE=tile, OWN=own, PDL=pdl)
    dependent = dict(launch_pdl=True) if pdl else {}  # the interpreter knows no such option
    regs = dict(maxnreg=FILTER_MAXNREG) if FILTER_MAXNREG and scores.is_cuda and torch.version.hip is None else {}
    _split_threshold_kernel[(rows,)](scores, lo_arg, ends, thresh, fill, n, scores.stride(0), k, **common,
                                     **sampling, PDL=pdl, num_warps=THRESHOLD_WARPS)
    _split_filter_kernel[(rows, splits)](scores, lo_arg, ends, *bufs, **shapes, ONE_TILE=splits >= n_tiles,
                                         STAGES=FILTER_STAGES, num_warps=num_warps, num_stages=1, **dependent, **regs)
    _split_finish_kernel[(rows,)](scores, lo_arg, ends, *bufs, **shapes,
                                  num_warps=min(16, FINISH_WARPS * slots // 4096), **dependent)
    return out


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512, *, splits: int | None = None,
         method: str = "auto", tile: int | None = None, num_warps: int = 4, sample: int = SAMPLE,
         pdl: bool | None = None, compact: str | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
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
                       sample=sample, pdl=pdl, compact=compact, out=out)
