"""The dual-scope benchmark's access-pattern kernel (bench/kernels/sparse_decode_limits.py): it must read exactly the
rows a decode call reads, so its bandwidth is that of the call's own pattern."""

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.kernels._sparse_device import DEVICE, FP8

pytestmark = pytest.mark.kernels

LIMITS = Path(__file__).resolve().parents[2] / "bench" / "kernels" / "sparse_decode_limits.py"


def _limits():
    spec = importlib.util.spec_from_file_location("sparse_decode_limits", LIMITS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _words(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).view(torch.int32).long()


def test_gather_reads_the_rows_the_call_reads():
    limits = _limits()
    gen = torch.Generator().manual_seed(7)
    b, w, d, nc, k = 3, 128, 512, 300, 70
    q = torch.randn(b, 4, d, generator=gen).to(torch.bfloat16)
    win_k = torch.randn(b, w, d, generator=gen).to(FP8)
    win_v = torch.randn(b, w, d, generator=gen).to(torch.bfloat16)
    comp_k = torch.randn(b, nc, d, generator=gen).to(FP8)
    comp_v = torch.randn(b, nc, d, generator=gen).to(torch.bfloat16)
    win_ks, comp_ks = torch.rand(b, w, generator=gen), torch.rand(b, nc, generator=gen)
    idx = torch.stack([torch.randperm(nc, generator=gen)[:k] for _ in range(b)]).int()
    idx[1, 50:] = -1  # a -1 padded selection
    idx[2, ::3] = -1  # holes
    win_len = torch.tensor([128, 77, 1], dtype=torch.int32)
    inputs = [t.to(DEVICE) for t in (q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks)]
    call, grid = limits.gather_call(inputs)
    assert grid == (b, 2 + 2, 3)  # two window tiles, two tiles of selections, keys + two value halves
    total = int(call().cpu().long().sum())
    expected = 0
    for s in range(b):
        n = int(win_len[s])
        sel = idx[s][idx[s] >= 0].long()
        expected += int(_words(win_k)[s, :n].sum() + _words(win_v)[s, :n].sum() + win_ks.view(torch.int32)[s, :n].sum())
        expected += int(_words(comp_k)[s, sel].sum() + _words(comp_v)[s, sel].sum()
                        + comp_ks.view(torch.int32)[s, sel].sum())
    assert (total - expected) % (1 << 32) == 0  # int32 sums wrap
    valid = int(win_len.sum()) + int((idx >= 0).sum())
    assert limits.gathered_bytes(win_len, idx, d) == valid * (3 * d + 4) + idx.numel() * 4
