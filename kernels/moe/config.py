"""Block sizes of the fused MoE stages, picked from the shapes (no autotuning at call time).

Small M is memory bound: small BLOCK_M (16, the least `tl.dot` takes), deep pipelines, and BLOCK_N cut until
the grid has about two programs per SM, so every SM streams weights. Large M is compute bound: 64 or 128
rows per tile and wider tiles. BLOCK_K equals the scale group where the format has one (128), so a K step
needs one scale per row or column.
"""

from __future__ import annotations

from zoe_kernels.platform import current_target, has_native_mx, has_ptx, interpreting, sm_count

# Programs per multiprocessor/CU a memory-bound grid aims at (`target_programs`): two keep every SM of an H200
# streaming weights (264 on its 132 SMs). Retune by sweeping BLOCK_N at M=1 (bench/kernels/moe_bench.py).
PROGRAMS_PER_SM = 2


def target_programs() -> int:
    """Programs a memory-bound stage's grid should reach on the target (`platform.current_target`)."""
    return PROGRAMS_PER_SM * sm_count()


def block_m_for(m: int, top_k: int, num_experts: int) -> int:
    """Rows per tile, from the expected edges per active expert."""
    edges = m * top_k
    per_expert = edges / max(1, min(num_experts, edges))
    if per_expert <= 16:
        return 16
    if per_expert <= 32:
        return 32
    return 64 if per_expert <= 96 else 128


def fp8_act_quant_for(block_m: int) -> bool:
    """fp8 runs w8a8 (activations quantized per token group) at every tile height. The w8a16 mode saves two
    launches but measured slower on the H200 at every M (DeepSeek-V3.2 M=1: 150 us against 112 us), since
    Hopper has no single e4m3 -> bf16 conversion (bench/kernels/results/raw/run2_moe_results.json)."""
    del block_m
    return True


def mx_native() -> bool:
    """mxfp4 through `tl.dot_scaled` only where the hardware scales natively; elsewhere Triton would emulate
    it less efficiently than the kernel's own dequantization."""
    return has_native_mx()


FOUR_BIT_FORMATS = ("w4a16", "mxfp4")
# The 4-bit formats on tiles of at least this many rows (wgmma tiles on Hopper) interleave the decoded even-k and
# odd-k weight halves into one K tile, with the int4 group scale applied to the weights (`grouped_gemm._join_k`):
# the activations stay in shared memory and the K steps form one MMA chain. Below it the activations are split into
# even-k and odd-k halves in registers (two dots per step, the int4 scale on their result), which suits 16-row tiles.
# Why: compiled for sm_90a, the split form of the 64- and 128-row w4a16 tiles spills (255 registers, 168-2,352 bytes)
# and the joined form does not (126-238 registers). Retune: `bench/kernels/moe_large_m.py --join-sweep`.
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
# Formats whose 16-row tiles (BLOCK_N >= 64) swap the MMA's operands (`grouped_gemm._dot_w_mx_swapped`): mxfp4, whose
# decode then takes the row's e8m0 scales as one word per K step (4.0-4.2 sm_90a instructions per weight in the K
# loop against 10.9-11.7). H200 run16 (bench/kernels/results/raw/run16_*, swapped against not, each checked first):
# DeepSeek-V3.2 M=64 3,418.3 vs 4,749.5 us, M=256 3,969.0 vs 5,494.5, M=512 5,484.5 vs 7,678.4; GLM-5, the TP8
# slice, Kimi-K2 and ZAYA1 27-35 % faster at M=64 and 256. w4a16 swapped was 6-10 % slower at every point timed
# (M 8..512; and its M=1 mode 107.9 against 88.9 us), so it stays unswapped.
SWAP_AB_TILES16 = {"mxfp4"}


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
    bm = block_m or block_m_for(m, top_k, num_experts)
    edges = m * top_k
    active = min(num_experts, edges)
    tiles_m = active * -(-max(1, edges // max(1, active)) // bm)
    bk = 64 if fmt == "bf16" and bm >= 64 else 128
    join_k = fmt in FOUR_BIT_FORMATS and bm >= JOIN_K_MIN_BLOCK_M
    if interpreting():
        # The interpreter pays per program and loop step: few, large tiles.
        return {"BLOCK_M": bm, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1,
                "JOIN_K": join_k, "SWAP_AB": bm == 16 and fmt in SWAP_AB_TILES16}
    if bm >= 64:
        bn = 128
        warps = 8 if bm == 128 else 4
        stages = 3
        if gated and fmt != "bf16":
            bn = 64  # two accumulators (gate, up) plus the scaled partial product: keep registers in bounds
        if fmt in FOUR_BIT_FORMATS:
            # 4 warps and K steps of 64 (65 KB of shared memory, <= 255 registers): two programs per SM, so one
            # program's decode overlaps the other's MMAs. H200, DeepSeek-V3.2 (`moe_large_m.py --tile-sweep`):
            # w4a16 M=4096 11.8 against 13.7 ms with 8 warps and K steps of 128, M=16384 37.3-38.1 against 41.8;
            # mxfp4 13.3 against 15.6 and 40.1 against 47.1. Retune with that sweep.
            warps, bk = 4, 64
    else:
        bn = 64 if gated else 128
        while bn > 16 and tiles_m * -(-n // bn) < target_programs():
            bn //= 2
        warps = 4
        stages = 4 if fmt in ("fp8", "w4a16", "mxfp4") else 3
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps,
            "num_stages": fit_stages(stages, bm, bn, bk, fmt, gated),
            "JOIN_K": join_k, "SWAP_AB": bm == 16 and bn >= 64 and fmt in SWAP_AB_TILES16}


# The tl.dot path at M=1 in its launch-saving mode: one tile per edge with the expert read from topk_ids (no
# align launch), stage 2's float32 accumulator zeroed by stage 1 (no memset), stage 2 optionally split along K
# (its partial sums are atomic adds anyway), and per stage the fp8 activations quantized either by their own
# launch (`act_quant.py`) or inside the stage (QUANT). Per format: {1: (BLOCK_N, num_warps, num_stages, QUANT),
# 2: (BLOCK_N, num_warps, num_stages, SPLIT_K, QUANT)}. A format missing here keeps the align-based tiles of
# `stage_config` at M=1. H200 run10 (bench/kernels/results/raw/run10_*, DeepSeek-V3.2, each stage alone):
# quantizing x inside stage 1 cost 20 us (79.2 against 59.8 us: every program re-quantizes each K step of x),
# inside stage 2 0.3 us alone (43.2 against 42.9), and split-K 2 took stage 2 to 39.7 us. run11 timed four
# whole candidates end to end (fused_moe, CUDA graph): this one, with both quantization launches kept, was the
# fastest on every shape: DeepSeek-V3.2 97.5 us (86 % of the bytes at 4.19 TB/s) against 112.1 us, GLM-5 95.7
# against 111.6, the TP8 slice 36.5 against 45.4; quantizing the intermediate inside stage 2 instead cost
# 4.4 us end to end (101.9-102.0 us).
# w4a16 (run13, bench/kernels/moe_4bit_dot_sweep.py, after the int4 decode, the activation split and the scale
# prefetch of `grouped_gemm.py`): fp8's tiles were the fastest of the two sets timed: DeepSeek-V3.2 87.7 us
# against 101.3 us for the word-wise GEMV (fp8 94.8 us in the same run), GLM-5 95.4 against 128.4; on the TP8
# slice (I = 256) the GEMV stays faster (30.9 against 35.4 us), hence DOT_M1_MIN_I. mxfp4 keeps the GEMV at
# M=1 (its dot path: 193.1 us against 105.7). run17-m1 (round 2, moe_4bit_m1_sweep.py): K steps of two int4 scale
# groups (BLOCK_K 256, the kernel of commit 9a73951) were slower at every tile (97.7 us end to end against 88.7;
# 144 registers against 119 in stage 1), and mxfp4's M=1 mode swapped at 64-wide tiles 146.3 against the GEMV's 105.4.
# run21-m1 (H200, this round): the word-wise GEMV with slices on neighbouring threads (`gemv_4bit._load_words`) took w4a16
# at M=1 to 68.7 us against this mode's 88.1 (GLM-5 86.5 against 96.0, the TP8 slice 22.1 against 54.2; fp8 95.2
# in the same run), so w4a16 left this table: its tiles were {1: (32, 4, 4, False), 2: (128, 4, 4, 2, False)}.
DOT_M1_TILES: dict[str, dict[int, tuple]] = {"fp8": {1: (32, 4, 4, False), 2: (128, 4, 4, 2, False)}}
# Formats whose M=1 mode runs only from this intermediate size I up (below it the GEMV path was faster; w4a16 had
# 1024 while it was in DOT_M1_TILES).
DOT_M1_MIN_I: dict[str, int] = {}
# The mode runs from this many routed experts per token up: the measured shapes route 8 or 9 (ZAYA1's top-1
# keeps the align-based tiles, not measured in this mode on the GPU).
DOT_M1_MIN_TOP_K = 8
# Split-K keeps at least this many K steps per program (the TP8 slice, I = 256, has 2: no split there; run10
# measured split-K 2 slower on it, 10.8 against 10.0 us).
MIN_K_STEPS_PER_SPLIT = 4


def dot_m1_configs(m: int, fmt: str, top_k: int, k2: int) -> tuple[dict, dict] | None:
    """(stage 1, stage 2) launch parameters of the M=1 mode of the tl.dot path, or None where it is not used;
    k2 is stage 2's reduction length (I)."""
    if m != 1 or fmt not in DOT_M1_TILES or top_k < DOT_M1_MIN_TOP_K or k2 < DOT_M1_MIN_I.get(fmt, 0):
        return None
    t1, t2 = DOT_M1_TILES[fmt][1], DOT_M1_TILES[fmt][2]
    split = max(1, min(t2[3], -(-k2 // 128) // MIN_K_STEPS_PER_SPLIT)) if top_k > 1 else 1
    if interpreting():  # small tiles, one stage; the modes (split, quantization) as configured
        t1, t2 = (32, 4, 1, t1[3]), (32, 4, 1, t2[3], t2[4])
    cfg1 = {"BLOCK_M": 16, "BLOCK_N": t1[0], "BLOCK_K": 128, "num_warps": t1[1],
            "num_stages": fit_stages(t1[2], 16, t1[0], 128, fmt, True), "A_QUANT": t1[3]}
    cfg2 = {"BLOCK_M": 16, "BLOCK_N": t2[0], "BLOCK_K": 128, "num_warps": t2[1],
            "num_stages": fit_stages(t2[2], 16, t2[0], 128, fmt, False), "SPLIT_K": split, "A_QUANT": t2[4]}
    return cfg1, cfg2


# The GEMV path (`gemv.py`) runs while the expected edges per active expert (`edges_per_expert`) stay at or
# below this, per format. Measured on the H200 (bench/kernels/moe_README.md): bf16 and fp8 lost at every point
# but ZAYA1 M=8 (by 2-3 %, run4), so they never take it (0.0). With the cheaper 4-bit tl.dot path (run13,
# DeepSeek-V3.2, GEMV / dot): w4a16 8: 702.1 / 530.8 us, 16: 1,378.5 / 932.6, 64: 5,306.9 / 1,999.5: the GEMV
# kept M=1 only then (1.0 edges per expert; and not where the dot path's M=1 mode ran w4a16, until run21-m1);
# mxfp4 8: 698.0 / 1,213.1, 16: 1,367.3 / 2,177.8, 64: 5,288.1 / 4,716.6: the GEMV up to M=16
# (1.26 edges per expert), the dot path from M=64 (2.3); 1.75 lies between, M 17..63 not measured.
# run22-m1 (after the load layout change, GEMV / dot, us): w4a16 DeepSeek-V3.2 M=8 457.9 / 580.6, M=16 895.6 / 982.5,
# GLM-5 M=8 449.2 / 504.5, M=16 856.9 / 847.1: the GEMV now runs w4a16 up to M=16 (1.26 edges per expert there;
# was 1.01, M=1 only); mxfp4 M=8 560.7 / 911.7, M=16 1,101.1 / 1,580.0 (unchanged threshold).
GEMV_MAX_EDGES_PER_EXPERT = {"bf16": 0.0, "fp8": 0.0, "w4a16": 1.3, "mxfp4": 1.75}
# Bytes of one weight row per scale group (one K step of `gemv._dequant_group`): bf16 256, fp8 128, int4 64,
# mxfp4 16.
GROUP_ROW_BYTES = {"bf16": 256, "fp8": 128, "w4a16": 64, "mxfp4": 16}
# (BLOCK_N, groups per K step) per format and stage (1: gate+up, 2: down): the best of a sweep at M=1 on
# DeepSeek-V3.2 and its TP8 slice on the H200 (bench/kernels/results/raw/run4_*, run5_*); for w4a16 stage 2
# the tile that was best on DeepSeek-V3.2 itself (43.0 us against 48.4 us with slot chunks, 97.8 against 113.5
# without), which is also the tile of run4's end-to-end rows.
GEMV_TILES = {
    "bf16": {1: (16, 2), 2: (16, 2)},
    "fp8": {1: (16, 2), 2: (32, 2)},
    "w4a16": {1: (16, 4), 2: (16, 4)},
    "mxfp4": {1: (32, 4), 2: (32, 4)},
}
# The word-wise 4-bit kernel (`gemv_4bit.py`, rows of whole int32 words): (BLOCK_N, NS slices of 32 k per K step,
# num_warps, PREFETCH of the next K step) per format and stage. The best geometric mean over DeepSeek-V3.2 and its
# TP8 slice of a 13-tile sweep at M=1 on the H200 (run9, bench/kernels/moe_gemv4_sweep.py), which also timed
# fused_moe end to end with exactly these tiles. On DeepSeek-V3.2 alone w4a16 stage 1 was fastest with
# (8, 8, 1, False): 56.5 us against 63.1 us here, but 30.0 us against 22.3 on the TP8 slice.
# run21-m1 re-swept 20 tiles after the load layout change (slices on neighbouring threads: `gemv_4bit._load_words`)
# on DeepSeek-V3.2 and its TP8 slice (stage alone, us, DeepSeek-V3.2 / TP8): w4a16 stage 1 (16, 16, 2, True)
# 42.8 / 14.7 (the old (8, 16, 1, True) 47.9 / 19.7), stage 2 (16, 8, 1, False) 25.3 / 6.9; mxfp4 stage 1
# (8, 8, 1, True) 53.5 / 22.4 (old 59.3 / 25.5), stage 2 (32, 8, 2, False, 3) 26.6 / 7.1 (old 33.8 / 7.1). A fifth
# element is num_stages: the K loop pipelined through shared memory (cp.async), which won only for mxfp4's stage 2.
# run24-m1 (13 more tiles, K steps up to a whole row): w4a16 stage 2 (8, 64, 2, False) 24.1 us against 25.0 for
# (16, 8, 1, False) on DeepSeek-V3.2, but 8.8 against 6.4 on the TP8 slice (run25-m1): not taken.
# runs 27-32-m1 (the packed-half products below): no single tile led DeepSeek-V3.2, its TP8 slice and GLM-5, so each
# stage holds a list in order of preference (`_pick_4bit_tile`): the first whose grid has `target_programs()`
# programs, whose K takes two K steps (else one) and (stage 1, on CUDA) whose last wave of programs is at least
# GEMV_4BIT_MIN_WAVE_FILL full, else the last. Stage alone, us, w4a16 / mxfp4 (run29-m1):
# stage 1 (16, 16, 2, False): DeepSeek-V3.2 35.8 / 41.1 (1024 programs, one wave of 8 per SM at 128
#   registers), GLM-5 43.7 / 50.6 (1152 programs: a second wave of 96); (16, 32, 4, False): 37.1 / 42.6, GLM-5
#   40.3 / 39.4, TP8 slice (128 programs) 12.4 / 14.8 (run28-m1);
# stage 2 (16, 16, 2, False) mxfp4 23.7 DeepSeek-V3.2, 23.2 GLM-5; (16, 8, 1, False) mxfp4 24.8 / 24.4, TP8 5.7
#   (K = 256: one K step of 8 slices), w4a16 23.3 DeepSeek-V3.2, 22.8 GLM-5, 5.5 TP8.
# Measured and not kept: K loops pipelined through shared memory (num_stages 2-3: 1.2-2.8x slower), 4 warps on
# 16 rows (52.5 us mxfp4 stage 1), fewer stage-2 slot chunks (GEMV_MIN_PROGRAMS 512-1024: no gain), and 8-row
# one-warp prefetching tiles capped at 128 registers (Triton's maxnreg: 41.4 against 41.1 us, run32-m1).
# ZAYA1 (top-1: one edge at M=1, grids of 128 programs at 16 rows; runs 35-37-m1): mxfp4 at M=1 took 20.1-20.2 us
# end to end with (16, 32, 4) and (16, 8, 1) (11.2 with stage 2 not a dependent launch; not profiled why) and 8.2
# with (8, 64, 2) for its one edge (GEMV_4BIT_ONE_EDGE) and (4, 64, 1) for stage 2, fp8 23.1-23.2 in the same runs.
# Stage alone, mxfp4: stage 1 (16, 32, 4) 5.5, (8, 64, 2) 4.4 us; stage 2 (16, 8, 1) 7.4, (4, 64, 1) 4.3.
# w4a16 keeps its tiles there (9.7-9.8 us end to end, 2.4x fp8).
GEMV_4BIT_TILES = {
    "w4a16": {1: [(16, 16, 2, False), (16, 32, 4, False)], 2: [(16, 8, 1, False)]},
    "mxfp4": {1: [(16, 16, 2, False), (16, 32, 4, False)],
              2: [(16, 16, 2, False), (16, 8, 1, False), (4, 64, 1, False)]},
}
GEMV_4BIT_ONE_EDGE = {"mxfp4": (8, 64, 2, False)}  # stage 1 of a single edge (top-1 at M=1)
# The wave estimate assumes 128 registers per thread, what ptxas gave these tiles on sm_90a (run29-m1: 96-128).
GEMV_4BIT_REGISTERS = 128
GEMV_4BIT_MIN_WAVE_FILL = 0.8
# The word-wise kernel's products in packed halves (`gemv_4bit._slice_dot_h2`: f16x2 decode, products and sums per
# 32-weight slice, then float32) per format and stage, where it has PTX and the activations are 16-bit; else the
# float32 products. run27-m1 (moe_gemv4_sweep.py, 10 tiles each way, stage alone, best tile of each, us,
# DeepSeek-V3.2 / TP8): w4a16 stage 1 35.2 / 13.1 against 42.8 / 13.3, stage 2 23.0 / 5.6 against 25.0 / 6.2;
# mxfp4 stage 1 40.8 / 16.0 against 52.3 / 18.1, stage 2 23.6 / 5.7 against 26.7 / 6.3. mxfp4 with the bytewise
# e2m1 rearrangement (run34-m1, committed tiles): stage 1 37.2, stage 2 22.9 on DeepSeek-V3.2.
GEMV_4BIT_H2 = {"w4a16": {1: True, 2: True}, "mxfp4": {1: True, 2: True}}
# The word-wise GEMV's stage 2 is launched as a programmatic dependent of stage 1 (`gemv_4bit.launch_4bit`, where
# `platform.has_pdl`): it starts while stage 1's last programs run and fetches its first weights before it waits.
GEMV_4BIT_PDL = True
# Stage 2 splits the top-k slots over more programs (adding with float32 atomics) until its grid has this many:
# at M=1 on DeepSeek-V3.2 8 chunks took fp8 stage 2 from 82 us to 42 us (run5 sweep).
GEMV_MIN_PROGRAMS = 2048
# fp8 weights decoded by the exponent-bit trick of `gemv.py` (True) or by Triton's `.to(float32)` (False):
# on the H200 the hardware e4m3x2 -> f16x2 conversion won (stage 1 at M=1: 71.6 us against 105.3 us, run4).
GEMV_FP8_BITS = False


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
        cfg = {"BLOCK_N": 16, "GPI": 1, "num_warps": 4, "CHUNKS": 1 if rows > 1 else top_k,
               "FP8_BITS": GEMV_FP8_BITS}
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
    cfg = {"BLOCK_N": bn, "GPI": gpi, "num_warps": gemv_warps(bn, fmt), "FP8_BITS": GEMV_FP8_BITS,
           "CHUNKS": min(chunks, top_k)}
    if words:
        cfg["WORDS"] = words
    return cfg
