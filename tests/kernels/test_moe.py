"""Fused MoE kernels against float32 references: on the CPU under TRITON_INTERPRET=1, and on a GPU when
one is present (the same tests; the GPU adds bf16 and the production block sizes at larger shapes)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import zlib

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first @triton.jit import

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from zoe_kernels.dispatch import CROSSOVER_PATH, load_crossover_table, moe_impl_for, moe_path_for  # noqa: E402
from zoe_kernels.moe import FORMATS, fallback_moe, fused_moe, quantize_weights  # noqa: E402
from zoe_kernels.moe.act_quant import quantize_act_fp8  # noqa: E402
from zoe_kernels.moe.align import moe_align  # noqa: E402
from zoe_kernels.moe.formats import (  # noqa: E402
    dequantize_act_fp8,
    dequantize_weights,
    quantize_act_fp8_torch,
)
from zoe_kernels.moe.dot_decode import (  # noqa: E402
    MX_BF16_SHIFT,
    _e2m1_scaled_halves,
    _int4_halves,
    _int4_scaled_words,
    _int4_words_to_tile,
)
from zoe_kernels.moe.grouped_gemm import mx_swap_supported  # noqa: E402
from zoe_kernels.moe.reference import fused_moe_reference  # noqa: E402

pytestmark = pytest.mark.kernels
DEVICE = "cuda" if ON_GPU else "cpu"
# The CPU interpreter computes bf16 wrongly (ENVIRONMENT.md): test fp16/fp32 there, bf16/fp16 on a GPU.
DTYPES = [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16, torch.float32]
# ||out - ref|| / ||ref|| by activation dtype; fp32 on a GPU runs tl.dot in tf32. bf16: the H200 measured at most
# 1.7e-3 on the dot and GEMV paths of every format (2.5e-3 for the 4-bit GEMV's packed-half products), and the
# "wide" numbers below 4.6e-3 (bench/kernels/moe_large_m.py --tolerance: H=1024, I=384, E=32, top-8, 4 seeds).
TOL = {torch.float32: 5e-3 if ON_GPU else 1e-4, torch.float16: 3e-3, torch.bfloat16: 4e-3}
# bf16 where the numbers differ by design: fp8 on tiles of 64+ rows (Hopper's wgmma sums fp8 products at reduced
# precision within a K step: 4.6e-3 against 1.7e-3 on 16/32-row tiles, which run mma.sync) and int4 weights scaled
# before rounding to bf16 (the joined K tiles and the dequant path: 4.0e-3).
WIDE_TOL_BF16 = 7e-3


def _tol(fmt: str, dtype: torch.dtype, wide: bool = False) -> float:
    """Tolerance of a format in an activation dtype; `wide`: a fp8 or w4a16 run with the numbers of WIDE_TOL_BF16."""
    if fmt == "mxfp4" and dtype == torch.float32:
        dtype = torch.float16  # mxfp4 runs on 16-bit activations (the native gfx950 path quantizes them to MXFP8 first)
    if wide and dtype == torch.bfloat16 and fmt in ("fp8", "w4a16"):
        return WIDE_TOL_BF16
    return TOL[dtype]


def _routing(m: int, e: int, k: int, *, experts: int | None = None, gen: torch.Generator):
    """Random top-k routing over the first `experts` of e experts (the rest stay empty)."""
    pool = experts or e
    scores = torch.rand((m, pool), generator=gen)
    weights, ids = torch.topk(scores.softmax(-1), k)
    return weights.float().to(DEVICE), ids.int().to(DEVICE)


def _problem(m, h, i, e, k, fmt, dtype, *, seed, experts=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((m, h), generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn((e, 2 * i, h), generator=gen) / math.sqrt(h)).to(DEVICE)
    w2 = (torch.randn((e, h, i), generator=gen) / math.sqrt(i)).to(DEVICE)
    w13q, s13 = quantize_weights(w13, fmt, dtype)
    w2q, s2 = quantize_weights(w2, fmt, dtype)
    tw, ti = _routing(m, e, k, experts=experts, gen=gen)
    return x, w13q, w2q, tw, ti, {"fmt": fmt, "w13_scale": s13, "w2_scale": s2}


def _nan_alloc(shape, dtype, device):
    """Scratch poisoned: NaN, or for integer buffers (counters the kernels must zero first) a large count."""
    return torch.full(shape, float("nan") if dtype.is_floating_point else 12345, dtype=dtype, device=device)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


# (M, H, I, E, top_k, experts receiving tokens): odd M, H and I off every tile size, empty experts, top-1.
CASES = [
    pytest.param(1, 200, 96, 8, 2, None, id="M1"),
    pytest.param(3, 256, 160, 24, 1, None, id="M3-top1-zaya"),
    pytest.param(17, 136, 80, 16, 4, 6, id="M17-empty-experts"),
]


# fp8 runs in two modes: w8a16 (weights upcast; activations kept) and w8a8 (activations quantized too).
FORMAT_MODES = ["bf16", "fp8-w8a16", "fp8-w8a8", "w4a16", "mxfp4"]


def _mode(mode: str) -> tuple[str, dict]:
    fmt, _, variant = mode.partition("-")
    return fmt, ({"fp8_act_quant": variant == "w8a8"} if fmt == "fp8" else {})


@pytest.mark.parametrize("mode", FORMAT_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m,h,i,e,k,experts", CASES)
def test_fused_moe_matches_reference(mode, dtype, m, h, i, e, k, experts):
    fmt, fp8 = _mode(mode)
    if fmt in ("bf16", "fp8") and dtype == torch.float32 and m == 17:
        pytest.skip("covered by the fp16 case; keeps the interpreter run short")
    x, w13, w2, tw, ti, kw = _problem(m, h, i, e, k, fmt, dtype, seed=zlib.crc32(f"{mode}{m}{dtype}".encode()),
                                      experts=experts)
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="dot", **fp8, **kw)
    ref = fused_moe_reference(x, w13, w2, tw, ti, **fp8, **kw)
    assert out.shape == (m, h) and out.dtype == dtype
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
    assert _rel_err(out, ref) < _tol(fmt, dtype)


# The small-M GEMV path (`gemv.py`): M = 1, 2, 3 with H and I off every tile size, empty experts, top-1,
# and ids of another rank (-1, E). The 4-bit formats run the word-wise kernel (`gemv_4bit.py`) where the
# packed rows are whole int32 words (ceil(K/2) % 4 == 0: M2, M1-words with a padding nibble, M3-words with
# every K step full), `gemv.py`'s byte-wise one elsewhere (M1-oddHI, M3-top1-invalid).
GEMV_CASES = [
    pytest.param(1, 203, 97, 8, 2, None, False, id="M1-oddHI"),
    pytest.param(3, 130, 66, 24, 1, None, True, id="M3-top1-invalid"),
    pytest.param(2, 96, 160, 16, 4, 5, True, id="M2-empty-experts-invalid"),
    pytest.param(1, 199, 71, 8, 2, None, False, id="M1-words-oddHI"),
    pytest.param(3, 256, 128, 8, 2, 3, True, id="M3-words-even-invalid"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,h,i,e,k,experts,invalid", GEMV_CASES)
def test_gemv_path_matches_reference(fmt, m, h, i, e, k, experts, invalid):
    dtype = DTYPES[0]
    x, w13, w2, tw, ti, kw = _problem(m, h, i, e, k, fmt, dtype, seed=zlib.crc32(f"gemv{fmt}{m}".encode()),
                                      experts=experts)
    if invalid:
        ti[0, 0] = -1
        ti[-1, -1] = e
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="gemv", **kw)
    ref = fused_moe_reference(x, w13, w2, tw, ti, fp8_act_quant=False, **kw)  # gemv: fp8 weights only
    assert out.shape == (m, h) and out.dtype == dtype
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
    assert _rel_err(out, ref) < _tol(fmt, dtype)
    if invalid and k == 1:
        assert (out[0] == 0).all() and (out[-1] == 0).all()


def _tiny_codes(fmt: str, n: int, k: int, gen: torch.Generator):
    """Weights whose codes are the format's smallest (fp8 subnormals, e2m1 0.5, e8m0 scale 2^-127), which a
    flush-to-zero decode would lose: returns (weight, scale) and the exact float32 values."""
    if fmt == "fp8":
        bits = torch.randint(0, 8, (1, n, k), generator=gen, dtype=torch.uint8) | (
            torch.randint(0, 2, (1, n, k), generator=gen, dtype=torch.uint8) << 7)
        w = bits.view(torch.float8_e4m3fn).to(DEVICE)
        s = torch.full((1, -(-n // 128), -(-k // 128)), 3.0, device=DEVICE)
    else:  # mxfp4: nibbles 0, 1 (0.5) and 9 (-0.5); scale bytes 0 (2^-127, subnormal) and 1 (2^-126)
        nib = torch.tensor([0, 1, 9], dtype=torch.uint8)[torch.randint(0, 3, (1, n, k), generator=gen)]
        w = (nib[..., 0::2] | (nib[..., 1::2] << 4)).to(DEVICE)
        s = torch.randint(0, 2, (1, n, k // 32), generator=gen, dtype=torch.uint8).to(DEVICE)
    return w, s, dequantize_weights(w, s, fmt, k)


@pytest.mark.parametrize("fmt,words", [("fp8", False), ("mxfp4", False), ("mxfp4", True)])
def test_gemv_decodes_tiny_codes_exactly(fmt, words):
    """The bit-trick decoders land on float32 (byte-wise) or f16 (word-wise) subnormals; they must not be
    flushed to zero, and neither may the e8m0 scale 2^-127."""
    from zoe_kernels.moe.gemv import gemv_down_combine

    gen = torch.Generator().manual_seed(4)
    n, k = 48, 128
    w, s, dense = _tiny_codes(fmt, n, k, gen)
    scale = 1.0 if fmt == "fp8" else 2.0**100  # keeps the results of 2^-127-scaled groups normal
    a = (torch.randn((1, k), generator=gen) * scale).to(DEVICE)
    out = torch.full((1, n), float("nan"), device=DEVICE)
    ids = torch.zeros((1, 1), dtype=torch.int32, device=DEVICE)
    cfg = {"BLOCK_N": 16, "GPI": 1, "num_warps": 4}
    if words:
        cfg["WORDS"] = {"BLOCK_N": 16, "NS": 2, "num_warps": 1, "PREFETCH": True}
    gemv_down_combine(a, w, s, out, torch.ones((1, 1), device=DEVICE), ids, fmt=fmt, cfg=cfg)
    ref = (a.double() @ dense[0].double().T).float()
    assert ref.abs().max() > 0
    assert _rel_err(out, ref) < 1e-5


def test_gemv_dispatch_by_tokens_per_expert(monkeypatch):
    """Default dispatch: the GEMV path at decode sizes, the dot path with many tokens per expert, and the dot
    path whenever the caller asks for tiles (block_m) or fp8 activation quantization."""
    from zoe_kernels.moe import config

    assert config.use_gemv(1, 8, 256, "w4a16") and not config.use_gemv(4096, 8, 256, "mxfp4")
    assert not config.use_gemv(1, 8, 256, "fp8")  # measured slower than the dot path at M=1 (moe_README.md)
    # w4a16: the GEMV up to M=16 at every I since run21/22-m1 (it left the dot path's M=1 mode); mxfp4: the GEMV
    # up to M=16, the dot path from M=64 (H200 run13)
    assert config.use_gemv(1, 8, 256, "w4a16", inter_size=256) and config.use_gemv(1, 8, 256, "w4a16", 2048)
    assert config.use_gemv(16, 8, 256, "w4a16") and config.use_gemv(16, 9, 257, "w4a16")
    assert not config.use_gemv(64, 8, 256, "w4a16") and not config.use_gemv(32, 8, 256, "w4a16")
    assert config.use_gemv(1, 8, 256, "mxfp4", 2048) and config.use_gemv(16, 8, 256, "mxfp4")
    assert not config.use_gemv(64, 8, 256, "mxfp4")
    calls = []
    fm = sys.modules["zoe_kernels.moe.fused_moe"]
    monkeypatch.setattr(fm, "gemv_gate_up", lambda *a, **kw: calls.append("gemv") or a[3].zero_())
    monkeypatch.setattr(fm, "gemv_down_combine", lambda *a, **kw: a[3].zero_())
    x, w13, w2, tw, ti, kw = _problem(1, 64, 32, 8, 2, "w4a16", DTYPES[0], seed=2)
    fused_moe(x, w13, w2, tw, ti, **kw)
    assert calls == ["gemv"]
    fused_moe(x, w13, w2, tw, ti, block_m=16, **kw)
    assert calls == ["gemv"]
    with pytest.raises(ValueError, match="path"):
        fused_moe(x, w13, w2, tw, ti, path="simd", **kw)


def test_gemv_production_config(monkeypatch):
    """The launch parameters the GPU gets (the interpreter takes its own): 16-byte loads per thread, and the
    top-k slots of stage 2 split over programs at one token but not at many."""
    from zoe_kernels.moe import config

    monkeypatch.setattr(config, "interpreting", lambda: False)
    for fmt in FORMATS:
        for gated in (True, False):
            cfg = config.gemv_config(1, 7168, fmt, gated=gated, top_k=8)
            bn = cfg["BLOCK_N"]
            assert cfg["num_warps"] * 32 * 16 == bn * config.GROUP_ROW_BYTES[fmt] or cfg["num_warps"] in (1, 8)
            assert (cfg["CHUNKS"] == 1) == gated and cfg["CHUNKS"] in (1, 2, 4, 8)
            assert ("WORDS" in cfg) == (fmt in ("w4a16", "mxfp4"))
        assert config.gemv_config(4096, 7168, fmt, gated=False, top_k=8)["CHUNKS"] == 1
        # 9 slots (GLM-5's shared expert): as many in every chunk, no chunk without one (9 in 8 chunks put 2 in
        # some: the stage's critical path; 9 in 4 left one empty)
        for top_k in (8, 9):
            c = config.gemv_config(1, 6144, fmt, gated=False, top_k=top_k)["CHUNKS"]
            assert top_k % c == 0, (top_k, c)


def test_gemv_4bit_tile_follows_grid_and_k(monkeypatch):
    """The word-wise 4-bit tile comes from a preference list per stage: the first whose grid fills the GPU
    (`config.target_programs`), whose K takes two K steps (else one) and (stage 1) whose last wave is mostly full, else the
    last; a single edge (top-1 at M=1) has its own stage-1 tile (DeepSeek-V3.2, its TP8 slice, GLM-5 and ZAYA1
    differ)."""
    from zoe_kernels.moe import config

    monkeypatch.setattr(config, "interpreting", lambda: False)
    tiles = [(16, 16, 2, False), (8, 32, 2, False)]
    monkeypatch.setitem(config.GEMV_4BIT_TILES, "mxfp4", {1: tiles, 2: [(16, 16, 2, False), (16, 8, 1, False),
                                                                        (4, 64, 1, False)]})
    monkeypatch.setitem(config.GEMV_4BIT_ONE_EDGE, "mxfp4", (8, 64, 2, False))

    def words(rows, n, gated, k):
        w = config.gemv_config(rows, n, "mxfp4", gated=gated, top_k=8, k=k)["WORDS"]
        return w["BLOCK_N"], w["NS"]

    assert words(8, 2048, True, 7168) == (16, 16)  # 1024 programs
    assert words(8, 256, True, 7168) == (8, 32)  # 128 programs: the last tile
    assert words(1, 7168, False, 2048) == (16, 16)  # K = 2048: four K steps of 512
    assert words(1, 7168, False, 1024) == (16, 16)
    assert words(1, 7168, False, 768) == (16, 8)  # one K step of 512, not two
    assert words(1, 7168, False, 256) == (16, 8)  # K = 256: one step of 8 slices
    assert words(1, 2048, False, 2048) == (4, 64)  # ZAYA1's one token: 128 programs at 16 rows, the last tile
    assert words(1, 2048, True, 2048) == (8, 64)  # ZAYA1's one edge: GEMV_4BIT_ONE_EDGE
    # stage 1 on a 132-multiprocessor GPU: 8 programs of 2 warps at 128 registers per multiprocessor, 1056 at
    # once: DeepSeek-V3.2's 1024 programs fill one wave; GLM-5's 9 edges (1152) would leave a second wave of 96
    monkeypatch.setattr(config, "has_ptx", lambda: True)
    monkeypatch.setattr(config, "sm_count", lambda: 132)
    assert words(8, 2048, True, 7168) == (16, 16)
    assert words(9, 2048, True, 6144) == (8, 32)
    assert words(64, 2048, True, 7168) == (16, 16)  # M = 8: 8192 programs, 7.8 waves


@pytest.mark.skipif(ON_GPU, reason="test_gpu_gemv_production_tiles covers this on a GPU")
@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
def test_gemv_production_tiles_in_interpreter(fmt, monkeypatch):
    """The GPU's GEMV tiles (BLOCK_N 16-32, several groups per K step, slots split over chunks at one token),
    run by the interpreter: the tiling and the float32 slot accumulation, not only the interpreter's tiles."""
    from zoe_kernels.moe import config

    monkeypatch.setattr(config, "interpreting", lambda: False)
    x, w13, w2, tw, ti, kw = _problem(1, 256, 128, 8, 4, fmt, DTYPES[0], seed=31)
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, **kw)  # dispatch: GEMV for the 4-bit formats
    assert config.gemv_config(1, 256, fmt, gated=False, top_k=4)["CHUNKS"] > 1
    assert torch.isfinite(out).all()
    assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, DTYPES[0])


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
def test_gemv_word_and_byte_kernels_agree(fmt):
    """The word-wise 4-bit kernel (`gemv_4bit.py`) against the byte-wise one (`gemv.py`) on the same inputs,
    both stages, several tiles (rows and K steps that do and do not divide the sizes, with and without the
    prefetch of the next K step); with a GPU the word-wise kernel runs its PTX decode, and the portable one too."""
    from zoe_kernels.moe.gemv import gemv_down_combine, gemv_gate_up
    from zoe_kernels.moe.gemv_4bit import rows_are_words

    dtype = DTYPES[0]
    x, w13, w2, tw, ti, kw = _problem(2, 320, 88, 6, 3, fmt, dtype, seed=zlib.crc32(f"words{fmt}".encode()))
    assert rows_are_words(w13) and rows_are_words(w2)
    byte_cfg = {"BLOCK_N": 16, "GPI": 1, "num_warps": 4}
    inter_ref = _nan_alloc((6, 88), dtype, DEVICE)
    gemv_gate_up(x, w13, kw["w13_scale"], inter_ref, ti, fmt=fmt, cfg=byte_cfg)
    out_ref = _nan_alloc((2, 320), torch.float32, DEVICE)
    gemv_down_combine(inter_ref, w2, kw["w2_scale"], out_ref, tw, ti, fmt=fmt, cfg=byte_cfg)
    for words in ({"BLOCK_N": 16, "NS": 2, "num_warps": 1, "PREFETCH": True},
                  {"BLOCK_N": 32, "NS": 1, "num_warps": 2},
                  {"BLOCK_N": 16, "NS": 2, "num_warps": 1, "num_stages": 3},
                  {"BLOCK_N": 16, "NS": 2, "num_warps": 1, "PREFETCH": True, "H2": True},
                  {"BLOCK_N": 32, "NS": 1, "num_warps": 2, "H2": True}) + (
            ({"BLOCK_N": 16, "NS": 8, "num_warps": 1, "PTX": False}, {"BLOCK_N": 8, "NS": 8, "num_warps": 1},
             {"BLOCK_N": 16, "NS": 2, "num_warps": 2, "PREFETCH": True},
             {"BLOCK_N": 16, "NS": 8, "num_warps": 1, "PTX": False, "H2": True},
             {"BLOCK_N": 8, "NS": 8, "num_warps": 1, "H2": True},
             {"BLOCK_N": 16, "NS": 2, "num_warps": 2, "num_stages": 3, "H2": True}) if ON_GPU else ()):
        cfg = byte_cfg | {"WORDS": words}
        inter = _nan_alloc((6, 88), dtype, DEVICE)
        gemv_gate_up(x, w13, kw["w13_scale"], inter, ti, fmt=fmt, cfg=cfg)
        assert _rel_err(inter, inter_ref.float()) < _tol(fmt, dtype), words
        out = _nan_alloc((2, 320), torch.float32, DEVICE)
        gemv_down_combine(inter_ref, w2, kw["w2_scale"], out, tw, ti, fmt=fmt, cfg=cfg)
        # packed halves: float16 products and slice sums (about 6e-4 here); else float32 as the byte kernel
        assert torch.isfinite(out).all() and _rel_err(out, out_ref) < (2e-3 if words.get("H2") else 1e-5), words


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
def test_h2_asm_decodes_every_nibble(fmt):
    """The committed PTX of the packed-half slice dot (`gemv_4bit._H2_INT4_ASM` / `_H2_E2M1_ASM`), run on the CPU by
    an interpreter of its instructions (tests/support/ptx_subset.py: the Triton interpreter takes the portable
    path, and CI has no GPU): one-hot activations read back every nibble of fresh random words exactly (int4 u - 8,
    e2m1 v with its 2^-14 undone by the activation), and random activations give the float64 slice sum within
    float16 rounding."""
    from tests.support import ptx_subset

    from zoe_kernels.moe import gemv_4bit

    asm = gemv_4bit._H2_INT4_ASM if fmt == "w4a16" else gemv_4bit._H2_E2M1_ASM
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

    def value(nib):
        return nib - 8 if fmt == "w4a16" else (-1.0 if nib & 8 else 1.0) * e2m1[nib & 7]

    gen = torch.Generator().manual_seed(time.time_ns() % (1 << 62))
    unit = 2.0**14 if fmt == "mxfp4" else 1.0
    for _ in range(3):
        words = [int(v) for v in torch.randint(0, 1 << 32, (4,), generator=gen, dtype=torch.int64)]
        for w in range(4):
            for j in range(8):  # pair j % 4 of word w; the low half holds nibble j < 4, the high half j + 4
                acts = [0] * 16
                acts[4 * w + j % 4] = ptx_subset.f16_pair(unit if j < 4 else 0.0, unit if j >= 4 else 0.0)
                assert ptx_subset.run(asm, words + acts) == value((words[w] >> (4 * j)) & 0xF), (hex(words[w]), j)
        a = (torch.rand((4, 8), generator=gen, dtype=torch.float64) * 4 - 2) * (2.0**14 if fmt == "mxfp4" else 1.0)
        a = a.to(torch.float16).double()
        acts = [ptx_subset.f16_pair(float(a[w, j]), float(a[w, j + 4])) for w in range(4) for j in range(4)]
        products = [value((words[w] >> (4 * j)) & 0xF) * float(a[w, j]) / unit for w in range(4) for j in range(8)]
        got = ptx_subset.run(asm, words + acts)
        assert abs(got - sum(products)) <= 4e-3 * sum(abs(x) for x in products) + 1e-6, (got, sum(products))


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
def test_gemv_packed_halves_scale_each_slice(fmt):
    """The packed-half products (`gemv_4bit._slice_dot_h2`) scale each 32-activation slice by its own power of
    two: in one row, slices near the 16-bit maximum (their products overflow float16 unscaled: stage 2, whose
    output is float32), slices of 1e-4 (their products underflow) and all-zero slices (both stages); compared
    with the byte-wise kernel (float32 products) over poisoned outputs, with a GPU in PTX and portably."""
    from zoe_kernels.moe.gemv import gemv_down_combine, gemv_gate_up

    dtype = DTYPES[0]
    gen = torch.Generator().manual_seed(zlib.crc32(f"h2{fmt}{time.time_ns()}".encode()))
    seed = int(torch.randint(1 << 30, (1,), generator=gen))
    x, w13, w2, tw, ti, kw = _problem(1, 256, 128, 4, 2, fmt, dtype, seed=seed)
    x_scale = torch.tensor([1.0, 1e-4, 0.0, 4.0, 1e-4, 1.0, 0.0, 2.0])  # per 32 of H = 256
    x = (torch.randn((1, 256), generator=gen) * x_scale.repeat_interleave(32)).to(dtype).to(DEVICE)
    inter_scale = torch.tensor([2e4, 1e-4, 0.0, 3e4])  # per 32 of I = 128
    inter_in = (torch.randn((2, 128), generator=gen).clamp(-2, 2) * inter_scale.repeat_interleave(32)).to(dtype)
    inter_in = inter_in.to(DEVICE)
    byte_cfg = {"BLOCK_N": 16, "GPI": 1, "num_warps": 4}
    inter_ref = _nan_alloc((2, 128), dtype, DEVICE)
    gemv_gate_up(x, w13, kw["w13_scale"], inter_ref, ti, fmt=fmt, cfg=byte_cfg)
    out_ref = _nan_alloc((1, 256), torch.float32, DEVICE)
    gemv_down_combine(inter_in, w2, kw["w2_scale"], out_ref, tw, ti, fmt=fmt, cfg=byte_cfg)
    for ptx in (False, True) if ON_GPU else (False,):
        cfg = byte_cfg | {"WORDS": {"BLOCK_N": 16, "NS": 2, "num_warps": 1, "PTX": ptx, "H2": True}}
        inter = _nan_alloc((2, 128), dtype, DEVICE)
        gemv_gate_up(x, w13, kw["w13_scale"], inter, ti, fmt=fmt, cfg=cfg)
        assert torch.isfinite(inter).all() and _rel_err(inter, inter_ref.float()) < _tol(fmt, dtype), ptx
        out = _nan_alloc((1, 256), torch.float32, DEVICE)
        gemv_down_combine(inter_in, w2, kw["w2_scale"], out, tw, ti, fmt=fmt, cfg=cfg)
        assert torch.isfinite(out).all() and _rel_err(out, out_ref) < 2e-3, ptx


@triton.jit
def _decode_int4_bytes(p_ptr, lo_ptr, hi_ptr, PTX: tl.constexpr):
    """The tl.dot path's int4 decode of 256 bytes (a 16 x 16 tile), both nibbles stored in lo_ptr's dtype."""
    offs = tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :]
    lo, hi = _int4_halves(tl.load(p_ptr + offs), lo_ptr.dtype.element_ty, PTX)
    tl.store(lo_ptr + offs, lo)
    tl.store(hi_ptr + offs, hi)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16, torch.float32],
                         ids=str)
def test_dot_path_int4_decode_every_byte_exactly(dtype):
    """The tl.dot path's int4 decode (`dot_decode._int4_halves`) on all 256 byte values: both nibbles u - 8,
    exact in the activations' dtype; on a GPU the PTX decode (magic-number or, paired fma) and the portable one."""
    p = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEVICE)
    want = torch.stack([p.long().cpu() & 0xF, p.long().cpu() >> 4]).float() - 8.0
    for ptx in (False, True) if ON_GPU else (False,):
        lo, hi = _nan_alloc((256,), dtype, DEVICE), _nan_alloc((256,), dtype, DEVICE)
        _decode_int4_bytes[(1,)](p, lo, hi, PTX=ptx)
        assert torch.equal(lo.float().cpu(), want[0]) and torch.equal(hi.float().cpu(), want[1]), ptx


@triton.jit
def _decode_int4_joined(p_ptr, s_ptr, out_ptr):
    """The joined tiles' int4 decode with PTX (`dot_decode._int4_scaled_words` -> `_int4_words_to_tile`): a
    [32 kp, 16 n] byte tile and a scale per column -> the [64 k, 16 n] K tile, stored in out_ptr's dtype."""
    kp = tl.arange(0, 32)[:, None]
    n = tl.arange(0, 16)[None, :]
    dt = out_ptr.dtype.element_ty
    tile = _int4_words_to_tile(_int4_scaled_words(tl.load(p_ptr + kp * 16 + n), tl.load(s_ptr + n), dt), dt, 64, 16)
    tl.store(out_ptr + tl.arange(0, 64)[:, None] * 16 + n, tile)


@pytest.mark.skipif(not ON_GPU, reason="the word decode is inline PTX")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dot_path_int4_word_decode_every_byte_exactly(dtype):
    """Every byte value under scales of both signs: row k = 2 kp + j of the K tile holds nibble j of byte kp, minus
    8, times the scale rounded to the dtype, rounded once (the numbers of `_int4_scaled_halves`)."""
    gen = torch.Generator().manual_seed(11)
    p = (torch.arange(512) % 256)[torch.randperm(512, generator=gen)].to(torch.uint8).reshape(32, 16)
    scale = torch.randn(16, generator=gen) * torch.exp2(torch.randint(-12, 4, (16,), generator=gen).float())
    nib = torch.stack([p.long() & 0xF, p.long() >> 4], dim=1).reshape(64, 16)  # k = 2 kp + j
    want = ((nib.float() - 8.0) * scale.to(dtype).float()).to(dtype)
    out = _nan_alloc((64, 16), dtype, DEVICE)
    _decode_int4_joined[(1,)](p.to(DEVICE), scale.to(DEVICE), out)
    assert torch.equal(out.cpu(), want)


@triton.jit
def _decode_e2m1_scaled(p_ptr, sw_ptr, lo_ptr, hi_ptr, MX_BF16_SHIFT: tl.constexpr, PTX: tl.constexpr):
    """The swapped tl.dot path's mxfp4 decode of a 16 x 64 byte tile (16 rows, one K step of 128), scale words
    per row; both halves stored in lo_ptr's dtype."""
    offs = tl.arange(0, 16)[:, None] * 64 + tl.arange(0, 64)[None, :]
    lo, hi = _e2m1_scaled_halves(tl.load(p_ptr + offs), tl.load(sw_ptr + tl.arange(0, 16)),
                                 lo_ptr.dtype.element_ty, 128, 32, MX_BF16_SHIFT, PTX)
    tl.store(lo_ptr + offs, lo)
    tl.store(hi_ptr + offs, hi)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16, torch.float32],
                         ids=str)
def test_dot_path_e2m1_scaled_decode_exactly(dtype):
    """The swapped path's mxfp4 decode (`dot_decode._e2m1_scaled_halves`): every byte value under scale bytes
    spread over the range it supports, each 32-k group of a row with its own byte of the row's word; the bf16
    decode carries 2^-MX_BF16_SHIFT (the accumulator takes it back), exact; on a GPU the PTX decode too."""
    gen = torch.Generator().manual_seed(7)
    p = torch.randperm(16 * 64, generator=gen).remainder(256).to(torch.uint8).reshape(16, 64)
    lo_b = 16 if dtype == torch.float16 else (66 if dtype == torch.bfloat16 else 1)
    hi_b = 140 if dtype == torch.float16 else (192 if dtype == torch.bfloat16 else 240)
    sb = torch.randint(lo_b, hi_b + 1, (16, 4), generator=gen)
    sb[0] = torch.tensor([lo_b, hi_b, 127, 126])
    sw = (sb[:, 0] | sb[:, 1] << 8 | sb[:, 2] << 16 | sb[:, 3] << 24).to(torch.int32)
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    nib = torch.stack([p.long() & 0xF, p.long() >> 4])
    val = table[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    shift = MX_BF16_SHIFT if dtype == torch.bfloat16 else 0
    want = val * torch.exp2(sb.double().repeat_interleave(16, dim=1) - 127 - shift).float()
    want = want.to(dtype).float()  # what the dtype holds (fp16: the float32 product rounded once)
    for ptx in (False, True) if ON_GPU else (False,):
        lo, hi = _nan_alloc((16, 64), dtype, DEVICE), _nan_alloc((16, 64), dtype, DEVICE)
        _decode_e2m1_scaled[(1,)](p.to(DEVICE), sw.to(DEVICE), lo, hi, MX_BF16_SHIFT=shift, PTX=ptx)
        assert torch.equal(lo.float().cpu(), want[0]) and torch.equal(hi.float().cpu(), want[1]), ptx


@pytest.mark.parametrize("swap", [True, False])
def test_dot_path_mxfp4_swapped_operands(swap, monkeypatch):
    """mxfp4 on 16- and 32-row tiles with the operands swapped (`config.SWAP_AB_FORMATS`: weights as the MMA's
    first operand, scale words) and not: H and I whole K steps (both stages swapped), I off them (stage 2 falls back
    to the unswapped form), an invalid id, top-k 4, NaN-poisoned scratch."""
    from zoe_kernels.moe import config

    monkeypatch.setattr(config, "SWAP_AB_FORMATS", {"mxfp4"} if swap else set())
    monkeypatch.setattr(config, "PROGRAMS_PER_SM", 0)  # on a GPU the tiny grid would cut BLOCK_N below 64 (no swap)
    dtype = DTYPES[0]
    for m, h, i in ((1, 256, 256), (5, 256, 128), (3, 128, 200)):
        x, w13, w2, tw, ti, kw = _problem(m, h, i, 8, 4, "mxfp4", dtype, seed=zlib.crc32(f"swap{m}{i}".encode()))
        ti[0, 1] = -1
        assert config.stage_config(m, 4, 8, i, h, "mxfp4", gated=True)["SWAP_AB"] == swap
        assert mx_swap_supported(kw["w2_scale"], i, 128) == (i % 128 == 0)
        # one int32 holds a step's scales: steps of 2 or 8 groups are refused, not decoded wrongly
        assert not mx_swap_supported(kw["w2_scale"], i, 64) and not mx_swap_supported(kw["w2_scale"], i, 256)
        assert config.stage_config(m, 4, 8, i, h, "mxfp4", gated=True, block_m=32)["SWAP_AB"] == swap
        assert not config.stage_config(m, 4, 8, i, h, "mxfp4", gated=True, block_m=64)["SWAP_AB"]
        for block_m in (None, 32):
            out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="dot", block_m=block_m, **kw)
            assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
            assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol("mxfp4", dtype)


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("join_k", [True, False])
def test_dot_path_4bit_halves_joined_or_split(fmt, join_k, monkeypatch):
    """The 4-bit tl.dot path with the decoded weight halves joined into one K tile (`JOIN_K`, tiles of
    `config.JOIN_K_MIN_BLOCK_M` rows or more; the group scales applied in the decode, mxfp4's as a word per row where
    K is whole words: stage 2 here) and with the activations split into halves, on 16- and 64-row tiles, with K
    steps of 128 and of 64 (a step starting mid-word): H off the K step, an invalid id, an empty expert,
    NaN-poisoned scratch."""
    from zoe_kernels.moe import config

    fm = sys.modules["zoe_kernels.moe.fused_moe"]  # the package's `fused_moe` is the function
    monkeypatch.setattr(config, "JOIN_K_MIN_BLOCK_M", 16 if join_k else 1 << 30)
    monkeypatch.setattr(config, "SWAP_AB_FORMATS", set())
    original = fm.stage_config
    dtype = DTYPES[0]
    for m, block_m, block_k in ((5, 16, 128), (40, 64, 128), (40, 64, 64)):
        monkeypatch.setattr(fm, "stage_config", lambda *a, bk=block_k, **kw: original(*a, **kw) | {"BLOCK_K": bk})
        x, w13, w2, tw, ti, kw = _problem(m, 200, 128, 6, 2, fmt, dtype, seed=zlib.crc32(f"join{fmt}{m}".encode()),
                                          experts=5)
        ti[1, 0] = -1
        assert config.stage_config(m, 2, 6, 128, 200, fmt, gated=True, block_m=block_m)["JOIN_K"] == join_k
        out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, block_m=block_m, **kw)
        assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
        assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, dtype, wide=join_k)


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("half_tiles", [True, False])
def test_dot_path_4bit_half_tiles(fmt, half_tiles, monkeypatch):
    """`config.FOUR_BIT_HALF_TILES`: each stage in two launches (`grouped_gemm.TileRows`), align's tiles with an
    edge in their upper half at full height and the rest as half-height tiles. Experts whose last tile is at most
    half full (10 and 40 edges on 32-row tiles), more than half full (25), one edge short of full (31), an invalid
    id; NaN-poisoned scratch; both modes against the reference."""
    from zoe_kernels.moe import config

    monkeypatch.setattr(config, "JOIN_K_MIN_BLOCK_M", 16)  # the mode's 2 * JOIN_K_MIN_BLOCK_M rows: 32 here
    monkeypatch.setattr(config, "SWAP_AB_FORMATS", set())
    monkeypatch.setattr(config, "FOUR_BIT_HALF_TILES", half_tiles)
    dtype = DTYPES[0]
    m, e, k = 54, 5, 2
    x, w13, w2, tw, ti, kw = _problem(m, 200, 128, e, k, fmt, dtype, seed=zlib.crc32(f"half{fmt}".encode()))
    counts = [10, 40, 25, 31]  # expert 4 gets none
    ids = torch.tensor([ex for ex, c in enumerate(counts) for _ in range(c)] + [-1] * (m * k - sum(counts)))
    ti = ids[torch.randperm(m * k, generator=torch.Generator().manual_seed(3))].view(m, k).int().to(DEVICE)
    assert config.stage_config(m, k, e, 128, 200, fmt, gated=True, block_m=32)["HALF_TILES"] == half_tiles
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, block_m=32, **kw)
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
    assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, dtype, wide=True)


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("gu_one_dot", [True, False])
def test_dot_path_4bit_gate_up_one_dot(fmt, gu_one_dot, monkeypatch):
    """Stage 1 on joined tiles multiplies gate and up rows interleaved in one dot (`GU_ONE_DOT`, what `config` picks)
    and splits the accumulator's column pairs after the loop; against the two-dot form (the other formats' stage 1).
    I = 100 (the last column tile part masked), H = 200 (a partial last K step) and 256 (whole steps, `EVEN_K`;
    mxfp4's scales then one word per row), an invalid id, NaN-poisoned scratch, against the reference."""
    from zoe_kernels.moe import config

    fm = sys.modules["zoe_kernels.moe.fused_moe"]  # the package's `fused_moe` is the function
    monkeypatch.setattr(config, "JOIN_K_MIN_BLOCK_M", 16)
    monkeypatch.setattr(config, "SWAP_AB_FORMATS", set())
    original = fm.stage_config
    monkeypatch.setattr(fm, "stage_config", lambda *a, **kw: original(*a, **kw) | (
        {} if gu_one_dot else {"GU_ONE_DOT": False}))
    dtype = DTYPES[0]
    for h in (200, 256):
        x, w13, w2, tw, ti, kw = _problem(23, h, 100, 4, 2, fmt, dtype, seed=zlib.crc32(f"gu{fmt}{h}".encode()))
        ti[2, 1] = -1
        assert config.stage_config(23, 2, 4, 100, h, fmt, gated=True, block_m=16)["GU_ONE_DOT"]
        assert not config.stage_config(23, 2, 4, h, 100, fmt, gated=False, block_m=16)["GU_ONE_DOT"]
        out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, block_m=16, **kw)
        assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
        assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, dtype, wide=True)


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
def test_dequantize_4bit_is_exact(fmt):
    """`dequant.dequantize_4bit` equals `formats.dequantize_weights` rounded once to the output dtype, for an
    expert range [lo, hi) of a weight whose K is odd (a padding nibble) and whose rows are off the tile; every
    scale byte of mxfp4 (0 is the subnormal 2^-127) and every nibble appear."""
    from zoe_kernels.moe.dequant import dequantize_4bit

    gen = torch.Generator().manual_seed(7)
    e, n, k = 5, 37, 301
    w = torch.randint(0, 256, (e, n, (k + 1) // 2), dtype=torch.uint8, generator=gen)
    if fmt == "w4a16":
        s = torch.rand((e, n, -(-k // 128)), generator=gen) * 1e-2 + 1e-4
    else:
        s = torch.randint(0, 255, (e, n, -(-k // 32)), dtype=torch.uint8, generator=gen)
        s.view(-1)[:255] = torch.arange(255, dtype=torch.uint8)
    for dtype in (torch.float32, DTYPES[0]):
        out = torch.full((4, n, k), float("nan"), dtype=dtype)
        got = dequantize_4bit(w.to(DEVICE), s.to(DEVICE), fmt, k, out.to(DEVICE), (1, 4)).cpu()
        want = dequantize_weights(w[1:4], s[1:4], fmt, k).to(dtype)
        assert got.shape == (3, n, k) and torch.equal(got, want)
    with pytest.raises(ValueError, match="cannot hold"):
        dequantize_4bit(w.to(DEVICE), s.to(DEVICE), fmt, k, torch.empty((2, n, k), device=DEVICE), (0, 3))


@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("workspace_experts", [1, 3, 8])
def test_dequant_path_matches_reference(fmt, workspace_experts):
    """The dequant path (`dequant.dequant_moe`) with the workspace holding 1, 3 or all experts (chunks that
    skip other experts' tiles), top-k 2 and top-1, invalid ids and an empty expert, NaN-poisoned scratch."""
    from zoe_kernels.moe.dequant import dequant_moe

    dtype = DTYPES[0]
    for m, k in ((37, 2), (9, 1)):
        x, w13, w2, tw, ti, kw = _problem(m, 136, 96, 8, k, fmt, dtype, seed=zlib.crc32(f"deq{fmt}{m}".encode()),
                                          experts=7)
        ti[2, 0] = -1
        ti[3, 0] = 8
        ws = workspace_experts * 2 * 96 * 136 * x.element_size()
        out = dequant_moe(x, w13, w2, tw.float(), ti, fmt=fmt, w13_scale=kw["w13_scale"], w2_scale=kw["w2_scale"],
                          alloc=_nan_alloc, workspace_bytes=ws)
        assert out.shape == (m, 136) and out.dtype == dtype
        assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
        assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, dtype, wide=True)
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="dequant", **kw)  # the same through fused_moe
    assert _rel_err(out, fused_moe_reference(x, w13, w2, tw, ti, **kw)) < _tol(fmt, dtype, wide=True)
    with pytest.raises(ValueError, match="4-bit"):
        fused_moe(*_problem(3, 64, 32, 4, 2, "fp8", dtype, seed=1)[:5], path="dequant",
                  **_problem(3, 64, 32, 4, 2, "fp8", dtype, seed=1)[5])


# The `tl.dot_scaled` path that gfx950 takes (MXFP8 activations) is tested in test_mx_act.py against a reference
# that quantizes the activations the same way.


# The M=1 mode of the tl.dot path (`config.DOT_M1_TILES`): one tile per edge, no align launch, stage 1 zeroing
# the (poisoned) accumulator, stage 2 split along K. Forced on for
# every format; M1-i-odd has I off the 128 K step (the split-K tail, a partial quantization group).
DOT_M1_CASES = [
    pytest.param(1, 200, 96, 8, 2, False, id="M1"),
    pytest.param(1, 256, 200, 8, 4, True, id="M1-i-odd-invalid"),
    pytest.param(1, 136, 80, 16, 1, False, id="M1-top1"),
    pytest.param(1, 136, 80, 16, 1, True, id="M1-top1-invalid"),
]


# stage 2 split along K in two (as committed for fp8) or not
DOT_M1_TILE_SETS = {"split-k": {1: (32, 4, 3), 2: (64, 4, 3, 2)}, "no-split": {1: (32, 4, 3), 2: (64, 4, 3, 1)}}


@pytest.mark.parametrize("tiles", list(DOT_M1_TILE_SETS))
@pytest.mark.parametrize("mode", FORMAT_MODES)
@pytest.mark.parametrize("m,h,i,e,k,invalid", DOT_M1_CASES)
def test_dot_m1_mode_matches_reference(mode, m, h, i, e, k, invalid, tiles, monkeypatch):
    from zoe_kernels.moe import config

    fmt, fp8 = _mode(mode)
    if tiles != "split-k" and mode != "fp8-w8a8":
        pytest.skip("the unsplit stage 2 is covered by fp8 w8a8")
    dtype = DTYPES[0]
    monkeypatch.setitem(config.DOT_M1_TILES, fmt, DOT_M1_TILE_SETS[tiles])
    monkeypatch.setattr(config, "DOT_M1_MIN_TOP_K", 1)
    monkeypatch.setattr(config, "MIN_K_STEPS_PER_SPLIT", 1)  # I = 200: two K steps, split in two
    x, w13, w2, tw, ti, kw = _problem(m, h, i, e, k, fmt, dtype, seed=zlib.crc32(f"m1{mode}{h}{k}".encode()))
    if invalid:
        ti[0, 0] = -1 if k > 1 else e
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="dot", **fp8, **kw)
    ref = fused_moe_reference(x, w13, w2, tw, ti, **fp8, **kw)
    assert out.shape == (m, h) and out.dtype == dtype
    assert torch.isfinite(out).all(), "an output element was not written (NaN poison survived)"
    if invalid and k == 1:  # the token's only expert lives elsewhere: nothing to add
        assert (out == 0).all() and (ref == 0).all()
        return
    assert _rel_err(out, ref) < _tol(fmt, dtype)


def test_dot_m1_mode_only_where_measured():
    """Dispatch keeps the align-based tiles for formats without measured M=1 tiles, and at M > 1."""
    from zoe_kernels.moe.config import DOT_M1_TILES, dot_m1_configs

    for fmt in FORMATS:
        assert (dot_m1_configs(1, fmt, 8, 2048) is not None) == (fmt in DOT_M1_TILES)
        assert dot_m1_configs(2, fmt, 8, 2048) is None
        assert dot_m1_configs(1, fmt, 1, 2048) is None  # top-1 (ZAYA1): not measured in this mode
    assert dot_m1_configs(1, "w4a16", 8, 256) is None  # the 4-bit formats run the GEMV at M=1
    if "fp8" in DOT_M1_TILES:  # split-K only where each program keeps MIN_K_STEPS_PER_SPLIT steps
        assert dot_m1_configs(1, "fp8", 8, 256)[1]["SPLIT_K"] == 1
    for fmt, tiles in DOT_M1_TILES.items():
        assert len(tiles[1]) == 3 and len(tiles[2]) == 4 and tiles[2][3] >= 1


def test_l2_prefetch_only_on_ptx_and_the_m1_tiles():
    """Stage 1's L2 prefetch of stage 2's weights (`config.dot_m1_l2_prefetch_bytes`) is a share of the target's L2
    in whole MiB (16 of the H200's 60), runs only where PTX does, and a launch that asks for it on align-based tiles
    is refused with a clear error."""
    from dataclasses import replace

    from zoe_kernels.moe import config
    from zoe_kernels.moe.grouped_gemm import KernelFormat, gate_up_swiglu
    from zoe_kernels.platform import TARGETS, compile_for, has_ptx

    with compile_for(TARGETS["sm_90"]):
        assert config.dot_m1_l2_prefetch_bytes() == 16 << 20
    with compile_for(replace(TARGETS["sm_90"], l2_bytes=0)):  # an L2 the target does not state: none
        assert config.dot_m1_l2_prefetch_bytes() == 0
    with compile_for(TARGETS["gfx950"]):
        assert config.dot_m1_l2_prefetch_bytes() == 0
    if not has_ptx():
        assert config.dot_m1_l2_prefetch_bytes() == 0
    x = torch.randn((2, 128)).to(DEVICE, DTYPES[0])
    w13 = torch.randn((3, 64, 128)).to(DEVICE, DTYPES[0])
    inter = torch.empty((4, 32), dtype=DTYPES[0], device=DEVICE)
    align = moe_align(torch.tensor([[0, 1], [2, 0]], dtype=torch.int32, device=DEVICE), 3, 16)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1}
    with pytest.raises(ValueError, match="L2 prefetch"):
        gate_up_swiglu(x, None, w13, None, inter, align, top_k=2, kfmt=KernelFormat.FLOAT, cfg=cfg,
                       prefetch=(w13, 1 << 20))


@pytest.mark.parametrize("fmt", FORMATS)
def test_invalid_expert_ids_contribute_nothing(fmt):
    """Ids outside [0, E) (experts on another rank) are dropped, for top-k and top-1."""
    dtype = DTYPES[0]
    for k in (3, 1):
        x, w13, w2, tw, ti, kw = _problem(5, 128, 64, 4, k, fmt, dtype, seed=7 + k)
        ti[1, 0] = -1
        ti[3, -1] = 4
        out = fused_moe(x, w13, w2, tw, ti, fp8_act_quant=True, **kw)
        ref = fused_moe_reference(x, w13, w2, tw, ti, fp8_act_quant=True, **kw)
        assert _rel_err(out, ref) < _tol(fmt, dtype)
        if k == 1:
            assert (out[1] == 0).all() and (out[3] == 0).all()


@pytest.mark.parametrize("m,e,k,block_m", [(1, 256, 8, 16), (17, 24, 1, 16), (300, 256, 8, 64), (64, 5, 3, 32)])
def test_align_buckets_every_edge_once(m, e, k, block_m):
    gen = torch.Generator().manual_seed(m * 1000 + e)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).int()
    ids[0, 0] = -1  # dropped
    sorted_ids, block_expert, num_padded = (t.cpu() for t in moe_align(ids.to(DEVICE), e, block_m))
    flat = ids.flatten().long()
    valid = flat >= 0
    counts = torch.bincount(flat[valid], minlength=e)
    total = int(num_padded)
    assert total == int(((counts + block_m - 1) // block_m * block_m).sum())
    used = sorted_ids[:total]
    real = used[used < flat.numel()].long()
    assert sorted(real.tolist()) == valid.nonzero().squeeze(1).tolist()
    assert (used[used >= flat.numel()] == flat.numel()).all()  # padding holds the sentinel
    for b in range(total // block_m):
        tile = sorted_ids[b * block_m : (b + 1) * block_m].long()
        tile = tile[tile < flat.numel()]
        assert len(tile) > 0, "a tile without edges: empty experts must get no tile"
        assert (flat[tile] == block_expert[b]).all()
        assert (tile.diff() > 0).all(), "edges of one expert must stay in token order"
    assert (block_expert[total // block_m :] == -1).all()


def test_zero_tokens_and_bad_arguments():
    x, w13, w2, tw, ti, kw = _problem(2, 64, 32, 4, 2, "fp8", DTYPES[0], seed=1)
    assert fused_moe(x[:0], w13, w2, tw[:0], ti[:0], **kw).shape == (0, 64)
    with pytest.raises(ValueError, match="fmt must be one of"):
        fused_moe(x, w13, w2, tw, ti, fmt="int3")
    with pytest.raises(ValueError, match="w13_scale"):
        fused_moe(x, w13, w2, tw, ti, fmt="fp8", w13_scale=kw["w13_scale"][:, :1, :0], w2_scale=kw["w2_scale"])
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe(x, w13, w2, tw, ti[:1], **kw)
    with pytest.raises(ValueError, match="hidden size"):
        fused_moe(x[:, :32], w13, w2, tw, ti, **kw)
    w13b, _ = quantize_weights(w13.float(), "bf16", torch.float16)
    with pytest.raises(ValueError, match="activation dtype"):
        fused_moe(x.float(), w13b, w13b[:, :64, :32].contiguous(), tw, ti)


@pytest.mark.parametrize("fmt", FORMATS)
def test_formats_round_trip(fmt):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn((2, 160, 200), generator=gen) * 0.1
    q, s = quantize_weights(w, fmt, torch.float16)
    back = dequantize_weights(q, s, fmt, 200)
    bound = {"bf16": 1e-3, "fp8": 4e-2, "w4a16": 0.15, "mxfp4": 0.2}[fmt]
    assert back.shape == w.shape and _rel_err(back, w) < bound
    if fmt != "bf16":  # quantizing the dequantized weights again changes nothing
        q2, s2 = quantize_weights(back, fmt, torch.float16)
        assert torch.equal(dequantize_weights(q2, s2, fmt, 200), back)


def test_act_quant_matches_torch():
    x = torch.randn((7, 300), generator=torch.Generator().manual_seed(5)).to(DEVICE, DTYPES[0])
    q, s = quantize_act_fp8(x)
    qt, st = quantize_act_fp8_torch(x)
    assert torch.allclose(s, st, rtol=1e-6)
    assert _rel_err(dequantize_act_fp8(q, s), dequantize_act_fp8(qt, st).float()) < 1e-2
    assert _rel_err(dequantize_act_fp8(q, s), x.float()) < 5e-2


@pytest.mark.parametrize("fmt", FORMATS)
def test_fallback_matches_reference(fmt):
    dtype = DTYPES[0]
    x, w13, w2, tw, ti, kw = _problem(9, 128, 64, 6, 2, fmt, dtype, seed=11)
    out = fallback_moe(x, w13, w2, tw, ti, **kw)
    ref = fused_moe_reference(x, w13, w2, tw, ti, emulate_kernel_rounding=False, **kw)
    assert out.dtype == dtype and _rel_err(out, ref) < max(_tol("bf16", dtype), 1e-2)


def test_dispatch_reads_the_measured_table(tmp_path):
    table = load_crossover_table()
    assert set(table["devices"]["default"]) == set(FORMATS)
    assert moe_impl_for(1, "fp8", "an unmeasured device") == "zoe"
    custom = {"devices": {"default": {"bf16": {"zoe_max_m": 8}}, "Dev": {"bf16": {"zoe_max_m": 64}}}}
    assert moe_impl_for(64, "bf16", "Dev", custom) == "zoe"
    assert moe_impl_for(65, "bf16", "Dev", custom) == "fallback"
    assert moe_impl_for(9, "bf16", "Other", custom) == "fallback"
    assert moe_impl_for(10**6, "mxfp4", "Other", custom) == "zoe"  # no entry: zoe everywhere
    with pytest.raises(ValueError, match="fmt"):
        moe_impl_for(1, "fp16", "Dev")
    bad = tmp_path / "crossover.json"
    bad.write_text(json.dumps({"devices": {"default": {"bf16": {"zoe_max_m": -1}}}}))
    with pytest.raises(ValueError, match="zoe_max_m"):
        load_crossover_table(bad)
    assert CROSSOVER_PATH.exists()
    # zoe's path per measured M: the largest measured M at or below, the smallest's below it, "fused" unmeasured
    paths = {"devices": {"default": {}, "Dev": {"w4a16": {"zoe_max_m": None, "path_by_m": {
        "64": "fused", "4096": "dequant", "16384": "fused"}}}}}
    assert [moe_path_for(m, "w4a16", "Dev", paths) for m in (1, 4095, 4096, 16383, 10**6)] == [
        "fused", "fused", "dequant", "dequant", "fused"]
    assert moe_path_for(10**6, "mxfp4", "Dev", paths) == "fused"
    assert all(moe_path_for(m, f, "NVIDIA H200") in ("fused", "dequant") for m in (1, 16384) for f in FORMATS)
    bad.write_text(json.dumps({"devices": {"default": {"w4a16": {"path_by_m": {"64": "gemv"}}}}}))
    with pytest.raises(ValueError, match="path_by_m"):
        load_crossover_table(bad)


@pytest.mark.skipif(not ON_GPU, reason="production block sizes need a GPU")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 64, 333, 2048])
def test_gpu_production_tiles(fmt, m):
    """Every block-size regime of `config.py` (BLOCK_M 16..128, BLOCK_N cut for parallelism) in bf16,
    with fp8 in the mode the kernel picks by itself."""
    from zoe_kernels.moe.config import block_m_for, fp8_act_quant_for

    x, w13, w2, tw, ti, kw = _problem(m, 1024, 384, 32, 8, fmt, torch.bfloat16, seed=m)
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="dot", **kw)
    act_quant = fp8_act_quant_for(block_m_for(m, 8, 32))
    ref = fused_moe_reference(x, w13, w2, tw, ti, fp8_act_quant=act_quant, **kw)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) < _tol(fmt, torch.bfloat16, wide=block_m_for(m, 8, 32, fmt) >= 64)


@pytest.mark.skipif(not ON_GPU, reason="programmatic dependent launch needs a GPU")
def test_gpu_dot_m1_pdl_many_routings():
    """fp8 at M=1 with stage 1 as a programmatic dependent of x's quantization (`config.DOT_M1_PDL`; its programs
    start before x is written and wait for it): production tiles, 24 fresh routings over NaN-poisoned scratch, each
    within tolerance and equal to the ordinary launches' output (a read of x before the wait would differ)."""
    from zoe_kernels.moe import config

    _, w13, w2, _, _, kw = _problem(1, 2048, 1024, 64, 8, "fp8", torch.bfloat16, seed=91)
    gen = torch.Generator().manual_seed(92)
    for r in range(24):
        tw, ti = _routing(1, 64, 8, gen=gen)
        x = torch.randn((1, 2048), generator=gen).to(DEVICE, torch.bfloat16)
        out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, **kw)
        ref = fused_moe_reference(x, w13, w2, tw, ti, fp8_act_quant=True, **kw)
        assert torch.isfinite(out).all() and _rel_err(out, ref) < _tol("fp8", torch.bfloat16), r
        pdl = fused_moe(x.float(), w13, w2, tw, ti, alloc=_nan_alloc, **kw)  # float32 out: no final rounding
        saved = config.DOT_M1_PDL
        config.DOT_M1_PDL = False
        try:
            plain = fused_moe(x.float(), w13, w2, tw, ti, alloc=_nan_alloc, **kw)
        finally:
            config.DOT_M1_PDL = saved
        assert _rel_err(pdl, plain) < 1e-5, r  # float32 atomics: only the order of the adds may differ


@pytest.mark.skipif(not ON_GPU, reason="production GEMV tiles need a GPU")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [1, 5, 64])
def test_gpu_gemv_production_tiles(fmt, m):
    """The GEMV path with the block sizes of `config.GEMV_TILES`, at DeepSeek-V3.2's H and a short I."""
    x, w13, w2, tw, ti, kw = _problem(m, 7168, 256, 64, 8, fmt, torch.bfloat16, seed=100 + m)
    out = fused_moe(x, w13, w2, tw, ti, alloc=_nan_alloc, path="gemv", **kw)
    ref = fused_moe_reference(x, w13, w2, tw, ti, fp8_act_quant=False, **kw)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) < _tol(fmt, torch.bfloat16)


@pytest.mark.skipif(not ON_GPU, reason="production block sizes need a GPU")
@pytest.mark.parametrize("fmt", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("m", [300, 2048])
def test_gpu_dequant_path_production_tiles(fmt, m):
    """The dequant path with the float tiles of 64 and 128 rows, in one chunk and in chunks of 5 experts."""
    from zoe_kernels.moe.dequant import dequant_moe

    x, w13, w2, tw, ti, kw = _problem(m, 1024, 384, 32, 8, fmt, torch.bfloat16, seed=7 + m)
    ref = fused_moe_reference(x, w13, w2, tw, ti, **kw)
    for workspace in (1 << 30, 5 * 2 * 384 * 1024 * 2):
        out = dequant_moe(x, w13, w2, tw, ti, fmt=fmt, w13_scale=kw["w13_scale"], w2_scale=kw["w2_scale"],
                          alloc=_nan_alloc, workspace_bytes=workspace)
        assert torch.isfinite(out).all()
        assert _rel_err(out, ref) < _tol(fmt, torch.bfloat16, wide=True)
