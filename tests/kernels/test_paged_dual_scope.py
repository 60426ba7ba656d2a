"""CSA dual-scope decode over paged V4 pools (`zoe_kernels.csa.paged_dual_scope`) against a float64
reference built from the same pool bytes. Pages no entry points at are filled with 0xFF (NaN as e4m3 and as
a ue8m0 scale), so a kernel that reads a wrong slot or a wrong scale byte returns NaN."""

import time

import pytest
import torch

from tests.kernels._sparse_device import DEVICE, ON_GPU
from zoe_kernels.csa.paged_dual_scope import (
    dequant_v4_slots,
    flashmla_view,
    page_bytes,
    paged_dual_scope_decode,
    paged_dual_scope_decode_reference,
    quantize_v4_rows,
    write_v4_pool,
)

pytestmark = pytest.mark.kernels

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}  # relative error of the output


def _pool(page_size: int, pages: int, tokens: int, gen: torch.Generator):
    """A V4 pool view holding `tokens` random keys at random slots (0xFF everywhere else), and those slots."""
    buf = torch.full((pages, page_bytes(page_size)), 0xFF, dtype=torch.uint8)
    slots = torch.randperm(pages * page_size, generator=gen)[:tokens]
    keys = torch.randn(tokens, 512, generator=gen) * (torch.rand(tokens, 1, generator=gen) * 4 + 0.1)
    write_v4_pool(buf, page_size, slots, *quantize_v4_rows(keys))
    return flashmla_view(buf.to(DEVICE), page_size), slots


def _case(b, h, k_swa, k_ext, gen, swa_page=64, ext_page=16):
    swa, swa_slots = _pool(swa_page, 3 * k_swa // swa_page + 2, 3 * k_swa, gen)
    ext, ext_slots = _pool(ext_page, 4 * k_ext // ext_page + 2, 4 * k_ext, gen)

    def pick(slots, k):
        return torch.stack([slots[torch.randperm(slots.numel(), generator=gen)[:k]] for _ in range(b)]).int()

    swa_idx, ext_idx = pick(swa_slots, k_swa), pick(ext_slots, k_ext)
    swa_len = torch.randint(1, k_swa + 1, (b,), generator=gen).int()
    ext_len = torch.randint(1, k_ext + 1, (b,), generator=gen).int()
    swa_len[0], ext_len[0] = k_swa, k_ext
    ext_idx[0, 1::3] = -1  # holes inside the selected list
    if b > 2:  # a row with no entry in either scope
        swa_len[2], ext_idx[2] = 0, -1
    q = torch.randn(b, h, 512, generator=gen)
    return q, swa, swa_idx, swa_len, ext, ext_idx, ext_len


def _dev(*ts):
    return [t.to(DEVICE) for t in ts]


def _check(out, lse, ref_out, ref_lse, dtype, empty_rows=()):
    out, lse = out.cpu().double(), lse.cpu().double()
    assert torch.isfinite(out).all()
    err = (out - ref_out).norm() / ref_out.norm()
    assert err < TOL[dtype], f"relative error {err:.2e} for {dtype}"
    full = [r for r in range(out.shape[0]) if r not in empty_rows]
    assert torch.allclose(lse[full], ref_lse[full], rtol=1e-4, atol=TOL[dtype] * 10)
    for r in empty_rows:
        assert torch.isinf(lse[r]).all() and (lse[r] > 0).all()


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])  # bf16: GPU only (interpreter)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("splits", [1, None])
def test_paged_decode_matches_float64_reference_from_the_pool_bytes(dtype, with_sink, splits):
    gen = torch.Generator().manual_seed(hash((str(dtype), with_sink, splits)) % 2**31)
    b, h = 3, 20  # h not a multiple of the head block
    q, swa, swa_idx, swa_len, ext, ext_idx, ext_len = _case(b, h, 40, 70, gen)
    kw = {"sink": torch.randn(h, generator=gen)} if with_sink else {}
    out, lse = paged_dual_scope_decode(q.to(dtype).to(DEVICE), swa, *_dev(swa_idx, swa_len), ext,
                                       *_dev(ext_idx, ext_len), splits=splits, block_kv=16,
                                       **{n: v.to(DEVICE) for n, v in kw.items()})  # fmt: skip
    assert out.shape == (b, h, 512) and out.dtype == dtype and lse.shape == (b, h)
    ref_out, ref_lse = paged_dual_scope_decode_reference(q.to(dtype), swa, swa_idx, swa_len, ext, ext_idx, ext_len,
                                                         **kw)  # fmt: skip
    _check(out, lse, ref_out, ref_lse, dtype, empty_rows=(2,))
    assert (out[2].cpu() == 0).all()  # no entry: zeros, with or without the sink


def test_a_sink_far_above_the_scores_keeps_the_entries_lse_exact():
    """The merge keeps the entries' log-sum-exp relative to their own maximum, so a sink logit far above every
    score (all probability on the sink) neither underflows the entries' sum nor marks the row empty."""
    gen = torch.Generator().manual_seed(5)
    b, h = 2, 16
    q, swa, swa_idx, swa_len, ext, ext_idx, ext_len = _case(b, h, 32, 48, gen)
    q = q * 0.01  # scores near 0; the sink at 120 nats is about 173 in log2 units, past float32's range
    sink = torch.full((h,), 120.0)
    for splits in (1, None):
        out, lse = paged_dual_scope_decode(q.to(DEVICE), swa, *_dev(swa_idx, swa_len), ext, *_dev(ext_idx, ext_len),
                                           sink=sink.to(DEVICE), splits=splits, block_kv=16)  # fmt: skip
        _, ref_lse = paged_dual_scope_decode_reference(q, swa, swa_idx, swa_len, ext, ext_idx, ext_len, sink=sink)
        assert torch.isfinite(lse.cpu()).all() and torch.isfinite(out.cpu()).all()
        assert torch.allclose(lse.cpu().double(), ref_lse, rtol=1e-5, atol=1e-4)
        assert out.abs().max().item() < 1e-30  # the sink takes all the probability


def test_window_only_no_lengths_and_custom_scale():
    gen = torch.Generator().manual_seed(11)
    q, swa, swa_idx, _, _, _, _ = _case(2, 16, 48, 16, gen, swa_page=32)
    swa_idx[1, :7] = -1
    swa_idx[0, 16:32] = -1  # a whole tile of holes between live tiles
    out, lse = paged_dual_scope_decode(q.to(DEVICE), swa, *_dev(swa_idx), sm_scale=0.03, block_kv=16)
    ref_out, ref_lse = paged_dual_scope_decode_reference(q, swa, swa_idx, sm_scale=0.03)
    _check(out, lse, ref_out, ref_lse, torch.float32)


def test_pool_round_trip_and_argument_checks():
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(10, 512, generator=gen)
    buf = torch.zeros(2, page_bytes(8), dtype=torch.uint8)
    slots = torch.tensor([0, 3, 7, 8, 9, 10, 11, 12, 14, 15])
    write_v4_pool(buf, 8, slots, *quantize_v4_rows(keys))
    back = dequant_v4_slots(flashmla_view(buf, 8), slots)
    assert ((back - keys.double()).norm(dim=1) / keys.double().norm(dim=1)).max() < 0.07  # e4m3: 3 mantissa bits
    assert torch.equal(back[:, 448:], keys[:, 448:].bfloat16().double())  # rope stays bf16
    q = torch.randn(1, 4, 512)
    with pytest.raises(ValueError, match="byte view"):
        paged_dual_scope_decode(q, buf, slots[None].int())
    with pytest.raises(ValueError, match="q must be"):
        paged_dual_scope_decode(q[..., :256], flashmla_view(buf, 8), slots[None].int())


@pytest.mark.skipif(not ON_GPU, reason="realistic shapes need a GPU")
@pytest.mark.parametrize("b", [1, 8, 64])
def test_realistic_shapes_on_gpu(b):
    """DeepSeek-V4 decode as SGLang runs it: H=64, D=512, window 128 (page 256) + 512 selected C4 entries
    (page 64), bf16 q, attention sink. Prints the median time next to the contiguous kernel's."""
    from zoe_kernels.csa import dual_scope_decode

    gen = torch.Generator().manual_seed(b)
    h, w, k = 64, 128, 512
    q, swa, swa_idx, swa_len, ext, ext_idx, ext_len = _case(b, h, w, k, gen, swa_page=256, ext_page=64)
    swa_len[:] = w
    if b > 2:
        swa_len[2] = 0  # keep _case's empty row (no window, no selected entry) empty
    sink = torch.randn(h, generator=gen)
    args = (q.bfloat16().cuda(), swa, *_dev(swa_idx, swa_len), ext, *_dev(ext_idx, ext_len))
    out, lse = paged_dual_scope_decode(*args, sink=sink.cuda())
    ref_out, ref_lse = paged_dual_scope_decode_reference(q.bfloat16(), swa, swa_idx, swa_len, ext, ext_idx, ext_len,
                                                         sink=sink)  # fmt: skip
    _check(out, lse, ref_out, ref_lse, torch.bfloat16, empty_rows=(2,) if b > 2 else ())

    # the same entries as contiguous tensors, for the contiguous kernel's time
    win = torch.stack([dequant_v4_slots(swa, swa_idx[i]) for i in range(b)]).cuda().bfloat16()
    comp = torch.stack([dequant_v4_slots(ext, ext_idx[i].clamp(min=0)) for i in range(b)]).cuda().bfloat16()
    comp_idx = torch.arange(k, dtype=torch.int32).expand(b, k).masked_fill(ext_idx < 0, -1).cuda()

    def median_us(fn):
        for _ in range(3):
            fn()
        ts = []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e6)
        return sorted(ts)[len(ts) // 2]

    paged = median_us(lambda: paged_dual_scope_decode(*args, sink=sink.cuda()))
    contiguous = median_us(lambda: dual_scope_decode(args[0], win, win, swa_len.cuda(), comp, comp, comp_idx,
                                                     sink=sink.cuda()))  # fmt: skip
    print(f"\npaged_dual_scope B={b} H={h} W={w} k={k}: paged {paged:.1f} us, contiguous bf16 {contiguous:.1f} us")
