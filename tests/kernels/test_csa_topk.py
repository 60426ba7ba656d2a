"""CSA top-K (`zoe_kernels.csa.topk`): exact indices and the documented tie rule against a float64 reference."""

import importlib

import pytest
import torch

from tests.kernels._sparse_device import DEVICE, ON_GPU
from zoe_kernels.csa import topk, topk_ranges
from zoe_kernels.csa.reference import topk_ranges_reference, topk_reference
from zoe_kernels.csa.topk import SAMPLE_BLOCK, auto_splits, max_tiles, pdl_default, split_tile

topk_module = importlib.import_module("zoe_kernels.csa.topk")  # the package exports the function under this name

pytestmark = pytest.mark.kernels
BLOCK = 4096 if ON_GPU else 512


def _scores(kind: str, b: int, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(b, n, generator=gen)
    if kind == "uniform":  # dense top bins: the radix select needs all three passes
        return torch.rand(b, n, generator=gen)
    if kind == "ties":  # few distinct values: ties decided by the lower position
        return torch.randint(-3, 4, (b, n), generator=gen).float()
    if kind == "sorted":  # increasing scores: the top entries share the last columns' maxima
        return torch.sort(torch.randn(b, n, generator=gen), dim=1).values
    if kind == "periodic":  # structured data: one large value every 64 positions (a single column)
        s = torch.randn(b, n, generator=gen)
        s[:, ::64] += 100.0
        return s
    if kind == "rounded":  # ties at the k-th place without overflowing the candidate slots
        return torch.round(torch.randn(b, n, generator=gen) * 8) / 8
    if kind == "recent":  # the best entries crowd the end of the row (recency): one chunk gets most candidates
        return torch.randn(b, n, generator=gen) + torch.linspace(0, 6, n)
    if kind == "equal":
        return torch.full((b, n), 0.25)
    if kind == "signed_inf":  # negative values, -inf and +inf in range
        s = torch.randn(b, n, generator=gen) * 1e3
        s[:, ::7] = float("-inf")
        s[:, 5::97] = float("inf")
        return s
    raise ValueError(kind)


# sample: entries read for the threshold; under the row length it exercises the sampled (estimated) threshold,
# at the default 16384 short rows get the exact k-th largest as threshold (two values only: each one is a
# compiled specialisation on the GPU)
@pytest.mark.parametrize(
    "kind,b,n,k,splits,method,sample",
    [("normal", 3, 3000, 128, 1, "sample", 16384), ("normal", 3, 3000, 128, 1, "sample", 1024),
     ("normal", 2, 5000, 64, 4, "sample", 1024), ("uniform", 2, 4100, 128, 4, "sample", 16384),
     ("ties", 2, 2500, 128, 1, "sample", 16384),  # ties overflow the slots -> radix fallback
     ("ties", 2, 3000, 100, 3, "sample", 1024), ("equal", 2, 1500, 128, 2, "sample", 16384),
     ("rounded", 2, 6000, 100, 3, "sample", 1024), ("rounded", 2, 3000, 64, 1, "sample", 1024),
     ("signed_inf", 2, 2000, 100, 1, "sample", 16384), ("normal", 2, 700, 512, None, "sample", 16384),
     ("uniform", 2, 3000, 200, 1, "radix", 16384), ("ties", 2, 2000, 300, 1, "radix", 16384),
     ("sorted", 2, 6000, 64, 3, "sample", 1024), ("recent", 2, 8000, 64, 4, "sample", 1024),
     ("periodic", 2, 4096, 64, 2, "sample", 1024)],
)
def test_topk_matches_reference_with_ragged_lengths(kind, b, n, k, splits, method, sample):
    gen = torch.Generator().manual_seed(hash((kind, b, n, k)) % 2**31)
    scores = _scores(kind, b, n, gen)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    lengths[0] = n
    lengths[-1] = min(int(lengths[-1]), k // 2)  # fewer valid entries than k: -1 padding
    poisoned = torch.full((b, k), 12345, dtype=torch.int32, device=DEVICE)  # every slot must be written
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=splits, tile=BLOCK, method=method, sample=sample,
               out=poisoned)
    assert out.data_ptr() == poisoned.data_ptr()
    assert out.dtype == torch.int32 and out.shape == (b, k)
    ref = topk_reference(scores, lengths, k)
    assert torch.equal(out.cpu(), ref)
    # a row with fewer valid entries than k: every valid entry, then -1
    last = out[-1].cpu()
    assert (last[: int(lengths[-1])] >= 0).all() and (last[int(lengths[-1]):] == -1).all()


@pytest.mark.parametrize("kind,splits", [("normal", 8), ("rounded", 2), ("recent", 5), ("ties", 3)])
def test_split_programs_and_finish_launch(kind, splits):
    """Programs with several tiles each, and more programs than tiles."""
    gen = torch.Generator().manual_seed(hash((kind, splits)) % 2**31)
    n, k = 3000 if splits == 8 else 7000, 96  # 8 programs over 6 tiles: two programs without a tile
    scores = _scores(kind, 3, n, gen)
    lengths = torch.tensor([n, n - 513, 40])
    poisoned = torch.full((3, k), 12345, dtype=torch.int32, device=DEVICE)
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=splits, tile=BLOCK, sample=1024, out=poisoned).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, k))


@pytest.mark.skipif(not ON_GPU, reason="programmatic dependent launch needs a CUDA device")
@pytest.mark.parametrize("dependent_threshold", [True, False])
@pytest.mark.parametrize("b,n,kind", [(1, 1 << 20, "normal"), (1, 1 << 20, "recent"), (8, 262144, "normal"),
                                      (32, 65536, "rounded"), (2, 7000, "ties")])
def test_dependent_launches_on_gpu(b, n, kind, dependent_threshold, monkeypatch):
    """pdl=True: the filter and finish launches start before the launch they depend on has ended; repeated calls
    on fresh data (a missing wait would show as a race), then calls back to back on one tensor that a kernel
    negates in place between them. dependent_threshold: the defaults (PDL_THRESHOLD_MAX_ROWS = 1: at one row the
    threshold launch a dependent of the kernel before it; the finish's inline-PTX output stores, FINISH_PTX_STORE), or
    both off; on, the
    threshold launch is a dependent at every row count here (also where the finish has its own launch)."""
    monkeypatch.setattr(topk_module, "PDL_THRESHOLD_MAX_ROWS", 1 << 20 if dependent_threshold else 0)
    monkeypatch.setattr(topk_module, "FINISH_PTX_STORE", dependent_threshold)
    gen = torch.Generator().manual_seed(n + b)
    for _ in range(3):
        scores = _scores(kind, b, n, gen)
        lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
        lengths[0] = n
        poisoned = torch.full((b, 512), 12345, dtype=torch.int32, device=DEVICE)
        out = topk(scores.cuda(), lengths.cuda(), 512, pdl=True, out=poisoned).cpu()
        assert torch.equal(out, topk_reference(scores, lengths, 512))
    on_gpu, ends = scores.cuda(), lengths.cuda()
    first = topk(on_gpu, ends, 512, pdl=True)
    on_gpu.neg_()  # written between two calls: the second threshold launch must wait for this kernel
    second = topk(on_gpu, ends, 512, pdl=True)
    assert torch.equal(first.cpu(), topk_reference(scores, lengths, 512))
    assert torch.equal(second.cpu(), topk_reference(-scores, lengths, 512))


@pytest.mark.skipif(not ON_GPU, reason="inline PTX stores need a CUDA device")
@pytest.mark.parametrize("vec", [True, False])
@pytest.mark.parametrize("b,n,tile", [(1, 1 << 20, None), (8, 262144, None), (32, 65536, None), (32, 65536, 2048),
                                      (3, 7000, 4096)])
def test_vector_loads_on_gpu(b, n, tile, vec, monkeypatch):
    """VECTOR_LOADS (the CUDA default): 16-byte tile loads and inline-PTX candidate stores, against the plain
    path; ragged rows, two kinds, poisoned outputs."""
    monkeypatch.setattr(topk_module, "VECTOR_LOADS", vec)
    gen = torch.Generator().manual_seed(n + b)
    for kind in ("normal", "recent"):
        scores = _scores(kind, b, n, gen)
        lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
        lengths[0] = n
        poisoned = torch.full((b, 512), 12345, dtype=torch.int32, device=DEVICE)
        out = topk(scores.cuda(), lengths.cuda(), 512, tile=tile, splits=None if tile != 4096 else 1 << 10,
                   out=poisoned).cpu()
        assert torch.equal(out, topk_reference(scores, lengths, 512))


@pytest.mark.parametrize("flt", [True, False])
@pytest.mark.parametrize("kind", ["normal", "rounded", "recent", "signed_inf"])
@pytest.mark.parametrize("half_scan", [True, False])
def test_filter_half_scan(half_scan, kind, flt, monkeypatch):
    """HALF_SCAN (the default): one-tile filter programs count their tile's two halves as one packed int32 and place
    the second half's candidates after the first half's; against the one-cumsum tile it replaced. Both filters
    (float and integer keys), ragged rows (a partial last tile), poisoned outputs, candidates in both halves of most
    tiles (k=64 of 6000 on the CPU)."""
    monkeypatch.setattr(topk_module, "HALF_SCAN", half_scan)
    monkeypatch.setattr(topk_module, "FLOAT_FILTER_MIN_ROWS", 1 if flt else 1 << 30)
    gen = torch.Generator().manual_seed(hash((kind, flt)) % 2**31)
    shapes = [(3, 6000, 64, 1024)]
    if ON_GPU:  # and the tiles of the timed shapes (1024 entries from 8 rows, 2048 at one row)
        shapes += [(32, 65536, 512, 16384), (8, 262144, 512, 16384)] + [(1, 1 << 20, 512, 16384)] * (kind == "normal")
    for b, n, k, sample in shapes:
        scores = _scores(kind, b, n, gen)
        lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
        lengths[0] = n
        poisoned = torch.full((b, k), 12345, dtype=torch.int32, device=DEVICE)
        out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, sample=sample, out=poisoned,
                   **({"tile": 1024} if n < 16384 else {})).cpu()
        assert torch.equal(out, topk_reference(scores, lengths, k)), (b, n)


def _sampled_positions(n: int, sample: int) -> torch.Tensor:
    """The entries the threshold step reads on a row of n > sample entries (see topk._sample_threshold)."""
    i = torch.arange(sample)
    blocks = sample // SAMPLE_BLOCK
    step = (n - SAMPLE_BLOCK) // (blocks - 1) // SAMPLE_BLOCK * SAMPLE_BLOCK
    return (i // SAMPLE_BLOCK) * step + i % SAMPLE_BLOCK


@pytest.mark.parametrize("hist", [True, False])
@pytest.mark.parametrize("case", ["unsampled_spikes", "rounded", "normal"])
def test_finish_histogram_start(case, hist, monkeypatch):
    """The finish's search started from the candidates' histogram (the default up to HISTOGRAM_MAX_ENTRIES
    entries: its packed int32 maximum) and from the threshold. unsampled_spikes: 200 large entries where the sample
    never reads, so the k-th largest lies in the histogram's last bin (open above: keys past the sample's maximum);
    rounded: ties at the k-th place."""
    monkeypatch.setattr(topk_module, "HISTOGRAM_MAX_ENTRIES", 1 << 30 if hist else 0)
    gen = torch.Generator().manual_seed(hash((case, hist)) % 2**31)
    n, k = 9000, 100
    scores = _scores("normal" if case == "unsampled_spikes" else case, 2, n, gen)
    if case == "unsampled_spikes":
        unsampled = torch.ones(n, dtype=torch.bool)
        unsampled[_sampled_positions(n, 1024)] = False
        spots = torch.nonzero(unsampled).flatten()[torch.randperm(int(unsampled.sum()), generator=gen)[:200]]
        scores[:, spots] = 1000.0 + torch.randn(2, 200, generator=gen)
    lengths = torch.tensor([n, n - 777])
    poisoned = torch.full((2, k), 12345, dtype=torch.int32, device=DEVICE)
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=3, tile=BLOCK, sample=1024, out=poisoned).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, k))


@pytest.mark.parametrize("kind", ["normal", "sorted", "recent", "periodic", "rounded", "ties"])
def test_threshold_pair_search_and_speculative_sample(kind, monkeypatch):
    """PAIR_SEARCH: the sampled threshold's search over each group's two largest keys (two bits per count,
    `_pair_bound`), checked by one count over the whole sample and continued exactly where a group held
    more than two keys over its bound (sorted rows: the sample's largest keys share groups). SPECULATIVE_SAMPLE: the
    sample of a full-width row loaded before its length, loaded again for a shorter row (row 1: other sampled
    positions). The threshold launch alone: its bound reaches r to r + r // 2 of the row's own sampled entries, or
    (ties: no such bound) is the r-th largest sampled key, each way; then a whole call against the reference."""
    gen = torch.Generator().manual_seed(hash(kind) % 2**31)
    n, k, sample = 30000, 64, 2048  # r = 14 sampled entries, r + r // 2 = 21 <= PAIR_MAX_RANK
    scores = _scores(kind, 2, n, gen)
    lengths = torch.tensor([n, n - 10000])
    assert -(-3 * k * sample // 20000) * 3 // 2 <= topk_module.PAIR_MAX_RANK
    ptx = ON_GPU and topk_module.has_ptx()
    for pairs, spec in ((True, False), (False, False), (True, True), (False, True)):
        thresh = torch.empty((2, 2), dtype=torch.int32, device=DEVICE)
        fill = torch.empty((2,), dtype=torch.int32, device=DEVICE)
        ends = lengths.to(DEVICE, torch.int32)  # as the launcher passes them
        topk_module._split_threshold_kernel[(2,)](
            scores.to(DEVICE), ends, ends, thresh, fill, fill, n, n, k, HAS_LO=False,
            S=sample, SB=SAMPLE_BLOCK, MARGIN_=topk_module.MARGIN, SLOTS=4096, HIST=False, FLT=False, PDL=False,
            PAIRS=pairs, SPEC=spec, PTX=ptx, num_warps=16)
        bound = thresh[:, 0].cpu()
        for row in range(2):
            m = int(lengths[row])
            sampled = scores[row, :m][_sampled_positions(m, sample)]
            r_row = -(-3 * k * sample // m)
            keys = _float_keys(sampled)
            reached = int((keys >= bound[row]).sum())
            rth = int(torch.sort(keys, descending=True).values[r_row - 1])
            assert r_row <= reached <= r_row + r_row // 2 or bound[row] == rth, (pairs, spec, row, reached)
    poisoned = torch.full((2, k), 12345, dtype=torch.int32, device=DEVICE)
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, sample=sample, out=poisoned).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, k))


def _float_keys(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int32 in the float order (`_signed_key` of topk_search.py)."""
    b = x.float().view(torch.int32)
    return b ^ ((b >> 31) & 0x7FFFFFFF)


def _key_order_reference(scores: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """topk_reference in the keys' order, where -0.0 ranks under +0.0 (float64: -0.0 as -1e-300, under every
    float32 negative)."""
    ranked = scores.double()
    ranked[(scores == 0) & torch.signbit(scores)] = -1e-300
    return topk_reference(ranked, lengths, k)


@pytest.mark.parametrize("flt", [True, False])
@pytest.mark.parametrize("case,sample", [("pos_zero_kth", 16384), ("pos_zero_kth", 1024), ("neg_zero_kth", 16384),
                                         ("neg_zero_kth", 1024), ("mostly_neg_inf", 1024)])
def test_signed_zeros_and_neg_inf_at_the_threshold(case, sample, flt, monkeypatch):
    """The float filter (from FLOAT_FILTER_MIN_ROWS rows; forced on or off here) compares floats against the
    threshold's float, where +0.0 == -0.0 but the keys rank -0.0 under +0.0: a threshold of +0.0 is lowered to
    -0.0 (exact rows, 16384: the k-th largest itself; sampled rows, 1024: the sample's bound lands on it).
    neg_zero_kth: the k-th largest is -0.0; mostly_neg_inf: the threshold key lies at or under -inf's (the float
    -inf). Both filters, against the keys' order."""
    monkeypatch.setattr(topk_module, "FLOAT_FILTER_MIN_ROWS", 1 if flt else 1 << 30)
    gen = torch.Generator().manual_seed(hash((case, sample)) % 2**31)
    n, k = 6000, 64
    scores = -torch.rand(2, n, generator=gen) - 0.5
    if case == "mostly_neg_inf":
        scores[:, torch.randperm(n, generator=gen)[: n - 40]] = float("-inf")
    else:
        # pos: 30 positive, 1500 +0.0, 1470 -0.0; neg: 20 positive, 20 +0.0, 2960 -0.0 (-0.0 at the k-th place)
        spots = torch.randperm(n, generator=gen)[:3000]
        n_pos, n_plus = (30, 1500) if case == "pos_zero_kth" else (20, 20)
        scores[:, spots[:n_pos]] = 1.0 + torch.rand(2, n_pos, generator=gen)
        scores[:, spots[n_pos:n_pos + n_plus]] = 0.0
        scores[:, spots[n_pos + n_plus:]] = -0.0
    lengths = torch.tensor([n, n - 777])
    poisoned = torch.full((2, k), 12345, dtype=torch.int32, device=DEVICE)
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=3, tile=BLOCK, sample=sample, out=poisoned).cpu()
    assert torch.equal(out, _key_order_reference(scores, lengths, k))


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", ["overflow", "undershoot"])
def test_threshold_misses_fall_back_to_exact_radix(case, splits):
    gen = torch.Generator().manual_seed(31)
    n, k = 6000, 64
    if case == "overflow":  # 5000 equal top values: more candidates than the 4096 slots
        scores = torch.randn(2, n, generator=gen)
        scores[:, 1000:] = 7.0
    else:  # large, well spaced values exactly where the sample looks: the threshold keeps fewer than k entries
        scores = torch.randn(2, n, generator=gen)
        scores[:, _sampled_positions(n, 1024)] = 2.0 ** (torch.arange(1024) / 16.0) + 10.0
    lengths = torch.tensor([n, n - 7])
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=splits, tile=BLOCK, sample=1024).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, k))


def test_topk_ranges_are_relative_to_the_row_start():
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(4, 1200, generator=gen)
    starts = torch.tensor([0, 100, 600, 1200])
    ends = torch.tensor([1200, 900, 700, 1200])  # the last row is empty
    out = topk_ranges(scores.to(DEVICE), starts.to(DEVICE), ends.to(DEVICE), 150, tile=BLOCK).cpu()
    assert torch.equal(out, topk_ranges_reference(scores, starts, ends, 150))
    assert (out[3] == -1).all()
    assert out[1].max() < 800 and out[2].max() < 100  # relative positions
    chosen = out[1][out[1] >= 0].long() + 100
    threshold = scores[1, chosen].min()
    assert (scores[1, 100:900] > threshold).sum() < 150


def test_empty_rows_and_zero_lengths():
    out = topk(torch.randn(3, 100).to(DEVICE), torch.tensor([0, 0, 5]).to(DEVICE), 16, tile=BLOCK).cpu()
    assert (out[:2] == -1).all()
    assert sorted(out[2][:5].tolist()) == list(range(5)) and (out[2][5:] == -1).all()


def test_auto_splits_follow_length_and_rows():
    assert [auto_splits(1, n) for n in (2048, 65536, 262144, 524288, 1 << 20, 4 << 20)] == [1, 32, 128, 256, 512, 512]
    # from 8 rows: 1024-entry tiles (SPLIT_TILE_MANY), one program each up to 32768 programs
    assert [auto_splits(b, 1 << 20) for b in (1, 7, 8, 32, 63)] == [512, 512, 1024, 1024, 520]
    assert split_tile(1 << 20) == 2048 and split_tile(4 << 20) == 8192
    assert split_tile(1 << 20, rows=32) == 1024 and split_tile(4 << 20, rows=32) == 4096
    assert split_tile(1 << 20, 2048, rows=32) == 2048 and max_tiles(32) == 1024 and max_tiles(7) == 512


@pytest.mark.parametrize("kind", ["normal", "recent", "rounded"])
def test_many_rows_take_smaller_filter_tiles(kind):
    """8 rows or more: the split filter's default tiles are SPLIT_TILE_MANY entries, one program each (6 tiles
    per row on the CPU, 256 on a GPU)."""
    gen = torch.Generator().manual_seed(hash(kind) % 2**31)
    b, n, k = 8, 6000 if not ON_GPU else 1 << 18, 64 if not ON_GPU else 512
    scores = _scores(kind, b, n, gen)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    lengths[0] = n
    poisoned = torch.full((b, k), 12345, dtype=torch.int32, device=DEVICE)
    sample = 1024 if not ON_GPU else 16384
    out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, sample=sample, out=poisoned).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, k))


def test_dependent_launches_default_to_one_row_or_many_on_cuda():
    """pdl defaults on only for a single row or from PDL_MIN_ROWS rows on a CUDA device of compute capability >= 9
    (measured on the H200)."""
    assert not pdl_default(torch.randn(1, 10), 1)  # CPU tensors (the interpreter) never
    assert not pdl_default(torch.randn(32, 10), 32)
    if ON_GPU:
        scores = torch.randn(2, 10, device=DEVICE)
        has = torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 9
        assert not pdl_default(scores, 2) and not pdl_default(scores, 31)
        assert pdl_default(scores, 1) == has and pdl_default(scores, 32) == has


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="lengths must have shape"):
        topk(torch.randn(2, 10), torch.tensor([1, 2, 3]), 4)
    with pytest.raises(ValueError, match="float32"):
        topk(torch.randn(2, 10).double(), torch.tensor([1, 2]), 4)
    with pytest.raises(ValueError, match="k must be positive"):
        topk(torch.randn(2, 10), torch.tensor([1, 2]), 0)
    with pytest.raises(ValueError, match="method must be"):
        topk(torch.randn(2, 10), torch.tensor([1, 2]), 4, method="sort")
    with pytest.raises(ValueError, match="sample must be a power of two"):
        topk(torch.randn(2, 10), torch.tensor([1, 2]), 4, sample=1000)


@pytest.mark.parametrize("kind,b,splits", [("normal", 1, None), ("rounded", 2, None), ("ties", 1, None),
                                           ("recent", 1, 3)])
def test_fused_finish(kind, b, splits, monkeypatch):
    """FUSED_FINISH_MAX_ROWS: the row's last filter program to arrive (an acquire-release ticket) runs the finish, and
    there is no finish launch (its kernel replaced by None: a launch would fail). ties: the fused finish falls back to
    the radix select; splits=3: programs taking several tiles each. Two calls in a row on fresh draws over poisoned
    outputs (the threshold launch resets the tickets); on the GPU the default 1M-entry row at k = 512."""
    monkeypatch.setattr(topk_module, "FUSED_FINISH_MAX_ROWS", 2)
    monkeypatch.setattr(topk_module, "_split_finish_kernel", None)
    long_row = ON_GPU and kind == "normal"
    n, k, sample = (1 << 20, 512, topk_module.SAMPLE) if long_row else (30000, 64, 2048)
    gen = torch.Generator().manual_seed(hash((kind, b)) % 2**31)
    lengths = torch.tensor([n, n - 7777])[:b]
    for _ in range(2):
        scores = _scores(kind, b, n, gen)
        poisoned = torch.full((b, k), 12345, dtype=torch.int32, device=DEVICE)
        out = topk(scores.to(DEVICE), lengths.to(DEVICE), k, splits=splits, sample=sample, out=poisoned).cpu()
        assert torch.equal(out, topk_reference(scores, lengths, k))


@pytest.mark.skipif(not ON_GPU, reason="long rows need a GPU")
@pytest.mark.parametrize("b,n", [(1, 1 << 20), (4, 300_000), (32, 65536)])
def test_topk_long_rows_on_gpu(b, n):
    gen = torch.Generator().manual_seed(n)
    scores = torch.randn(b, n, generator=gen)
    lengths = torch.randint(n // 2, n + 1, (b,), generator=gen)
    lengths[0] = n
    out = topk(scores.cuda(), lengths.cuda(), 512).cpu()
    assert torch.equal(out, topk_reference(scores, lengths, 512))
