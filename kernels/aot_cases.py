"""The calls `zoe_kernels.aot` compiles: every entry point at the recipe shapes, decode and prefill.

Shapes come from the recipes' `architecture` sections (recipes/*.yaml: hidden size, routed experts, experts per token,
MoE intermediate size, DSA indexer heads and top-k, CSA top-k and window) and their variants' quantization, plus
two models without a recipe that the seed measures: Kimi-K2.6 a16w4 (H=7168, E=384, top-8: the w4a16 format, seed
figure 10) and ZAYA1 (E=24, top-1, fp8: seed figure 10; H=2048 from its model card, I=2048 assumed as in
bench/kernels/moe_bench.py). MoE runs at full expert width and at the TP8 slice (I/8, what each GPU of a TP8
replica holds), at every M the dispatcher (`dispatch.moe_impl_for`) sends to zoe's kernels.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

import torch

from zoe_kernels import platform

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
# Tokens per MoE call: decode steps (1 token per sequence, up to 256 sequences) and prefill chunks.
MOE_DECODE_M = (1, 8, 16, 64, 256)
MOE_PREFILL_M = (1024, 4096, 16384)
TP = 8  # the recipes' tensor-parallel degree: the per-GPU expert slice is I / TP
# DSA indexer: decode rows (one per sequence) over a cached context, and causal prefill squares / a short chunk
# after a long prefix.
INDEXER_DECODE = ((1, 65536), (32, 65536), (64, 163840))
INDEXER_PREFILL = ((4096, 4096), (16384, 16384), (2048, 65536))
# CSA top-K decode: (batch, compressed entries per request); DeepSeek-V4-Pro's 1M context at ratio 4 is 262,144.
TOPK_DECODE_BATCH = (1, 8, 32, 64)
# CSA dual-scope decode batches, heads per GPU and head dim (DeepSeek-V4-Pro at TP8: 128 heads / 8 = 16; the seed's
# kernel benchmark runs 64 heads), the 512-dim latent.
DUAL_SCOPE_BATCH = (1, 4, 8, 16, 32, 64, 128)
DUAL_SCOPE_HEADS = (16, 64)
DUAL_SCOPE_D = 512
# The seed's models without a recipe here (figure 10).
EXTRA_MOE = {
    "kimi-k2.6": {"hidden_size": 7168, "routed_experts": 384, "experts_per_token": 8, "moe_intermediate_size": 2048,
                  "formats": ["w4a16"]},
    "zaya1": {"hidden_size": 2048, "routed_experts": 24, "experts_per_token": 1, "moe_intermediate_size": 2048,
              "formats": ["fp8"]},
}
_QUANT_FORMAT = {"fp8": "fp8", "mxfp4": "mxfp4", None: "bf16", "none": "bf16", "bf16": "bf16"}


@dataclasses.dataclass
class Case:
    """One entry-point call: a name (family, model, shape), its phase ("decode" or "prefill") and the call."""

    name: str
    phase: str
    call: Callable[[], object]
    shape: dict = dataclasses.field(default_factory=dict)  # the call's sizes, for bench/kernels/amd_estimate.py


def load_recipe_shapes(recipes_dir: Path = RECIPES_DIR) -> dict[str, dict]:
    """{model: its `architecture` section and the MoE formats its variants quantize to}, from recipes/*.yaml."""
    import yaml

    shapes = {}
    for path in sorted(recipes_dir.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        model = doc.get("architecture")
        if not isinstance(model, dict) or "hidden_size" not in model:
            raise ValueError(f"{path}: field 'architecture.hidden_size' is missing (the AOT cases read the model's shape)")
        formats = set()
        for name, variant in (doc.get("variants") or {}).items():
            quant = ((variant or {}).get("weights") or {}).get("quantization")
            if quant not in _QUANT_FORMAT:
                raise ValueError(f"{path}: variants.{name}.weights.quantization {quant!r} has no MoE kernel format")
            formats.add(_QUANT_FORMAT[quant])
        shapes[path.stem] = dict(model, formats=sorted(formats or {"bf16"}))
    return shapes


def _fake(shape, dtype, dev="cuda"):
    return torch.empty(shape, dtype=dtype, device=dev)


def moe_call(m: int, h: int, i: int, e: int, k: int, fmt: str, path: str | None = None) -> Callable[[], object]:
    """`fused_moe` at one shape and format on fake tensors (weights in the target's fp8 flavour); `path` forces
    the GEMV, the tl.dot or the dequant path as `fused_moe(path=...)` does."""
    from zoe_kernels.moe import fused_moe
    from zoe_kernels.moe.formats import FP8_BLOCK, INT4_GROUP, MX_GROUP

    def call():
        x = _fake((m, h), torch.bfloat16)
        ids = _fake((m, k), torch.int32)
        weights = _fake((m, k), torch.float32)
        if fmt == "bf16":
            w13, w2, s13, s2 = _fake((e, 2 * i, h), torch.bfloat16), _fake((e, h, i), torch.bfloat16), None, None
        elif fmt == "fp8":
            f8 = platform.fp8_dtype()
            w13, w2 = _fake((e, 2 * i, h), f8), _fake((e, h, i), f8)
            s13 = _fake((e, math.ceil(2 * i / FP8_BLOCK), math.ceil(h / FP8_BLOCK)), torch.float32)
            s2 = _fake((e, math.ceil(h / FP8_BLOCK), math.ceil(i / FP8_BLOCK)), torch.float32)
        else:
            group, sdt = (INT4_GROUP, torch.float32) if fmt == "w4a16" else (MX_GROUP, torch.uint8)
            w13, w2 = _fake((e, 2 * i, h // 2), torch.uint8), _fake((e, h, i // 2), torch.uint8)
            s13, s2 = _fake((e, 2 * i, math.ceil(h / group)), sdt), _fake((e, h, math.ceil(i / group)), sdt)
        return fused_moe(x, w13, w2, weights, ids, fmt=fmt, w13_scale=s13, w2_scale=s2, path=path)

    return call


def moe_cases(target: platform.Target, shapes: dict[str, dict]) -> list[Case]:
    """fused_moe for every model, format, expert width (full, TP8 slice) and M the dispatcher gives zoe."""
    from zoe_kernels.dispatch import moe_impl_for

    cases = []
    for model, s in {**shapes, **EXTRA_MOE}.items():
        if "moe_intermediate_size" not in s:
            continue
        h, e, k, full_i = s["hidden_size"], s["routed_experts"], s["experts_per_token"], s["moe_intermediate_size"]
        for fmt in s["formats"]:
            for width, i in (("full", full_i), ("tp8", full_i // TP)):
                for m in MOE_DECODE_M + MOE_PREFILL_M:
                    if moe_impl_for(m, fmt, target.name) != "zoe":
                        continue
                    phase = "decode" if m in MOE_DECODE_M else "prefill"
                    cases.append(Case(f"moe {model} {fmt} {width} M={m}", phase, moe_call(m, h, i, e, k, fmt),
                                      dict(op="moe", model=model, fmt=fmt, width=width, M=m, H=h, I=i, E=e, k=k)))
    # the 4-bit formats' dequant path (`dequant.py`) at the prefill M, where `dispatch.moe_path_for` takes it on a
    # device whose crossover table measured it faster; forced, since no AMD device has such a measurement
    for model, s in {**shapes, **EXTRA_MOE}.items():
        if "moe_intermediate_size" not in s:
            continue
        h, e, k, full_i = s["hidden_size"], s["routed_experts"], s["experts_per_token"], s["moe_intermediate_size"]
        for fmt in (f for f in s["formats"] if f in ("w4a16", "mxfp4")):
            for width, i in (("full", full_i), ("tp8", full_i // TP)):
                for m in MOE_PREFILL_M:
                    if moe_impl_for(m, fmt, target.name) != "zoe":
                        continue
                    cases.append(Case(f"moe-forced dequant {model} {fmt} {width} M={m}", "prefill",
                                      moe_call(m, h, i, e, k, fmt, "dequant"),
                                      dict(op="moe", model=model, fmt=fmt, width=width, M=m, H=h, I=i, E=e, k=k,
                                           path="dequant")))
    # the path the dispatcher does not pick at these shapes, as `fused_moe(path=...)` can force it (DeepSeek-V3.2)
    s = shapes.get("deepseek-v3.2", EXTRA_MOE["kimi-k2.6"])
    h, e, k, i = s["hidden_size"], s["routed_experts"], s["experts_per_token"], s["moe_intermediate_size"]
    for fmt in ("bf16", "fp8", "w4a16", "mxfp4"):
        path = "gemv" if fmt in ("bf16", "fp8") else "dot"
        for m in (1, 8):
            cases.append(Case(f"moe-forced {path} {fmt} M={m}", "decode", moe_call(m, h, i, e, k, fmt, path),
                              dict(op="moe", model="deepseek-v3.2", fmt=fmt, width="full", M=m, H=h, I=i, E=e, k=k,
                                   path=path)))
    return cases


def indexer_call(m: int, n: int, heads: int, dim: int, top_k: int) -> Callable[[], object]:
    """The DSA indexer (logits, then their top-k) at M query rows over N keys."""
    from zoe_kernels.dsa import indexer_topk, lightning_indexer

    def call():
        f8 = platform.fp8_dtype()
        q, k = _fake((m, heads, dim), f8), _fake((n, dim), f8)
        ks, ke = _fake((m,), torch.int32), _fake((m,), torch.int32)
        logits = lightning_indexer(q, _fake((m, heads), torch.float32), k, _fake((n,), torch.float32), ks, ke)
        return indexer_topk(logits, ks, ke, k=top_k)

    return call


def indexer_cases(shapes: dict[str, dict]) -> list[Case]:
    cases = []
    for model, s in shapes.items():
        idx = s.get("indexer")
        if not idx:
            continue
        for phase, points in (("decode", INDEXER_DECODE), ("prefill", INDEXER_PREFILL)):
            for m, n in points:
                cases.append(Case(f"indexer {model} H={idx['heads']} M={m} N={n}", phase,
                                  indexer_call(m, n, idx["heads"], idx["head_dim"], idx["top_k"]),
                                  dict(op="indexer", model=model, M=m, N=n, H=idx["heads"], D=idx["head_dim"],
                                       k=idx["top_k"])))
    return cases


def topk_call(batch: int, entries: int, k: int) -> Callable[[], object]:
    from zoe_kernels.csa import topk

    return lambda: topk(_fake((batch, entries), torch.float32), _fake((batch,), torch.int32), k)


def dual_scope_call(batch: int, heads: int, window: int, selected: int, entries: int) -> Callable[[], object]:
    """`dual_scope_decode` with bf16 q, fp8 keys (the target's flavour, per-entry scales) and bf16 values."""
    from zoe_kernels.csa import dual_scope_decode

    def call():
        f8, d = platform.fp8_dtype(), DUAL_SCOPE_D
        return dual_scope_decode(
            _fake((batch, heads, d), torch.bfloat16), _fake((batch, window, d), f8),
            _fake((batch, window, d), torch.bfloat16), _fake((batch,), torch.int32), _fake((batch, entries, d), f8),
            _fake((batch, entries, d), torch.bfloat16), _fake((batch, selected), torch.int32),
            win_k_scale=_fake((batch, window), torch.float32), comp_k_scale=_fake((batch, entries), torch.float32),
            sink=_fake((heads,), torch.float32))

    return call


def paged_call(batch: int, heads: int, window: int, selected: int) -> Callable[[], object]:
    """`paged_dual_scope_decode` over V4 byte pools (page size 64) as SGLang's DeepSeek-V4 backend calls it."""
    from zoe_kernels.csa import paged_dual_scope_decode
    from zoe_kernels.csa.paged_dual_scope import BYTES_PER_TOKEN, page_bytes

    def call():
        pages = 1024
        # flashmla_view's layout (fake tensors cannot be sliced: no CUDA here)
        pool = _fake((pages, page_bytes(64)), torch.uint8).as_strided(
            (pages, 64, 1, BYTES_PER_TOKEN), (page_bytes(64), BYTES_PER_TOKEN, BYTES_PER_TOKEN, 1))
        return paged_dual_scope_decode(
            _fake((batch, heads, DUAL_SCOPE_D), torch.bfloat16), pool, _fake((batch, window), torch.int32),
            _fake((batch,), torch.int32), pool, _fake((batch, selected), torch.int32), _fake((batch,), torch.int32),
            sink=_fake((heads,), torch.float32), fp8_dtype=platform.fp8_dtype())

    return call


def csa_cases(shapes: dict[str, dict]) -> list[Case]:
    cases = []
    for model, s in shapes.items():
        csa = s.get("csa")
        if not csa:
            continue
        k, window, ratio = csa["top_k"], csa["window_tokens"], csa["compression_ratio"]
        for batch in TOPK_DECODE_BATCH:
            for context in (4096, 65536, 262144, s.get("max_context_tokens", 1 << 20)):
                entries = context // ratio
                cases.append(Case(f"topk {model} B={batch} N={entries}", "decode", topk_call(batch, entries, k),
                                  dict(op="topk", model=model, B=batch, N=entries, k=k, context=context)))
        for heads in DUAL_SCOPE_HEADS:
            for batch in DUAL_SCOPE_BATCH:
                shape = dict(model=model, B=batch, H=heads, D=DUAL_SCOPE_D, W=window, k=k)
                cases.append(Case(f"dual_scope {model} B={batch} H={heads}", "decode",
                                  dual_scope_call(batch, heads, window, k, 65536 // ratio), dict(shape, op="dual_scope")))
                cases.append(Case(f"paged_dual_scope {model} B={batch} H={heads}", "decode",
                                  paged_call(batch, heads, window, k), dict(shape, op="paged_dual_scope")))
    return cases


# A representative subset (`--ci`, the CI test): each kernel at least once per family's regimes (MoE's M=1 mode,
# small and large align-based tiles, the 4-bit GEMV and native mxfp4 tiles, the dequant path; the indexer at decode
# and prefill; top-K's radix, split and row modes; dual-scope's ONE_LOOP, TWO_LOOPS, TWO_PASS and all-heads regimes;
# the paged decode).
CI_CASES = (
    "moe deepseek-v3.2 fp8 full M=1", "moe deepseek-v3.2 fp8 full M=16", "moe deepseek-v3.2 fp8 full M=4096",
    "moe glm-5.3 mxfp4 full M=1", "moe glm-5.3 mxfp4 full M=256", "moe kimi-k2.6 w4a16 full M=1",
    "moe zaya1 fp8 full M=1", "moe-forced gemv fp8 M=1", "moe-forced dequant glm-5.3 mxfp4 tp8 M=1024",
    "indexer deepseek-v3.2 H=64 M=1 N=65536", "indexer glm-5.3 H=32 M=4096 N=4096",
    "topk deepseek-v4-pro B=1 N=1024", "topk deepseek-v4-pro B=1 N=262144", "topk deepseek-v4-pro B=32 N=65536",
    "topk deepseek-v4-pro B=64 N=16384",
    "dual_scope deepseek-v4-pro B=1 H=64", "dual_scope deepseek-v4-pro B=8 H=64",
    "dual_scope deepseek-v4-pro B=32 H=64", "dual_scope deepseek-v4-pro B=128 H=64",
    "paged_dual_scope deepseek-v4-pro B=1 H=64", "paged_dual_scope deepseek-v4-pro B=16 H=64",
)


def all_cases(target: platform.Target, recipes_dir: Path = RECIPES_DIR, *, ci: bool = False) -> list[Case]:
    """Every case for one target (the MoE dispatcher's choices depend on the target's name); `ci`: CI_CASES only."""
    shapes = load_recipe_shapes(recipes_dir)
    cases = moe_cases(target, shapes) + indexer_cases(shapes) + csa_cases(shapes)
    if ci:
        cases = [c for c in cases if c.name in CI_CASES]
        missing = set(CI_CASES) - {c.name for c in cases}
        if missing:
            raise ValueError(f"CI_CASES names cases that do not exist: {sorted(missing)}")
    return cases
