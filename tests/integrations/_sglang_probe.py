"""Runs under an SGLang test environment's python (sglang 0.5.23, or 0.5.19 over it; no CUDA dependencies);
prints JSON.

    python _sglang_probe.py plugins REPORT_DIR   SGLang's own load_plugins() runs zoe's hook
    python _sglang_probe.py sources              the replaced functions' parameters in the installed source
    python _sglang_probe.py topk                 zoe's paged top-K vs SGLang's PyTorch top-K transform
    python _sglang_probe.py dual_scope REPORT_DIR  the patched FlashMLA decode call over pools SGLang wrote
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

mode = sys.argv[1]
# located, not imported: sglang 0.5.19's package __init__ alone needs torchvision (the modes that need SGLang's
# own code import what they use)
SGLANG_DIR = Path(importlib.util.find_spec("sglang").origin).parent
SGLANG_VERSION = importlib.metadata.version("sglang")


def sglang_function(module_rel: str, names: list[str], namespace: dict) -> dict:
    """Compiles SGLang's own pure-PyTorch functions from the installed source (their module cannot be
    imported here: it pulls CUDA-only packages)."""
    tree = ast.parse((SGLANG_DIR / module_rel).read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), module_rel, "exec"), namespace)
    return namespace


if mode in ("plugins", "dual_scope"):
    import sglang

if mode == "plugins":
    os.environ["ZOE_KERNELS_REPORT_DIR"] = sys.argv[2]
    os.environ["ZOE_KERNELS"] = "csa_topk,csa_dual_scope"
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from zoe_kernels.integrations.report import read_reports

    scheduler_src = (SGLANG_DIR / "srt/managers/scheduler.py").read_text()
    print(json.dumps({
        "reports": [r.__dict__ for r in read_reports(sys.argv[2])],
        "scheduler_loads_plugins": "load_plugins()" in scheduler_src,
    }))  # fmt: skip
elif mode == "sources":
    from zoe_kernels.integrations import sglang_dual_scope as ds
    from zoe_kernels.integrations import sglang_hook as h

    print(json.dumps({
        "version": SGLANG_VERSION,
        "v1": h.source_params(f"{h.INDEXER}:topk_transform_paged", SGLANG_DIR),
        "v2": h.source_params(f"{h.INDEXER}:topk_transform_paged_v2", SGLANG_DIR),
        "expected_v1": h.TOPK_V1_PARAMS,
        "expected_v2": h.TOPK_V2_PARAMS,
        "flash_mla": h.source_params(ds.CUDA_TARGET, SGLANG_DIR),
        "expected_flash_mla": ds.CUDA_PARAMS,
        "hip_entry": h.source_params(ds.HIP_TARGET, SGLANG_DIR),
        "expected_hip_entry": ds.HIP_PARAMS,
    }))  # fmt: skip
elif mode == "topk":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from typing import Callable, Dict, Optional, Tuple

    import torch
    import torch.nn.functional as F

    from zoe_kernels.csa.topk import topk
    from zoe_kernels.integrations.sglang_hook import paged_topk

    # SGLang's PyTorch reference of its paged top-K (named topk_transform_512_* in 0.5.19)
    names = ["_topk_transform_vectorized", "topk_transform_pytorch_vectorized"]
    if SGLANG_VERSION.startswith("0.5.19"):
        names = ["_topk_transform_512_vectorized", "topk_transform_512_pytorch_vectorized"]
    ns = sglang_function(
        "srt/layers/attention/dsv4/indexer.py", names,
        {"torch": torch, "F": F, "Optional": Optional, "Callable": Callable, "Tuple": Tuple, "Dict": Dict,
         "_arange_cache": {}},
    )  # fmt: skip
    ns["topk_transform_pytorch_vectorized"] = ns[names[1]]
    torch.manual_seed(0)
    k, page_size, n = 64, 16, 300
    seq_lens = torch.tensor([300, 40, 64, 0, 129], dtype=torch.int32)
    b = seq_lens.numel()
    scores = torch.randn(b, n, dtype=torch.float32)
    page_tables = torch.stack([torch.randperm(64, dtype=torch.int32)[: -(-n // page_size)] for _ in range(b)])
    mismatches = []
    for use_pages in (True, False):
        outs = {}
        for who in ("sglang", "zoe"):
            pages = torch.full((b, k), -7, dtype=torch.int32)
            raw = torch.full((b, k), -7, dtype=torch.int32)
            if who == "sglang":
                ns["topk_transform_pytorch_vectorized"](scores, seq_lens, page_tables, pages, page_size, raw)
                if not use_pages:
                    pages = raw.clone()
            else:
                paged_topk(topk, scores, seq_lens, page_tables if use_pages else None, pages, page_size, raw)
            assert not (pages == -7).any() and not (raw == -7).any(), f"{who} left outputs unwritten"
            outs[who] = (pages.sort(dim=1).values, raw.sort(dim=1).values)
        for name, a, z in zip(("pages", "raw"), outs["sglang"], outs["zoe"]):
            if not torch.equal(a, z):
                mismatches.append(f"{name} use_pages={use_pages}: {a.tolist()} vs {z.tolist()}")
    selected = int((outs["zoe"][1] >= 0).sum())
    print(json.dumps({"mismatches": mismatches, "rows": b, "k": k, "selected": selected}))
elif mode == "dual_scope":
    # SGLang's FlashMLA interface module imports the CUDA-only `flash_mla` wheel at the top; a stand-in
    # package lets the real module (and its real function object, the patch target) load here. Its kernel
    # only records that it was called (SGLang's own path), so the probe sees which path each call took.
    assert os.environ.get("TRITON_INTERPRET") == "1"
    import functools
    import types

    import torch

    engine_calls = []
    stub = types.ModuleType("flash_mla")
    stub.flash_mla_with_kvcache = lambda **kw: engine_calls.append(sorted(kw)) or ("engine", None)
    stub.get_mla_metadata = lambda *a, **k: (None, None)
    stub.fused_norm_rope_attn_rope_cast = types.ModuleType("flash_mla.fused_norm_rope_attn_rope_cast")
    stub_iface = types.ModuleType("flash_mla.flash_mla_interface")
    stub_iface.FlashMLASchedMeta = type("FlashMLASchedMeta", (), {})
    stub.flash_mla_interface = stub_iface
    sys.modules.update({"flash_mla": stub, "flash_mla.flash_mla_interface": stub_iface,
                        "flash_mla.fused_norm_rope_attn_rope_cast": stub.fused_norm_rope_attn_rope_cast})  # fmt: skip
    from sglang.kernels.ops.attention import flash_mla_interface
    from sglang.kernels.ops.kvcache.dsv4_main_kv_store import NopeFp8RopeBf16Pack, _set_k_and_s_triton

    from zoe_kernels.csa import paged_dual_scope as pds
    from zoe_kernels.integrations.report import KernelReporter, read_reports
    from zoe_kernels.integrations.sglang_hook import patch_sglang

    gen = torch.Generator().manual_seed(7)

    def pool(page_size, pages, tokens):
        """The pool buffer written by SGLang's own store kernel, and the same bytes written by zoe's helper."""
        slots = torch.randperm(pages * page_size, generator=gen)[:tokens]
        keys = torch.randn(tokens, 512, generator=gen) * (torch.rand(tokens, 1, generator=gen) * 4 + 0.1)
        nope, rope, scale = pds.quantize_v4_rows(keys)
        ours = torch.full((pages, pds.page_bytes(page_size)), 0xFF, dtype=torch.uint8)
        theirs = ours.clone()
        pds.write_v4_pool(ours, page_size, slots, nope, rope, scale)
        _set_k_and_s_triton(theirs, slots, NopeFp8RopeBf16Pack(nope, rope, scale), page_size)
        return theirs, slots, bool(torch.equal(ours, theirs))

    swa_page, ext_page, b, h, k_swa, k_ext = 64, 16, 3, 16, 64, 128
    swa_buf, swa_slots, swa_same = pool(swa_page, 3, 150)
    ext_buf, ext_slots, ext_same = pool(ext_page, 20, 300)
    pick = lambda slots, k: torch.stack([slots[torch.randperm(slots.numel(), generator=gen)[:k]] for _ in range(b)])
    swa_idx, ext_idx = pick(swa_slots, k_swa).int(), pick(ext_slots, k_ext).int()
    ext_idx[:, 100:] = -1
    swa_len = torch.tensor([64, 20, 1], dtype=torch.int32)
    ext_len = torch.tensor([128, 64, 0], dtype=torch.int32)
    q = torch.randn(b, 1, h, 512, generator=gen).half()
    sink = torch.randn(h, generator=gen)

    reporter = KernelReporter("sglang", sglang.__version__, ["csa_dual_scope"], sys.argv[2])
    patched = patch_sglang(["csa_dual_scope"], reporter, sglang.__version__)
    # what DeepseekV4AttnBackend.__init__ binds and _forward_attention calls (deepseek_v4_backend.py)
    call = functools.partial(flash_mla_interface.flash_mla_with_kvcache, use_legacy=True)
    swa_view = swa_buf[:, : swa_page * 584].view(swa_buf.shape[0], swa_page, 1, 584)
    ext_view = ext_buf[:, : ext_page * 584].view(ext_buf.shape[0], ext_page, 1, 584)
    out, lse = call(q=q, k_cache=swa_view, head_dim_v=512, block_table=None, cache_seqlens=None,
                    tile_scheduler_metadata=stub_iface.FlashMLASchedMeta(), softmax_scale=512**-0.5,
                    is_fp8_kvcache=True, indices=swa_idx[:, None], topk_length=swa_len, attn_sink=sink,
                    extra_k_cache=ext_view, extra_indices_in_kvcache=ext_idx[:, None],
                    extra_topk_length=ext_len)  # fmt: skip
    ref_out, ref_lse = pds.paged_dual_scope_decode_reference(q[:, 0], swa_view, swa_idx, swa_len, ext_view, ext_idx,
                                                             ext_len, sink=sink)  # fmt: skip
    err = float((out[:, 0].double() - ref_out).norm() / ref_out.norm())
    # a V4.1 pool (528 bytes a token) is not zoe's: SGLang's own kernel runs
    v41 = torch.zeros(2, 16, 1, 528, dtype=torch.uint8)
    engine_out = call(q=q, k_cache=v41, head_dim_v=512, block_table=None, cache_seqlens=None,
                      tile_scheduler_metadata=stub_iface.FlashMLASchedMeta(), is_fp8_kvcache=True,
                      indices=swa_idx[:, None], topk_length=swa_len, attn_sink=sink)  # fmt: skip
    reporter.flush()
    backend_src = (SGLANG_DIR / "srt/layers/attention/deepseek_v4_backend.py").read_text()
    print(json.dumps({
        "patched": patched, "pool_bytes_match_sglang_writer": swa_same and ext_same,
        "out_shape": list(out.shape), "lse_shape": list(lse.shape), "rel_err": err,
        "lse_err": float((lse[:2, 0].double() - ref_lse[:2]).abs().max()),
        "engine_result": engine_out[0], "engine_calls": len(engine_calls),
        "reports": [r.__dict__ for r in read_reports(sys.argv[2])],
        "backend_binds_interface": "flash_mla_interface.flash_mla_with_kvcache," in backend_src,
    }))  # fmt: skip
