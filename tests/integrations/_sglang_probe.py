"""Runs under the SGLang venv's python (sglang 0.5.23 without its CUDA dependencies); prints JSON.

    python _sglang_probe.py plugins REPORT_DIR   SGLang's own load_plugins() runs zoe's hook
    python _sglang_probe.py sources              the replaced functions' parameters in the installed source
    python _sglang_probe.py topk                 zoe's paged top-K vs SGLang's PyTorch top-K transform
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import sglang

mode = sys.argv[1]
SGLANG_DIR = Path(sglang.__path__[0])


def sglang_function(module_rel: str, names: list[str], namespace: dict) -> dict:
    """Compiles SGLang's own pure-PyTorch functions from the installed source (their module cannot be
    imported here: it pulls CUDA-only packages)."""
    tree = ast.parse((SGLANG_DIR / module_rel).read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), module_rel, "exec"), namespace)
    return namespace


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
    from zoe_kernels.integrations import sglang_hook as h

    print(json.dumps({
        "version": sglang.__version__,
        "v1": h.source_params(f"{h.INDEXER}:topk_transform_paged", SGLANG_DIR),
        "v2": h.source_params(f"{h.INDEXER}:topk_transform_paged_v2", SGLANG_DIR),
        "expected_v1": h.TOPK_V1_PARAMS,
        "expected_v2": h.TOPK_V2_PARAMS,
    }))  # fmt: skip
elif mode == "topk":
    assert os.environ.get("TRITON_INTERPRET") == "1"
    from typing import Callable, Dict, Optional, Tuple

    import torch
    import torch.nn.functional as F

    from zoe_kernels.csa.topk import topk
    from zoe_kernels.integrations.sglang_hook import paged_topk

    ns = sglang_function(
        "srt/layers/attention/dsv4/indexer.py",
        ["_topk_transform_vectorized", "topk_transform_pytorch_vectorized"],
        {"torch": torch, "F": F, "Optional": Optional, "Callable": Callable, "Tuple": Tuple, "Dict": Dict,
         "_arange_cache": {}},
    )  # fmt: skip
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
