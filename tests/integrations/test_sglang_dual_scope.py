"""Which SGLang FlashMLA decode calls the csa_dual_scope patch takes, and the path it takes (no SGLang needed)."""

from __future__ import annotations

import torch

from zoe_kernels.integrations.report import KernelReporter
from zoe_kernels.integrations.sglang_dual_scope import _cuda_wrap, _hip_wrap, engine_path_reason


def _call(**over):
    b, h = 2, 4
    kw = dict(q=torch.zeros(b, 1, h, 512, dtype=torch.bfloat16), k_cache=torch.zeros(3, 64, 1, 584, dtype=torch.uint8),
              block_table=None, cache_seqlens=None, head_dim_v=512, tile_scheduler_metadata=None,
              is_fp8_kvcache=True, indices=torch.zeros(b, 1, 128, dtype=torch.int32),
              topk_length=torch.ones(b, dtype=torch.int32), attn_sink=torch.zeros(h),
              extra_k_cache=torch.zeros(5, 16, 1, 584, dtype=torch.uint8),
              extra_indices_in_kvcache=torch.zeros(b, 1, 512, dtype=torch.int32),
              extra_topk_length=torch.ones(b, dtype=torch.int32))  # fmt: skip
    return {**kw, **over}


def test_zoe_takes_one_token_sparse_decode_over_v4_pools_only():
    assert engine_path_reason(_call()) is None
    assert engine_path_reason(_call(extra_k_cache=None, extra_indices_in_kvcache=None)) is None
    assert engine_path_reason(_call(indices=None)) == "dense"
    assert engine_path_reason(_call(block_table=torch.zeros(2, 4, dtype=torch.int32))) == "dense"
    assert engine_path_reason(_call(is_fp8_kvcache=False)) == "format"
    assert engine_path_reason(_call(k_cache=torch.zeros(3, 64, 1, 528, dtype=torch.uint8))) == "layout"  # V4.1
    assert engine_path_reason(_call(extra_k_cache=torch.zeros(3, 64, 1, 288, dtype=torch.uint8))) == "layout"
    assert engine_path_reason(_call(q=torch.zeros(2, 2, 4, 512, dtype=torch.bfloat16))) == "shape"  # 2 tokens/row
    assert engine_path_reason(_call(head_dim_v=448)) == "shape"
    assert engine_path_reason(_call(attn_sink=torch.zeros(64))) == "shape"  # heads padded for another kernel
    assert engine_path_reason(_call(q=torch.zeros(2, 1, 4, 512))) == "dtype"
    assert engine_path_reason(_call(inv_rope=(torch.zeros(1), torch.zeros(1)))) == "inv_rope"


def test_wrapper_sends_other_calls_to_the_engine_and_counts_them(tmp_path):
    rep = KernelReporter("sglang", "0.5.23", ["csa_dual_scope"], tmp_path)
    seen = []

    def original(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits=None,
                 softmax_scale=None, causal=False, descale_q=None, descale_k=None, is_fp8_kvcache=False, indices=None,
                 attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                 extra_topk_length=None, kv_format=None, *, use_legacy=True):  # fmt: skip
        seen.append((k_cache.shape[-1], use_legacy))
        return "engine", None

    patched = _cuda_wrap(rep)(original)
    kw = _call(k_cache=torch.zeros(3, 64, 1, 528, dtype=torch.uint8), extra_k_cache=None,
               extra_indices_in_kvcache=None)  # fmt: skip
    assert patched(**kw, use_legacy=False) == ("engine", None)
    assert seen == [(528, False)]
    assert rep.report.calls["csa_dual_scope"] == {"zoe": 0, "engine": 1}
    assert rep.report.engine_path_reasons["csa_dual_scope"] == {"layout": 1}
    # a call zoe takes but whose kernel raises: a loud runtime_error fallback, then SGLang's path for good
    bad = _call(extra_indices_in_kvcache=torch.zeros(3, 1, 512, dtype=torch.int32))  # batch 3 != 2
    assert patched(**bad) == ("engine", None) and patched(**_call()) == ("engine", None)
    assert [f["reason"] for f in rep.report.fallbacks] == ["runtime_error"]
    assert "csa_dual_scope" not in rep.report.patched
    assert rep.report.engine_path_reasons["csa_dual_scope"] == {"layout": 1, "zoe_error": 2}


FP8_DTYPE = torch.float8_e4m3fnuz  # what hip_flash_mla defines on gfx942; the HIP wrapper reads its module's


def test_hip_entry_point_wrapper_keeps_the_backend_and_reads_the_pools_fp8_flavour(tmp_path, monkeypatch):
    from zoe_kernels.integrations import sglang_dual_scope as ds

    rep = KernelReporter("sglang", "0.5.23", ["csa_dual_scope"], tmp_path)
    seen, ran = [], []

    def flash_mla_with_kvcache_entrypoint(backend, **kwargs):
        seen.append((backend, kwargs["k_cache"].shape[-1]))
        return "engine", None

    monkeypatch.setattr(ds, "run_zoe", lambda kw, fp8: ran.append(fp8) or ("zoe", None))
    patched = _hip_wrap(rep)(flash_mla_with_kvcache_entrypoint)
    assert patched(**_call(), backend="aiter_sparse") == ("zoe", None)
    assert ran == [torch.float8_e4m3fnuz]
    v41 = _call(k_cache=torch.zeros(3, 64, 1, 528, dtype=torch.uint8), extra_k_cache=None,
                extra_indices_in_kvcache=None)  # fmt: skip
    assert patched(**v41, backend="aiter_sparse") == ("engine", None)
    assert seen == [("aiter_sparse", 528)]
    assert rep.report.calls["csa_dual_scope"] == {"zoe": 1, "engine": 1}
