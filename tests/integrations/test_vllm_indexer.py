"""The vLLM indexer wrapper's pure parts, without vLLM: the row-compressed form of vLLM 0.33's logits, and the calls
zoe leaves to the engine (with the reason counted)."""

from __future__ import annotations

import torch

from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.vllm_indexer import _cuda_wrap, compress_rows


def test_compress_rows_starts_each_row_at_its_first_key():
    full = torch.arange(24, dtype=torch.float32).view(3, 8)
    ks = torch.tensor([0, 3, 6], dtype=torch.int32)
    out = compress_rows(full, ks, 4)
    assert out.shape == (3, 4)
    assert out[0].tolist() == [0, 1, 2, 3] and out[1].tolist() == [11, 12, 13, 14]
    assert out[2, :2].tolist() == [22, 23]  # past N: not read by the caller (ke - ks <= 2 there)
    assert compress_rows(full[:0], ks[:0], 4).shape == (0, 4)


def test_scaled_or_fp4_calls_stay_on_vllms_path_with_the_reason(tmp_path):
    rep = KernelReporter("vllm", "0.33.0", ["lightning_indexer"], tmp_path)
    calls = []

    def engine(q, kv, weights, ks, ke, max_seqlen_k):
        calls.append(max_seqlen_k)
        return "engine"

    patched = _cuda_wrap(rep, compressed=True)(engine)
    q = torch.zeros(2, 4, 128, dtype=torch.float8_e4m3fn)
    k = torch.zeros(5, 128, dtype=torch.float8_e4m3fn)
    ks, ke, w = torch.zeros(2, dtype=torch.int32), torch.full((2,), 5, dtype=torch.int32), torch.ones(2, 4)
    unit = torch.full((2, 4), 0x7F7F7F7F, dtype=torch.int32)  # SM100: unit UE8M0 q scales, int32 k scales
    assert patched((q, unit), (k, torch.zeros(5, dtype=torch.int32)), w, ks, ke, 5) == "engine"
    fp4 = torch.zeros(2, 4, 64, dtype=torch.int8)
    assert patched((fp4, unit), (k.view(torch.int8)[:, :64], torch.zeros(5, dtype=torch.int32)), w, ks, ke, 5) \
        == "engine"
    assert calls == [5, 5]
    assert rep.report.calls["lightning_indexer"] == {"zoe": 0, "engine": 2}
    assert rep.report.engine_path_reasons["lightning_indexer"] == {"mx_scales": 1, "fp4": 1}
