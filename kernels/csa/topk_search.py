"""The searches of CSA top-K (`zoe_kernels.csa.topk`): bit-by-bit bounds over order-preserving int32 keys.

Keys: `_signed_key` maps float32 to int32 whose signed order is the float order; `_unsigned` lifts a key to
int64 in [0, 2^32) in the same order, the domain the searches build their bounds in bit by bit. Invalid lanes
hold MIN32 (unsigned 0): never counted.

- `_rank_bound`: a bound that at least r keys reach, one block-wide count per bit, stopped early (the sampled
  threshold, and the finish by default); with PAIRS over `_group_top_two`'s [groups, 2] keys (each group's two
  largest: the sampled threshold's first search on long rows);
- `_select`: which candidates are the top kk (exact, ties by lowest position); the split finish starts its
  search from a histogram of the candidates the filter counted (`_histogram_start`), so it only pays for the
  bits under the histogram's bin width.

Block-wide counts are the searches' unit of cost; alternatives that trade them for other work (the last bits
searched in one warp, three bounds per packed reduction in the finish, a histogram the finish builds itself)
measured slower on the H200 and are not here (bench/kernels/sparse_README.md has the measurements).
"""

from __future__ import annotations

import triton
import triton.language as tl

MIN32 = tl.constexpr(-(2**31))  # an inline -2147483648 literal would be typed int64


NEG_INF_KEY = tl.constexpr(-2139095041)  # _signed_key(-inf)


@triton.jit
def _bits_key(b):
    """The bits of an fp32 (int32) -> int32 whose signed order is the float order (-inf < ... < -0.0 < +0.0 <
    ... < +inf). Its own inverse: _bits_key(_bits_key(b)) == b."""
    return b ^ ((b >> 31) & 0x7FFFFFFF)


@triton.jit
def _signed_key(x):
    """fp32 -> int32 whose signed order is the float order (-inf < ... < +inf; -0.0 under +0.0)."""
    return _bits_key(x.to(tl.int32, bitcast=True))


@triton.jit
def _key_float(key):
    """A threshold key T (T != _signed_key(+0.0) = 0) as the fp32 f with x >= f exactly when _signed_key(x) >= T,
    for every non-NaN x: for T > 0 and T < -1 the float of key T; T = -1 is -0.0 (x >= -0.0 takes both zeros,
    whose keys are -1 and 0); under -inf's key, -inf. T = 0 has no such float (+0.0 would take -0.0 too)."""
    return tl.where(key < NEG_INF_KEY, float("-inf"), _bits_key(key).to(tl.float32, bitcast=True))


@triton.jit
def _unsigned(key):
    """int32 signed-order key -> int64 in [0, 2^32) in the same order."""
    return key.to(tl.int64) + 2147483648


@triton.jit
def _top_two_combine(a1, a2, b1, b2):
    return tl.maximum(a1, b1), tl.maximum(tl.minimum(a1, b1), tl.maximum(a2, b2))


@triton.jit
def _group_top_two(key, GROUPS: tl.constexpr):
    """The two largest keys of each of GROUPS groups of `key` ([S] int32; duplicates kept: a group holding its
    largest key twice has it twice) as a [GROUPS, 2] tensor. The groups are those of the 1-D layout a 16-warp
    program gives an [S] tensor of 4-entry vectors (element i = rep * 2048 + thread * 4 + v), so with that layout
    a group is one thread's entries and the reduction stays in its registers."""
    key3 = tl.reshape(key, [key.shape[0] // (GROUPS * 4), GROUPS, 4])
    m1, m2 = tl.reduce((key3, tl.full(key3.shape, MIN32, tl.int32)), 2, _top_two_combine)
    m1, m2 = tl.reduce((m1, m2), 0, _top_two_combine)
    return tl.join(m1, m2)


@triton.jit
def _max_and_sum(a_max, a_sum, b_max, b_sum):
    return tl.maximum(a_max, b_max), a_sum + b_sum


@triton.jit
def _two_bit_bounds(key, c, bit):
    """The bounds of bits `bit` and `bit` - 1 over c (unsigned order, lower bits clear): high = c | 2^bit, low = c |
    2^(bit - 1), both = high | low (at bit 0 only high: low and both are never counted), and each key's share of
    their three counts packed in an int64 (21-bit fields: at most 2^21 - 1 keys; key: signed int32 keys)."""
    one = tl.full([], 1, tl.int64)
    high = c | (one << bit)
    low = c | (one << tl.maximum(bit - 1, 0))
    both = high | low
    two = bit > 0
    packed = (((key >= (low - 2147483648).to(tl.int32)) & two).to(tl.int64)
              | ((key >= (high - 2147483648).to(tl.int32)).to(tl.int64) << 21)
              | (((key >= (both - 2147483648).to(tl.int32)) & two).to(tl.int64) << 42))
    return high, low, both, packed


@triton.jit
def _take_two_bits(c, cnt_c, r, high, low, both, counts):
    """The greedy choice of two one-bit steps from `_two_bit_bounds`' summed counts: the largest bound at least r
    keys reach (both > high > low), else c; returns (bound, its count)."""
    n_low = (counts & 0x1FFFFF).to(tl.int32)
    n_high = ((counts >> 21) & 0x1FFFFF).to(tl.int32)
    n_both = (counts >> 42).to(tl.int32)
    c_new = tl.where(n_both >= r, both, tl.where(n_high >= r, high, tl.where(n_low >= r, low, c)))
    cnt_new = tl.where(n_both >= r, n_both, tl.where(n_high >= r, n_high, tl.where(n_low >= r, n_low, cnt_c)))
    return c_new, cnt_new


@triton.jit
def _pair_bound(best, r, slack):
    """`_rank_bound` over the [G, 2] keys `best` (`_group_top_two`; all valid, 2G > r + slack) from 0 with no
    upper bound given, deciding two bits per block-wide count (`_two_bit_bounds`); the first count (bits 31 and
    30) is one reduction with the keys' maximum, which the later bits are dropped against without a count. Returns
    (c, count(c), the largest key as int32). Same contract as `_rank_bound`: count(c) >= r, stopped once it is <= r +
    slack (maybe one bit later than `_rank_bound`), else c is the r-th largest key."""
    high, low, both, packed = _two_bit_bounds(best, tl.zeros([], tl.int64), tl.full([], 31, tl.int32))
    top, counts = tl.reduce((best, packed), 1, _max_and_sum)
    top, counts = tl.reduce((top, counts), 0, _max_and_sum)
    top_u = _unsigned(top)
    c, cnt_c = _take_two_bits(tl.zeros([], tl.int64), best.shape[0] * 2, r, high, low, both, counts)
    bit = tl.full([], 29, tl.int32)
    while (bit >= 0) & (cnt_c > r + slack):
        if (c | (tl.full([], 1, tl.int64) << bit)) > top_u:  # no key reaches it: dropped without a count
            bit -= 1
        else:
            high, low, both, packed = _two_bit_bounds(best, c, bit)
            counts = tl.sum(tl.sum(packed, axis=1), axis=0)
            c, cnt_c = _take_two_bits(c, cnt_c, r, high, low, both, counts)
            bit -= 2
    return c, cnt_c, top


@triton.jit
def _rank_bound(key, r, lo_u, cnt_lo, hi_u, slack):
    """A bound c (unsigned key order, int64 in [0, 2^32)) with count(key >= c) >= r, searched bit by bit from
    the top and stopped as soon as count(c) <= r + slack; returns (c, count(c)). Without an early stop c is
    the r-th largest key. Invalid lanes must hold MIN32 (unsigned 0, never counted). (The groups' two largest keys
    of the sampled threshold's first search are searched two bits a count by `_pair_bound`.)

    lo_u / cnt_lo: a bound every valid key reaches and their count (the finish: the threshold and the
    candidates' number), hi_u: the largest key. Bits whose candidate bound lies at or under lo_u are taken and
    bits whose bound exceeds hi_u dropped without a reduction, so the search only pays (one block-wide
    reduction, ~0.4 us on an H200) for the bits between the two. One bit per step: a 16-way step (4 bits, [16, n]
    compares) measured 2x slower, the compares cost too."""
    c = tl.zeros([], tl.int64)
    if cnt_lo <= r + slack:  # lo_u is already such a bound (the loop below would not walk c up to it)
        c = lo_u
    cnt_c = cnt_lo
    i = tl.zeros([], tl.int32)
    while (i < 32) & (cnt_c > r + slack):
        cand = c | (tl.full([], 1, tl.int64) << (31 - i))
        if cand <= lo_u:
            c = cand
        elif cand <= hi_u:
            ge = (key >= (cand - 2147483648).to(tl.int32)).to(tl.int32)
            cnt = tl.sum(ge, axis=0)
            if cnt >= r:
                c = cand
                cnt_c = cnt
        i += 1
    return c, cnt_c


@triton.jit
def _histogram_start(hist, total, kk, thresh, shift, key):
    """Where the finish's search starts, from the candidates' histogram: hist[b] counts the candidates whose
    key >> shift is (thresh >> shift) + b (the last bin: or more). Returns (lo_u, cnt_lo, hi_u) for
    `_rank_bound`: the lower bound of the highest bin that at least kk candidates reach (a multiple of
    2^shift), that count, and the largest key under the next bin (every bound above it is reached by fewer than
    kk), so the search pays only for the bits under `shift`: one scan and one reduction instead of the bits
    from the threshold down to the bin's width. That reduction is an int32 maximum of b * 2NB + count (NB bins,
    total <= NB: under 2^31 for NB <= 2^15), one `redux` per warp instead of rounds of int64 shuffles."""
    b = tl.arange(0, hist.shape[0])
    span = 2 * hist.shape[0]  # b * span + count: count <= total <= NB < span
    ge = total - tl.cumsum(hist, axis=0) + hist  # candidates in bins >= b (non-increasing)
    best = tl.max(tl.where(ge >= kk, b * span + ge, -1), axis=0)
    top = best // span
    cnt_lo = best % span
    lo_u = ((_unsigned(thresh) >> shift) + top) << shift
    hi_u = lo_u + (tl.full([], 1, tl.int64) << shift) - 1
    if top == hist.shape[0] - 1:  # the last bin is open above
        hi_u = _unsigned(tl.max(key, axis=0))
    return lo_u, cnt_lo, hi_u


@triton.jit
def _select(key, pos, total, kk, thresh, exact, hist, shift, IN_ORDER: tl.constexpr, HIST: tl.constexpr):
    """Step 3: which of `total` candidates (invalid slots: key MIN32; every valid one >= thresh) are the top
    kk. A bound that exactly kk candidates reach takes them; otherwise (ties at the kk-th place) everything
    above the kk-th largest value v* is taken, and among entries equal to v* the lowest positions. The search
    starts from the threshold (every candidate reaches it) and stops at the first bound exactly kk reach;
    when the threshold came from the whole row (`exact`) it already is such a bound or v*. IN_ORDER: the slots
    hold the candidates in position order (the first ties are the lowest positions); otherwise the last
    position to take is found by a second binary search (only when ties straddle the k-th place). HIST: the
    search starts from the candidates' histogram `hist` (bins of 2^shift keys from the threshold's,
    `_histogram_start`)."""
    valid = key != MIN32
    if total <= kk:
        take = valid
    else:
        c = _unsigned(thresh)
        cnt_c = total
        if not exact:
            if HIST:
                lo_u, cnt_lo, hi_u = _histogram_start(hist, total, kk, thresh, shift, key)
            else:
                lo_u = c
                cnt_lo = total
                hi_u = _unsigned(tl.max(key, axis=0))
            c, cnt_c = _rank_bound(key, kk, lo_u, cnt_lo, hi_u, 0)
        vstar = (c - 2147483648).to(tl.int32)
        if cnt_c == kk:
            take = key >= vstar
        else:
            gt = key > vstar
            need = kk - tl.sum(gt.to(tl.int32), axis=0)
            eq = key == vstar
            eq_i = eq.to(tl.int32)
            if IN_ORDER:
                take = gt | (eq & (tl.cumsum(eq_i, axis=0) - eq_i < need))
            else:
                last = tl.full([], 2147483647, tl.int32)
                if tl.sum(eq_i, axis=0) > need:  # the need-th smallest tied position
                    p = tl.zeros([], tl.int32)
                    for i in range(31):
                        cand = p | (1 << (30 - i))
                        if tl.sum((eq & (pos < cand)).to(tl.int32), axis=0) < need:
                            p = cand
                    last = p
                take = gt | (eq & (pos <= last))
    return take
