"""DSA lightning indexer (`zoe_kernels.dsa`): FP8 logits with [ks, ke) masking, and its top-k."""

import pytest
import torch

from tests.kernels._sparse_device import DEVICE, FP8, ON_GPU
from zoe_kernels.dsa import indexer_topk, lightning_indexer
from zoe_kernels.dsa.reference import indexer_topk_reference, lightning_indexer_reference

pytestmark = pytest.mark.kernels
BLOCK = 4096 if ON_GPU else 512


def _inputs(m, h, n, ranges, gen, d=128):
    q = (torch.randn(m, h, d, generator=gen) * 2).to(FP8)
    k = (torch.randn(n, d, generator=gen) * 2).to(FP8)
    w = torch.randn(m, h, generator=gen) / h
    k_scale = torch.rand(n, generator=gen) * 0.1 + 0.01
    if ranges == "causal":  # two packed sequences of a prefill batch: ks = sequence start
        split = m // 3
        pos = torch.arange(m)
        ks = torch.where(pos < split, 0, split)
        ke = pos + 1
    elif ranges == "prefix":  # prefill after a cached prefix of n - m keys
        pos = torch.arange(m)
        ks = torch.zeros(m, dtype=torch.long)
        ke = n - m + pos + 1
    elif ranges == "ragged":  # arbitrary ranges, including empty rows
        ks = torch.randint(0, n // 2, (m,), generator=gen)
        ke = ks + torch.randint(0, n // 2, (m,), generator=gen)
        ke[0] = ks[0]
    else:
        raise ValueError(ranges)
    tensors = [q, w, k, k_scale, ks.int(), ke.int()]
    return tensors, [t.to(DEVICE) for t in tensors]


# Hopper's fp8 tensor cores accumulate with fewer mantissa bits than fp32 (the DeepSeek-V3 report notes
# about 14), so on the GPU the logits land near 1e-4 relative error; the interpreter's fp8 dot is exact.
LOGITS_TOL = 1e-3 if ON_GPU else 1e-5


def _assert_logits_close(out, ref):
    out = out.cpu().double()
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite), "the -inf mask differs from [ks, ke)"
    assert (out[~finite] == float("-inf")).all()
    err = (out[finite] - ref[finite]).norm() / ref[finite].norm().clamp_min(1e-30)
    assert err < LOGITS_TOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("h,m,n,ranges,block_m,layout", [
    (32, 37, 300, "ragged", None, "keys"), (64, 45, 400, "causal", None, "keys"), (64, 23, 500, "prefix", 1, "keys"),
    (32, 19, 260, "causal", 2, "keys"), (32, 37, 300, "ragged", None, "heads"), (64, 23, 500, "prefix", 1, "heads")])
def test_lightning_indexer_matches_float64_reference(h, m, n, ranges, block_m, layout):
    gen = torch.Generator().manual_seed(m * 1000 + n + h)
    cpu, dev = _inputs(m, h, n, ranges, gen)
    tiles = 1 if ON_GPU else 2
    poisoned = torch.full((m, n), float("nan"), device=DEVICE)  # every element must be overwritten
    out = lightning_indexer(*dev, block_m=block_m, block_n=64 if not ON_GPU else 128, tiles_per_program=tiles,
                            layout=layout, out=poisoned)
    assert out.data_ptr() == poisoned.data_ptr()
    assert out.shape == (m, n) and out.dtype == torch.float32
    _assert_logits_close(out, lightning_indexer_reference(*cpu))


def test_indexer_topk_from_logits_and_from_inputs():
    gen = torch.Generator().manual_seed(11)
    m, h, n, k = 14, 32, 300, 64
    cpu, dev = _inputs(m, h, n, "causal", gen)
    ks, ke = cpu[4], cpu[5]
    logits = lightning_indexer(*dev, block_n=64)
    from_logits = indexer_topk(logits, dev[4], dev[5], k=k, tile=BLOCK).cpu()
    assert torch.equal(from_logits, indexer_topk_reference(logits.cpu(), ks, ke, k))
    fused = indexer_topk(*dev, k=k, tile=BLOCK).cpu()
    assert torch.equal(fused, from_logits)
    # early causal rows have fewer than k valid keys: positions 0..len-1, then -1
    length = int(ke[0] - ks[0])
    assert fused[0, :length].tolist() == list(range(length)) and (fused[0, length:] == -1).all()
    # positions are relative to ks: rows of the second sequence never exceed their length
    assert ((fused < (ke - ks)[:, None]) | (fused == -1)).all()


def test_indexer_topk_ties_pick_lower_positions():
    logits = torch.zeros(3, 500)
    logits[:, 100:110] = 5.0
    ks = torch.tensor([0, 50, 120], dtype=torch.int32)
    ke = torch.tensor([500, 450, 500], dtype=torch.int32)
    out = indexer_topk(logits.to(DEVICE), ks.to(DEVICE), ke.to(DEVICE), k=20, tile=BLOCK).cpu()
    # the ten 5.0s, then the lowest positions among the zeros; returned in ascending position order
    assert out[0].tolist() == list(range(0, 10)) + list(range(100, 110))
    assert out[1].tolist() == list(range(0, 10)) + list(range(50, 60))  # relative to ks = 50
    assert torch.equal(out, indexer_topk_reference(logits, ks, ke, 20))
    assert out[2].tolist() == list(range(20))  # all equal: the first 20 positions of the row


def test_bad_inputs_raise_clear_errors():
    gen = torch.Generator().manual_seed(1)
    cpu, _ = _inputs(8, 32, 64, "ragged", gen)
    q, w, k, k_scale, ks, ke = cpu
    with pytest.raises(ValueError, match="weights must be"):
        lightning_indexer(q, w[:, :16], k, k_scale, ks, ke)
    with pytest.raises(ValueError, match="fp8"):
        lightning_indexer(q.float(), w, k, k_scale, ks, ke)
    with pytest.raises(ValueError, match="k must be"):
        lightning_indexer(q, w, k[:, :64], k_scale, ks, ke)
    with pytest.raises(ValueError, match="layout must be"):
        lightning_indexer(q, w, k, k_scale, ks, ke, layout="rows")
    with pytest.raises(TypeError, match="positional"):
        indexer_topk(q, w, k=4)


@pytest.mark.skipif(not ON_GPU, reason="large shapes need a GPU")
@pytest.mark.parametrize("m,n,h", [(2048, 2048, 64), (512, 16384, 32)])
def test_indexer_large_shapes_on_gpu(m, n, h):
    gen = torch.Generator().manual_seed(m + n)
    cpu, dev = _inputs(m, h, n, "prefix", gen)
    logits = lightning_indexer(*dev)
    ref = lightning_indexer_reference(*[t for t in cpu])
    _assert_logits_close(logits, ref)
    idx = indexer_topk(logits, dev[4], dev[5], k=2048).cpu()
    assert torch.equal(idx, indexer_topk_reference(logits.cpu(), cpu[4], cpu[5], 2048))
