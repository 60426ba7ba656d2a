"""Block sizes of the fused MoE stages, picked from the shapes (no autotuning at call time).

Small M is memory bound: small BLOCK_M (16, the least `tl.dot` takes), deep pipelines, and BLOCK_N cut until
the grid has about two programs per SM, so every SM streams weights. Large M is compute bound: 64 or 128
rows per tile and wider tiles. BLOCK_K equals the scale group where the format has one (128), so a K step
needs one scale per row or column.
"""

from __future__ import annotations

from zoe_kernels.platform import current_target, has_native_mx, has_pdl, has_ptx, interpreting, sm_count

# Programs per multiprocessor/CU a memory-bound grid aims at (`target_programs`): two keep every SM of an H200
# streaming weights (264 on its 132 SMs). Retune by sweeping BLOCK_N at M=1 (bench/kernels/moe_bench.py).
PROGRAMS_PER_SM = 2


def target_programs() -> int:
    """Programs a memory-bound stage's grid should reach on the target (`platform.current_target`)."""
    return PROGRAMS_PER_SM * sm_count()


# Edges per active expert above which the 4-bit formats take 128-row tiles (the float formats above 96). Why: a
# 4-bit tile decodes each weight tile once for all its rows, so taller tiles pay even half empty: H200,
# DeepSeek-V3.2, M=3072 (96 edges per expert): w4a16 7.6 against 9.1 ms on 64-row tiles, mxfp4 7.9 against 9.6
# (raw/moe_m1_launch_modes_tiles_h200_b.json). Retune: `moe_large_m.py --tile-sweep 2048,3072` (bm128 variants).
FOUR_BIT_BLOCK_M128_ABOVE = 64


# The 4-bit formats' 128-row tiles run in two launches per stage (`grouped_gemm.TileRows`): the tiles with an edge in
# their upper 64 rows, then each expert's last tile that is at most half full as a 64-row tile. Why: with ~192 edges
# per expert (DeepSeek-V3.2 M=6144) two full tiles spend a quarter of the MMA rows on padding, and a 64-row tile costs
# the weight decode again but half the MMA. Retune: `moe_large_m.py --half-tiles` times both side by side.
FOUR_BIT_HALF_TILES = True


def block_m_for(m: int, top_k: int, num_experts: int, fmt: str = "bf16") -> int:
    """Rows per tile, from the expected edges per active expert (and the format: FOUR_BIT_BLOCK_M128_ABOVE)."""
    edges = m * top_k
    per_expert = edges / max(1, min(num_experts, edges))
    if per_expert <= 16:
        return 16
    if per_expert <= 32:
        return 32
    wide_above = FOUR_BIT_BLOCK_M128_ABOVE if fmt in FOUR_BIT_FORMATS else 96
    return 64 if per_expert <= wide_above else 128


def fp8_act_quant_for(block_m: int) -> bool:
    """fp8 runs w8a8 (activations quantized per token group) at every tile height: the w8a16 mode saves two
    launches but measured slower on the H200 at every M (Hopper has no single e4m3 -> bf16 conversion).
    Retune: time `fused_moe(..., fp8_act_quant=False)` against the default (bench/kernels/moe_bench.py)."""
    del block_m
    return True


def mx_native() -> bool:
    """mxfp4 through `tl.dot_scaled` only where the hardware scales natively; elsewhere Triton would emulate
    it less efficiently than the kernel's own dequantization."""
    return has_native_mx()


FOUR_BIT_FORMATS = ("w4a16", "mxfp4")
# The 4-bit formats on tiles of at least this many rows (wgmma tiles on Hopper) interleave the decoded even-k and
# odd-k weight halves into one K tile, with the int4 group scale applied to the weights (`grouped_gemm._join_k`):
# the activations stay in shared memory and the K steps form one MMA chain. Their stage 1 multiplies gate and up in
# one dot (`grouped_gemm` GU_ONE_DOT: weight rows interleaved, 2 BLOCK_N columns): Triton waits on each wgmma whose
# operand the loop body wrote before the next decode, so one wgmma of 128 columns per K step instead of two of 64
# halves the waits. H200, M=6144, side by side (raw/moe_gate_up_one_dot_h200.json): DeepSeek-V3.2 w4a16 13.38
# against 14.88 ms, mxfp4 13.08 against 14.49; GLM-5 12.65 against 14.29 and 12.59 against 13.43 (8 warps: 2-6 %
# slower than 4). Retune: `moe_large_m.py --side-by-side 6144 --no-rows`. Below it the activations are split into
# even-k and odd-k halves in registers (two dots per step, the int4 scale on their result), which suits 16-row tiles.
# Why: compiled for sm_90a, the split form of the 64- and 128-row w4a16 tiles spills (255 registers, 168-2,352 bytes)
# and the joined form does not (126-238 registers); on the H200 the joined w4a16 tiles took 0.3-0.6x the split ones'
# time at M >= 2048. Retune: `bench/kernels/moe_large_m.py` times both (its zoe_fused_split rows).
JOIN_K_MIN_BLOCK_M = 64
# The dequantizing large-M path (`dequant.py`): the float workspace that holds a chunk of experts' gate+up weights
# (then their down weights). Why: with the local experts of an expert-parallel rank (DeepSeek-V3.2 over 8 GPUs:
# 32 experts, 1.9 GB in bf16) one chunk covers them all, and even all 256 on one GPU (15 GB) fit in one chunk.
# Retune: lower it where memory is short; each extra chunk costs two dequant launches and two stage launches whose
# other experts' tiles exit at once (`bench/kernels/moe_large_m.py` times the path).
DEQUANT_WORKSPACE_BYTES = 16 << 30
# (rows, packed bytes per row, num_warps) of one dequantization program. Why: the fastest of the tiles timed on the
# H200 (DeepSeek-V3.2's gate+up weights, bound by the bf16 writes). Retune: `moe_large_m.py --dequant-tiles`.
DEQUANT_TILE = (16, 128, 4)
# Formats whose tiles of at most SWAP_AB_MAX_BLOCK_M rows (BLOCK_N >= 64) swap the MMA's operands
# (`grouped_gemm._dot_w_mx_swapped`): mxfp4, whose decode then takes the row's e8m0 scales as one word per K step
# (about 4 sm_90a instructions per weight in the K loop against 11). Why (H200): on 16-row tiles 27-35 % less time
# at M = 64..512 on every measured shape; on 32-row tiles DeepSeek-V3.2 M=1024 6.3 against 8.8 ms joined and 9.3
# split (raw/moe_m1_launch_modes_tiles_h200_b.json); w4a16 swapped was 6-10 % slower on 16 rows, 1 % on 32.
# Retune: `bench/kernels/moe_bench.py --providers zoe_dot` with this set changed, `moe_large_m.py --tile-sweep 1024`.
SWAP_AB_FORMATS = {"mxfp4"}
SWAP_AB_MAX_BLOCK_M = 32


# Bytes per element of a stage's A (activations: fp8 under w8a8, else 16-bit) and weight tiles as loaded, per format.
_TILE_BYTES = {"bf16": (2, 2), "fp8": (1, 1), "w4a16": (2, 0.5), "mxfp4": (2, 0.5)}


def fit_stages(stages: int, bm: int, bn: int, bk: int, fmt: str, gated: bool) -> int:
    """The pipeline depth the target takes (`platform.current_target`): its A and weight tiles
    (`Target.pipeline_tiles` of them) within the target's shared memory/LDS (gfx942's 64 KiB cuts the prefill tiles'
    three stages to two), and at most 3 for a gated stage (two dots per K step) where Triton pipelines with
    asynchronous copies (gfx950): Triton 3.9's block-pingpong scheduler asserts on that loop at 4 stages."""
    target = current_target()
    if gated and target.pipeline_tiles(4) == 4:
        stages = min(stages, 3)
    a_bytes, w_bytes = _TILE_BYTES[fmt]
    tile = bm * bk * a_bytes + bk * bn * w_bytes * (2 if gated else 1)
    while stages > 1 and target.pipeline_tiles(stages) * tile > target.lds_bytes:
        stages -= 1
    return stages


def stage_config(m: int, top_k: int, num_experts: int, n: int, k: int, fmt: str, *, gated: bool,
                 block_m: int | None = None) -> dict:
    """Launch parameters for one stage: n output columns (I for stage 1, H for stage 2), k reduction length."""
    bm = block_m or block_m_for(m, top_k, num_experts, fmt)
    edges = m * top_k
    active = min(num_experts, edges)
    tiles_m = active * -(-max(1, edges // max(1, active)) // bm)
    bk = 64 if fmt == "bf16" and bm >= 64 else 128
    join_k = fmt in FOUR_BIT_FORMATS and bm >= JOIN_K_MIN_BLOCK_M
    if interpreting():
        # The interpreter pays per program and loop step: few, large tiles.
        return {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1,
                "JOIN_K": join_k, "SWAP_AB": bm <= SWAP_AB_MAX_BLOCK_M and fmt in SWAP_AB_FORMATS,
                "HALF_TILES": FOUR_BIT_HALF_TILES and fmt in FOUR_BIT_FORMATS and bm >= 2 * JOIN_K_MIN_BLOCK_M,
                "GU_ONE_DOT": join_k and gated}
    if bm >= 64:
        bn = 128
        warps = 8 if bm == 128 else 4
        stages = 3
        if gated and fmt != "bf16":
            bn = 64  # two accumulators (gate, up) plus the scaled partial product: keep registers in bounds
        if fmt in FOUR_BIT_FORMATS:
            # 4 warps and K steps of 64 (65 KB of shared memory, <= 255 registers): two programs per SM, so one
            # program's decode overlaps the other's MMAs. H200, DeepSeek-V3.2 (`moe_large_m.py --tile-sweep`,
            # raw/moe_m1_launch_modes_tiles_h200_b.json): w4a16 M=6144 15.3 against 19.7 ms with 8 warps, mxfp4
            # 15.3 against 20.6; 4-deep pipelines within 1 %, 64-row tiles 5-8 % slower, 256-row tiles with 8 warps
            # 8-27 % slower (_a.json). Retune with that sweep.
            warps, bk = 4, 64
    else:
        bn = 64 if gated else 128
        while bn > 16 and tiles_m * -(-n // bn) < target_programs():
            bn //= 2
        warps = 4
        stages = 4 if fmt in ("fp8", "w4a16", "mxfp4") else 3
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps,
            "num_stages": fit_stages(stages, bm, bn, bk, fmt, gated),
            "JOIN_K": join_k, "SWAP_AB": bm <= SWAP_AB_MAX_BLOCK_M and bn >= 64 and fmt in SWAP_AB_FORMATS,
            "HALF_TILES": FOUR_BIT_HALF_TILES and fmt in FOUR_BIT_FORMATS and bm >= 2 * JOIN_K_MIN_BLOCK_M,
            "GU_ONE_DOT": join_k and gated}


# The tl.dot path at M=1 in its launch-saving mode: one tile per edge with the expert read from topk_ids (no
# align launch), stage 2's float32 accumulator zeroed by stage 1 (no memset) and stage 2 split along K (its
# partial sums are atomic adds anyway). Per format: {1: (BLOCK_N, num_warps, num_stages), 2: (BLOCK_N, num_warps,
# num_stages, SPLIT_K)}; a format missing here keeps the align-based tiles (or the GEMV path) at M=1. Why: fp8 at
# M=1 on DeepSeek-V3.2 97.5 us against 112 us with align-based tiles (86 % of its bytes at the read bandwidth); the
# 4-bit formats are faster on the word-wise GEMV. Retune: `bench/kernels/moe_fp8_m1_sweep.py`.
DOT_M1_TILES: dict[str, dict[int, tuple]] = {"fp8": {1: (32, 4, 4), 2: (128, 4, 4, 2)}}
# fp8's M=1 mode with top-k > 1 quantizes the intermediate in stage 1's epilogue (the last program to finish each
# 128-column group of an edge, counted by an atomic, quantizes the group): one launch fewer. Why (H200, side by
# side, medians of 3 interleaved rounds): DeepSeek-V3.2 95.4 against 95.8 us back to back, 104.1 against 104.7
# isolated; GLM-5 93.8 against 94.2, 102.4 against 102.9 (raw/moe_m1_epilogues_h200.json; folding the output cast
# into stage 2 as well took 98.4 / 97.2 us: 144 registers instead of 108 there, 3 programs per SM instead of 4).
# Retune: `bench/kernels/moe_large_m.py --side-by-side 1 --no-rows`.
DOT_M1_QUANT_IN_STAGE1 = True
# The mode runs from this many routed experts per token up: the measured shapes route 8 or 9 (ZAYA1's top-1
# keeps the align-based tiles, not measured in this mode on the GPU).
DOT_M1_MIN_TOP_K = 8
# Split-K keeps at least this many K steps per program. Why: the TP8 slice (I = 256, 2 K steps) ran slower split
# (10.8 against 10.0 us for stage 2). Retune: `moe_fp8_m1_sweep.py` on a short-I shape.
MIN_K_STEPS_PER_SPLIT = 4


# fp8's M=1 mode: stage 1's programs, after their K loop, prefetch the first bytes of the weights stage 2 reads into
# L2 (`grouped_gemm._prefetch_next_stage`; PTX targets): this share of the target's L2, in whole MiB (16 MiB of the
# 60 MiB the H200 reports), so stage 1's tail, when fewer programs stream, fetches bytes that stage 2 would wait for. Why (H200,
# side by side, medians of 3 interleaved rounds; back to back /
# isolated, raw/moe_gate_up_one_dot_h200.json): DeepSeek-V3.2 95.9 / 103.8 us with 16 MiB against 96.9 / 105.6 with
# none, 98.1 / 106.2 with 24 and 101.7 / 110.6 with 40 (more competes with stage 1's own reads); GLM-5 93.5 / 102.4
# against 95.6 / 105.0; another lease (raw/moe_words_tiles_h200.json): 94.5 / 102.4 with 16 MiB, 93.8 / 102.3 with
# 8, 95.4 / 103.9 with none. Retune: `moe_large_m.py --side-by-side 1 --no-rows`.
DOT_M1_L2_PREFETCH_SHARE = 16 / 60


def dot_m1_l2_prefetch_bytes() -> int:
    """Bytes of stage 2's weights stage 1 prefetches into L2 in the M=1 mode: DOT_M1_L2_PREFETCH_SHARE of the
    target's L2 in whole MiB (0: none; PTX targets with a known L2 only)."""
    if not has_ptx():
        return 0
    return int(current_target().l2_bytes * DOT_M1_L2_PREFETCH_SHARE + 0.5) >> 20 << 20  # to the byte, then MiB


# fp8's M=1 mode launches stage 1 as a programmatic dependent of x's quantization (where `platform.has_pdl`): its
# programs start while the quantization runs and wait for x just before their K loop. Why (H200, side by side,
# medians of 3 interleaved rounds, raw/moe_m1_launches_h200.json): DeepSeek-V3.2 93.4 against 93.9 us back to back,
# 100.9 against 102.4 isolated; GLM-5 91.3 / 91.7 and 100.0 / 101.1. Prefetching 4 or 16 lines of each weight row
# into L2 before the wait gained nothing (93.8, 92.1 us) or lost (102.6, 102.3). Retune: `moe_large_m.py
# --side-by-side 1 --no-rows`.
DOT_M1_PDL = True


def dot_m1_pdl() -> bool:
    """Whether fp8's M=1 mode launches stage 1 as a programmatic dependent of x's quantization (DOT_M1_PDL, on a
    device with `platform.has_pdl`)."""
    return DOT_M1_PDL and has_pdl()


def dot_m1_quant_in_stage1() -> bool:
    """Whether fp8's M=1 mode quantizes the intermediate in stage 1 (DOT_M1_QUANT_IN_STAGE1)."""
    return DOT_M1_QUANT_IN_STAGE1


def dot_m1_configs(m: int, fmt: str, top_k: int, k2: int) -> tuple[dict, dict] | None:
    """(stage 1, stage 2) launch parameters of the M=1 mode of the tl.dot path, or None where it is not used;
    k2 is stage 2's reduction length (I)."""
    if m != 1 or fmt not in DOT_M1_TILES or top_k < DOT_M1_MIN_TOP_K:
        return None
    t1, t2 = DOT_M1_TILES[fmt][1], DOT_M1_TILES[fmt][2]
    split = max(1, min(t2[3], -(-k2 // 128) // MIN_K_STEPS_PER_SPLIT)) if top_k > 1 else 1
    if interpreting():  # small tiles, one stage; the split as configured
        t1, t2 = (32, 4, 1), (32, 4, 1, t2[3])
    cfg1 = {"BLOCK_M": 16, "BLOCK_N": t1[0], "BLOCK_K": 128, "num_warps": t1[1],
            "num_stages": fit_stages(t1[2], 16, t1[0], 128, fmt, True)}
    cfg2 = {"BLOCK_M": 16, "BLOCK_N": t2[0], "BLOCK_K": 128, "num_warps": t2[1],
            "num_stages": fit_stages(t2[2], 16, t2[0], 128, fmt, False), "SPLIT_K": split}
    return cfg1, cfg2


# The GEMV path (`gemv.py`) runs while the expected edges per active expert (`edges_per_expert`) stay at or
# below this, per format. Why: on the H200 bf16 and fp8 lost to the tl.dot path at every measured M (0.0: never);
# w4a16's GEMV won up to M=16 on DeepSeek-V3.2 and GLM-5 (1.26 edges per expert) and mxfp4's up to M=16, its dot
# path from M=64 (2.3). Retune: `bench/kernels/moe_bench.py --providers zoe_gemv,zoe_dot` over M 1..64.
GEMV_MAX_EDGES_PER_EXPERT = {"bf16": 0.0, "fp8": 0.0, "w4a16": 1.3, "mxfp4": 1.75}
# Bytes of one weight row per scale group (one K step of `gemv._dequant_group`): bf16 256, fp8 128, int4 64,
# mxfp4 16.
GROUP_ROW_BYTES = {"bf16": 256, "fp8": 128, "w4a16": 64, "mxfp4": 16}
# (BLOCK_N, groups per K step) per format and stage (1: gate+up, 2: down) of the byte-wise GEMV. Why: the best of
# a sweep at M=1 on DeepSeek-V3.2 and its TP8 slice on the H200. Retune: `moe_bench.py --gemv-sweep dsv32,dsv32-tp8`.
GEMV_TILES = {
    "bf16": {1: (16, 2), 2: (16, 2)},
    "fp8": {1: (16, 2), 2: (32, 2)},
    "w4a16": {1: (16, 4), 2: (16, 4)},
    "mxfp4": {1: (32, 4), 2: (32, 4)},
}
# The word-wise 4-bit kernel (`gemv_4bit.py`, rows of whole int32 words): (BLOCK_N, NS slices of 32 k per K step,
# num_warps, PREFETCH of the next K step[, num_stages]) per format and stage, in order of preference
# (`_pick_4bit_tile`: the first whose grid has `target_programs()` programs, whose K takes two K steps (else one)
# and, for stage 1 on CUDA, whose last wave is at least GEMV_4BIT_MIN_WAVE_FILL full; else the last). Why: no single
# tile led DeepSeek-V3.2 (1024 stage-1 programs: (16, 16, 2)), GLM-5 (1152: a second wave, so (16, 32, 4)) and the
# TP8 slice (128 programs) in the H200 sweeps. Retune: `bench/kernels/moe_gemv4_sweep.py` on those shapes.
GEMV_4BIT_TILES = {
    "w4a16": {1: [(16, 16, 2, False), (16, 32, 4, False)], 2: [(16, 8, 1, False)]},
    "mxfp4": {1: [(16, 16, 2, False), (16, 32, 4, False)],
              2: [(16, 16, 2, False), (16, 8, 1, False), (4, 64, 1, False)]},
}
# Stage 1 of a single edge (top-1 at M=1, e.g. ZAYA1). Why: mxfp4 4.4 us against 5.5 with the tiles above (H200).
# Retune: `moe_gemv4_sweep.py --sweep-shapes zaya1`.
GEMV_4BIT_ONE_EDGE = {"mxfp4": (8, 64, 2, False)}
# The wave estimate assumes this many registers per thread: what ptxas gives the tiles above on sm_90a (96-128).
# Retune from `bench/kernels/moe_aot.py`'s register counts when the tiles change.
GEMV_4BIT_REGISTERS = 128
# Share of the last wave of stage-1 programs below which a tile is skipped. Why: GLM-5's 1152 programs at (16, 16, 2)
# left a last wave of 96 and ran 50.6 against 39.4 us with (16, 32, 4). Retune with moe_gemv4_sweep.py on GLM-5.
GEMV_4BIT_MIN_WAVE_FILL = 0.8
# The word-wise kernel's products in packed halves (`gemv_4bit._slice_dot_h2`: f16x2 decode, products and sums per
# 32-weight slice, then float32) per format and stage, where it has PTX and the activations are 16-bit; else float32
# products. Why: 10-25 % less time per stage at M=1 on the H200 (e.g. w4a16 stage 1 35.2 against 42.8 us on
# DeepSeek-V3.2), rounding about 6e-4 of the norm. Retune: `moe_gemv4_sweep.py --h2 1,0`.
GEMV_4BIT_H2 = {"w4a16": {1: True, 2: True}, "mxfp4": {1: True, 2: True}}
# The word-wise GEMV's stage 2 is launched as a programmatic dependent of stage 1 (`gemv_4bit.launch_4bit`, where
# `platform.has_pdl`): it starts while stage 1's last programs run and fetches its first weights before it waits.
GEMV_4BIT_PDL = True
# Stage 2 splits the top-k slots over more programs (adding with float32 atomics) until its grid has this many.
# Why: at M=1 on DeepSeek-V3.2 8 chunks took fp8 stage 2 from 82 us to 42 us. Retune: `moe_bench.py --gemv-sweep`.
GEMV_MIN_PROGRAMS = 2048


def edges_per_expert(m: int, top_k: int, num_experts: int) -> float:
    """Expected edges per expert that receives any, under uniform routing: M k / (E (1 - (1 - k/E)^M))."""
    edges = m * top_k
    if edges == 0:
        return 0.0
    k_frac = min(1.0, top_k / max(1, num_experts))
    active = num_experts * (1.0 - (1.0 - k_frac) ** m)
    return edges / max(1.0, active)


def use_gemv(m: int, top_k: int, num_experts: int, fmt: str, inter_size: int | None = None) -> bool:
    """True when the small-M GEMV path should run (few tokens per expert), unless the tl.dot path's M=1 mode
    (`dot_m1_configs`, which needs the intermediate size I: `inter_size`) applies."""
    if inter_size is not None and dot_m1_configs(m, fmt, top_k, inter_size) is not None:
        return False
    return edges_per_expert(m, top_k, num_experts) <= GEMV_MAX_EDGES_PER_EXPERT[fmt]


def gemv_warps(block_n: int, fmt: str) -> int:
    """Warps such that every thread loads 16 bytes of weights per group: BLOCK_N rows x group bytes / 16."""
    return max(1, min(8, block_n * GROUP_ROW_BYTES[fmt] // 16 // 32))


def _wave_fill(programs: int, num_warps: int) -> float:
    """Share of the last wave that holds programs, at GEMV_4BIT_REGISTERS registers per thread and 64K registers
    per multiprocessor (CUDA); 1.0 where the multiprocessor count is unknown (no GPU) or on ROCm."""
    sms = sm_count() if has_ptx() else 0
    if not sms:
        return 1.0
    resident = sms * max(1, min(65536 // (GEMV_4BIT_REGISTERS * 32 * num_warps), 64 // num_warps))
    return programs / (-(-programs // resident) * resident)


def _pick_4bit_tile(tiles: list, rows: int, n: int, k: int | None, gated: bool) -> tuple:
    """The first word-wise tile (BLOCK_N, NS, warps, ...) with a grid of `target_programs()` programs
    (rows x n / BLOCK_N), at least two K steps of NS 32-k slices (when the reduction size k is known) and, for
    stage 1 (gated; stage 2's grid grows by its slot chunks), a last wave at least GEMV_4BIT_MIN_WAVE_FILL full;
    else the first of those with one K step (a short K: the TP8 slice's stage 2); else the last (small grids)."""
    for min_steps in (2, 1):
        for t in tiles:
            programs = rows * -(-n // t[0])
            if programs >= target_programs() and (k is None or k >= min_steps * 32 * t[1]) and (
                    not gated or _wave_fill(programs, t[2]) >= GEMV_4BIT_MIN_WAVE_FILL):
                return t
    return tiles[-1]


def gemv_config(rows: int, n: int, fmt: str, *, gated: bool, tile: tuple[int, int] | None = None,
                top_k: int = 1, words_tile: tuple | None = None, k: int | None = None) -> dict:
    """Launch parameters of one GEMV stage (`rows` edges or tokens, n output rows): BLOCK_N rows of weights
    per program, GPI scale groups per K step (independent loads in flight), 16-byte loads per thread, and
    for stage 2 the number of chunks the top-k slots are split into: more than one only while the grid
    would have fewer than GEMV_MIN_PROGRAMS programs (then they add with atomics). The 4-bit formats add
    "WORDS", the tile of the word-wise kernel (`gemv_4bit.py`) that runs where the weight rows are whole words,
    from GEMV_4BIT_TILES by the grid and the reduction size k (`_pick_4bit_tile`), or `words_tile`."""
    if interpreting():
        # few programs, and both stage-2 modes covered at small M (one token: slots split; more: not)
        cfg = {"BLOCK_N": 16, "GPI": 1, "num_warps": 4, "CHUNKS": 1 if rows > 1 else top_k}
        if fmt in GEMV_4BIT_TILES:
            cfg["WORDS"] = {"BLOCK_N": 16, "NS": 2, "num_warps": 1, "PREFETCH": True}
        return cfg
    bn, gpi = tile or GEMV_TILES[fmt][1 if gated else 2]
    programs = rows * -(-n // bn)
    words = None
    if fmt in GEMV_4BIT_TILES:
        one_edge = GEMV_4BIT_ONE_EDGE.get(fmt) if gated and rows == 1 else None
        wbn, ns, wwarps, prefetch, *stages = words_tile or one_edge or _pick_4bit_tile(
            GEMV_4BIT_TILES[fmt][1 if gated else 2], rows, n, k, gated)
        words = {"BLOCK_N": wbn, "NS": ns, "num_warps": wwarps, "PREFETCH": prefetch, "num_stages": (stages or [1])[0],
                 "PDL": GEMV_4BIT_PDL, "H2": GEMV_4BIT_H2[fmt][1 if gated else 2] and has_ptx()}
        programs = rows * -(-n // wbn)
    chunks = 1
    while not gated and chunks < top_k and programs * chunks < GEMV_MIN_PROGRAMS:
        chunks *= 2
    if chunks < top_k < 2 * chunks:  # e.g. 9 slots (GLM-5's shared expert) in 8 chunks: 2 slots in some, so one
        chunks = top_k               # slot per chunk instead
    elif chunks < top_k:  # no chunk left without a slot (9 in 4: 3 chunks of 3)
        chunks = -(-top_k // -(-top_k // chunks))
    cfg = {"BLOCK_N": bn, "GPI": gpi, "num_warps": gemv_warps(bn, fmt), "CHUNKS": min(chunks, top_k)}
    if words:
        cfg["WORDS"] = words
    return cfg
