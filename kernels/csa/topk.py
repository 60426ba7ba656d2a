"""Exact, deterministic top-k selection over ragged rows of float32 scores (Triton).

Used twice in zoe: CSA top-K (top 512 of up to ~1M compressed-entry scores per request, DeepSeek-V4-Pro,
seed table A3) and the DSA indexer's top 2048 (`zoe_kernels.dsa.indexer_topk`).

Selection rule (deterministic ties): a row's selected set is the k largest entries ordered by
(value descending, position ascending): among equal values the lower position wins. The indices are
returned in ascending position order (not by value), followed by -1 padding when a row has fewer than
k valid entries. NaN scores are not supported; -inf is a valid score.

Method ("filter", the default): view a row as a matrix of G = 2k columns (entry i in column i mod G).
The k-th largest column maximum T is a safe threshold: k columns have a maximum >= T, so at least k
entries are >= T, and every top-k entry is >= T. For scores without structure only about 1.4k entries
pass (each column max is the top of ~N/G entries). So: (1) column maxima, (2) keep the entries >= T as
candidates (value, position) packed into one int64 key, (3) sort the few candidates (`tl.sort`, value
descending then position ascending), keep the first k, and sort those positions ascending. Rows with
more than 4k candidates (adversarial periodic data, massive ties) fall back, inside step 3, to the exact
radix select of radix_select.py over the whole row, so the result is exact for every input.
Few long rows (CSA decode) split steps 1-2 over many programs per row: column maxima combine with
int32 atomic max and candidates are appended through an atomic counter (their order in the buffer
varies, but the sort in step 3 makes the output deterministic). Many rows (indexer prefill) use one
program per row that does all three steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.radix_select import RADIX_BINS, _chunk_topk_kernel, _radix_topk_range

_INT32_MIN = -(2**31)
MIN32 = tl.constexpr(-(2**31))  # an inline -2147483648 literal would be typed int64


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
def _colmax_tile(row_val, start, lo, hi, G: tl.constexpr, R: tl.constexpr):
    """Column maxima (signed keys) of the tile of R*G entries at `start` (start - lo a multiple of G)."""
    offs = start + tl.arange(0, R * G)
    key = _signed_key(tl.load(row_val + offs, mask=offs < hi, other=0.0))
    key = tl.where(offs < hi, key, MIN32)
    return tl.max(tl.reshape(key, (R, G)), axis=0)


@triton.jit
def _threshold(colmax, K, G: tl.constexpr):
    """The K-th largest of the G column maxima (INT32_MIN if fewer than K columns hold entries)."""
    ordered = tl.sort(colmax, descending=True)
    return tl.max(tl.where(tl.arange(0, G) == K - 1, ordered, MIN32), axis=0)


@triton.jit
def _filter_tile(row_val, start, lo, hi, thresh, cand, base, CAP: tl.constexpr, BLOCK: tl.constexpr):
    """Appends the entries >= thresh of one tile to cand[base:] as (key << 32 | ~pos) int64; returns the count."""
    offs = start + tl.arange(0, BLOCK)
    ok = offs < hi
    key = _signed_key(tl.load(row_val + offs, mask=ok, other=0.0))
    take = ok & (key >= thresh)
    n = tl.sum(take.to(tl.int32), axis=0)
    if n > 0:
        if base < CAP:
            take_i = take.to(tl.int32)
            pos = base + tl.cumsum(take_i, axis=0) - take_i
            packed = (key.to(tl.int64) << 32) | (0xFFFFFFFF - (offs - lo).to(tl.int64))
            tl.store(cand + pos, packed, mask=take & (pos < CAP))
    return n


@triton.jit
def _emit_sorted(cand, count, out_row, K, C: tl.constexpr, IN_ORDER: tl.constexpr):
    """Top K of the first `count` (<= C) packed candidates -> out_row[0:K], ascending positions, -1 padded.

    IN_ORDER: the buffer already holds the candidates in ascending position order (one program per row),
    so the K-th largest key is enough and a cumsum keeps them in order; otherwise a second sort orders
    the chosen positions."""
    r = tl.arange(0, C)
    keys = tl.load(cand + r, mask=r < count, other=-9223372036854775808)
    ordered = tl.sort(keys, descending=True)
    if IN_ORDER:
        # keys are unique (they hold the position), so exactly min(count, K) keys are >= the K-th largest
        kth = tl.min(tl.where(r < tl.minimum(count, K), ordered, 9223372036854775807), axis=0)
        take = (r < count) & (keys >= kth)
        take_i = take.to(tl.int32)
        slot = tl.cumsum(take_i, axis=0) - take_i
        pos = (0xFFFFFFFF - (keys & 0xFFFFFFFF)).to(tl.int32)
        tl.store(out_row + slot, pos, mask=take)
        n_taken = tl.minimum(count, K)
        tl.store(out_row + r, tl.full([C], -1, tl.int32), mask=(r >= n_taken) & (r < K))
    else:
        pos = (0xFFFFFFFF - (ordered & 0xFFFFFFFF)).to(tl.int32)
        pos = tl.where(r < tl.minimum(count, K), pos, 2147483647)
        pos = tl.sort(pos)
        tl.store(out_row + r, tl.where(pos == 2147483647, -1, pos), mask=r < K)


@triton.jit
def _finish_row(row_val, lo, hi, cand, count, out_row, K, CAP: tl.constexpr, KP: tl.constexpr,
                BLOCK: tl.constexpr, IN_ORDER: tl.constexpr):
    # two sort sizes only: every tl.sort instance is a large unrolled network to compile
    if count <= 2 * KP:
        _emit_sorted(cand, count, out_row, K, 2 * KP, IN_ORDER)
    elif count <= CAP:
        _emit_sorted(cand, count, out_row, K, CAP, IN_ORDER)
    else:  # too many candidates: exact radix select over the whole row
        _radix_topk_range(row_val, row_val, lo, hi, lo, out_row, out_row, K, False, False, 256, BLOCK)


@triton.jit
def _topk_row_kernel(val_ptr, lo_ptr, hi_ptr, cand_ptr, out_ptr, n_cols, stride_row, K, row0,
                     HAS_LO: tl.constexpr, G: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr,
                     KP: tl.constexpr):
    """One program per row: column maxima, threshold, candidates, sort."""
    row = row0 + tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    cand = cand_ptr + tl.program_id(0).to(tl.int64) * CAP
    out_row = out_ptr + row.to(tl.int64) * K
    colmax = tl.full([G], MIN32, tl.int32)
    for start in range(lo, hi, R * G):
        colmax = tl.maximum(colmax, _colmax_tile(row_val, start, lo, hi, G, R))
    thresh = _threshold(colmax, K, G)
    count = tl.zeros([], tl.int32)
    for start in range(lo, hi, R * G):
        count += _filter_tile(row_val, start, lo, hi, thresh, cand, count, CAP, R * G)
    _finish_row(row_val, lo, hi, cand, count, out_row, K, CAP, KP, R * G, True)


@triton.jit
def _split_colmax_kernel(val_ptr, lo_ptr, hi_ptr, work_ptr, n_cols, stride_row, TILES,
                         HAS_LO: tl.constexpr, G: tl.constexpr, R: tl.constexpr):
    """Program (row, p): column maxima of tiles p*TILES.. of the row, atomically max-ed into work[row, :G]."""
    row = tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    first = lo + tl.program_id(1) * TILES * (R * G)
    if first < hi:
        colmax = tl.full([G], MIN32, tl.int32)
        for t in range(TILES):
            colmax = tl.maximum(colmax, _colmax_tile(row_val, first + t * (R * G), lo, hi, G, R))
        tl.atomic_max(work_ptr + row.to(tl.int64) * (G + 1) + tl.arange(0, G), colmax,
                      mask=colmax > MIN32, sem="relaxed")


@triton.jit
def _split_filter_kernel(val_ptr, lo_ptr, hi_ptr, work_ptr, cand_ptr, n_cols, stride_row, K, TILES,
                         HAS_LO: tl.constexpr, G: tl.constexpr, R: tl.constexpr, CAP: tl.constexpr):
    """Program (row, p): threshold from work[row, :G], then append its tiles' candidates (counter work[row, G],
    which starts at INT32_MIN)."""
    row = tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    first = lo + tl.program_id(1) * TILES * (R * G)
    if first < hi:
        work = work_ptr + row.to(tl.int64) * (G + 1)
        thresh = _threshold(tl.load(work + tl.arange(0, G)), K, G)
        cand = cand_ptr + row.to(tl.int64) * CAP
        for t in range(TILES):
            offs = first + t * (R * G) + tl.arange(0, R * G)
            ok = offs < hi
            key = _signed_key(tl.load(row_val + offs, mask=ok, other=0.0))
            take = ok & (key >= thresh)
            n = tl.sum(take.to(tl.int32), axis=0)
            if n > 0:
                base = tl.atomic_add(work + G, n, sem="relaxed").to(tl.int64) + 2147483648
                take_i = take.to(tl.int32)
                pos = base + tl.cumsum(take_i, axis=0) - take_i
                packed = (key.to(tl.int64) << 32) | (0xFFFFFFFF - (offs - lo).to(tl.int64))
                tl.store(cand + pos, packed, mask=take & (pos < CAP))


@triton.jit
def _split_finish_kernel(val_ptr, lo_ptr, hi_ptr, work_ptr, cand_ptr, out_ptr, n_cols, stride_row, K,
                         HAS_LO: tl.constexpr, G: tl.constexpr, CAP: tl.constexpr, KP: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0)
    lo, hi = _row_bounds(lo_ptr, hi_ptr, row, n_cols, HAS_LO)
    row_val = val_ptr + row.to(tl.int64) * stride_row
    count = (tl.load(work_ptr + row.to(tl.int64) * (G + 1) + G).to(tl.int64) + 2147483648).to(tl.int32)
    _finish_row(row_val, lo, hi, cand_ptr + row.to(tl.int64) * CAP, count, out_ptr + row.to(tl.int64) * K,
                K, CAP, KP, BLOCK, False)


def auto_splits(max_len: int) -> int:
    """Programs per row in split mode: one per 32K entries, a power of two capped at 32 (8/16/32 at 256K/512K/1M)."""
    chunks = -(-max_len // 32768)
    return min(32, 1 << max(0, chunks - 1).bit_length())


def topk_ranges(scores: torch.Tensor, starts: torch.Tensor | None, ends: torch.Tensor, k: int, *,
                splits: int | None = None, method: str = "filter", tile: int = 4096, num_warps: int = 8,
                row_chunk: int = 4096, out: torch.Tensor | None = None) -> torch.Tensor:
    """Top-k positions of each row's valid range [starts[r], ends[r]) of `scores` [R, N] float32.

    Returns int32 [R, k]: positions relative to starts[r] (starts=None: 0), ascending, -1 padded (see
    the module doc for the tie rule). splits: programs per row (default: 1 when there are >= 64 rows,
    else `auto_splits`); method "filter" (default) or "radix" (one program per row, radix select only);
    tile: entries per loop step; row_chunk: rows per launch in one-program-per-row mode (bounds the
    candidate workspace to row_chunk * 4k * 8 bytes); out: optional preallocated int32 [R, k].
    """
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"scores must be a 2-D float32 tensor, got {tuple(scores.shape)} {scores.dtype}")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if method not in ("filter", "radix"):
        raise ValueError(f"method must be 'filter' or 'radix', got {method!r}")
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
    if method == "radix":
        _chunk_topk_kernel[(rows, 1)](
            scores, scores, lo_arg, ends, out, scores, n, scores.stride(0), k, k,
            HAS_LO=has_lo, HAS_HI=True, HAS_IDX=False, WRITE_VAL=False, NB=RADIX_BINS[8], BLOCK=tile,
            num_warps=num_warps)
        return out
    kp = triton.next_power_of_2(k)
    g = 2 * kp  # columns; the threshold is the k-th largest column maximum
    cap = 4 * kp  # candidates kept before the radix fallback
    r = max(1, tile // g)
    if splits is None:
        splits = 1 if rows >= 64 else auto_splits(n)
    if splits <= 1:
        for row0 in range(0, rows, row_chunk):
            nrows = min(row_chunk, rows - row0)
            cand = torch.empty((nrows, cap), dtype=torch.int64, device=dev)
            _topk_row_kernel[(nrows,)](scores, lo_arg, ends, cand, out, n, scores.stride(0), k, row0,
                                       HAS_LO=has_lo, G=g, R=r, CAP=cap, KP=kp, num_warps=num_warps)
        return out
    tiles_per_program = triton.cdiv(triton.cdiv(n, r * g), splits)
    work = torch.full((rows, g + 1), _INT32_MIN, dtype=torch.int32, device=dev)
    cand = torch.empty((rows, cap), dtype=torch.int64, device=dev)
    grid = (rows, splits)
    _split_colmax_kernel[grid](scores, lo_arg, ends, work, n, scores.stride(0), tiles_per_program,
                               HAS_LO=has_lo, G=g, R=r, num_warps=num_warps)
    _split_filter_kernel[grid](scores, lo_arg, ends, work, cand, n, scores.stride(0), k, tiles_per_program,
                               HAS_LO=has_lo, G=g, R=r, CAP=cap, num_warps=num_warps)
    _split_finish_kernel[(rows,)](scores, lo_arg, ends, work, cand, out, n, scores.stride(0), k,
                                  HAS_LO=has_lo, G=g, CAP=cap, KP=kp, BLOCK=tile, num_warps=num_warps)
    return out


def topk(scores: torch.Tensor, lengths: torch.Tensor, k: int = 512, *, splits: int | None = None,
         method: str = "filter", tile: int = 4096, num_warps: int = 8,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """CSA top-K: the k best compressed entries of each request.

    scores: [B, N] float32, entry j of request b valid for j < lengths[b] (lengths [B], any int dtype,
    clamped to [0, N]). Returns int32 [B, k]: entry positions (0-based from the request's first entry,
    which is what vLLM's and SGLang's sparse-attention kernels expect before they map positions to KV
    slots), ascending, padded with -1 when lengths[b] < k. Ties: the larger value first, then the lower
    position. With fewer than 64 rows each row is split over up to 32 programs (`auto_splits`).
    """
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    if lengths.shape != (scores.shape[0],):
        raise ValueError(f"lengths must have shape ({scores.shape[0]},), got {tuple(lengths.shape)}")
    return topk_ranges(scores, None, lengths, k, splits=splits, method=method, tile=tile, num_warps=num_warps,
                       out=out)
