"""Dual-scope decode on one GPU: entry-loop schedules side by side with the default, each checked first.

H200 runs 10- to 15-decode (sparse_README.md; `--set` picks a run's variant lists). Every variant is checked
against gather + two batched matmuls (relative error < 2e-2) on two fresh draws before it is timed: the
benchmark's draw (full windows, 512 selected entries) and a ragged one (random window lengths, -1 padded selections). Times are
medians of CUDA-graph replays, as in sparse_bench.py, whose row format the timed rows also take
($OUT/sparse_results.json; op csa_dual_scope_decode, so sparse_assemble.py can take them).

To fit one short lease the script first compiles every (variant, batch) specialisation in parallel worker
processes (they fill Triton's on-disk cache; `--pytest` runs the GPU tests of the two dual-scope test files
beside them), then times everything in this process, one launch at a time.

Usage: python bench/kernels/sparse_decode_sweep.py [--out DIR] [--workers N] [--pytest] [--batches 64,1,...]
       python bench/kernels/sparse_decode_sweep.py --aot   # no GPU: sm_90a registers/spills of run 15's variants
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# schedule: 0 = two compiler-pipelined loops with the index load inside (the default until run 10),
# 1 = one loop, the next tile's rows loaded into registers by hand, 2 = one loop pipelined by the compiler
# with all selected indices loaded up front; swap_ab: the dots as K q^T and V^T P^T (wgmma with 32 heads;
# 1 and swap_ab removed after run 13);
# qk_fp16: the score dots in fp16 on a power-of-two scaled q (fp8 keys convert in one instruction per pair)
F16 = dict(qk_fp16=True)
# run10-decode: all slower than the default except qk_fp16 at B >= 32 (sparse_README.md); schedule=1 and
# swap_ab were removed after run 13 (commit d43a03d has them), so those rows report an error if run again
LARGE_B = [("default", {}),
           ("S0 fp16", dict(F16)),
           ("S2 BKV=64 st2", dict(schedule=2, block_kv=64, num_stages=2)),
           ("S2 BKV=32 st3", dict(schedule=2, block_kv=32, num_stages=3)),
           ("S2 BKV=32 st4", dict(schedule=2, block_kv=32, num_stages=4)),
           ("S2 BKV=32 st4 fp16", dict(F16, schedule=2, block_kv=32, num_stages=4)),
           ("S2 BKV=32 st4 w4 fp16", dict(F16, schedule=2, block_kv=32, num_stages=4, num_warps=4)),
           ("S1 BKV=32 fp16", dict(F16, schedule=1, block_kv=32)),
           ("swap S2 BKV=64 st2", dict(schedule=2, swap_ab=True, block_kv=64, num_stages=2)),
           ("swap S2 BKV=32 st4 fp16", dict(F16, schedule=2, swap_ab=True, block_kv=32, num_stages=4))]
SMALL_B = [("default", {}),
           ("S0 fp16", dict(F16)),
           ("S2 BKV=64 st2", dict(schedule=2, block_kv=64, num_stages=2)),
           ("S2 BKV=32 st4 fp16", dict(F16, schedule=2, block_kv=32, num_stages=4)),
           ("swap S2 BKV=32 st4 fp16", dict(F16, schedule=2, swap_ab=True, block_kv=32, num_stages=4))]


# run11-decode: all 64 heads per program (K and V read once per sequence; 64-row dots, so Hopper's warpgroup
# MMA reads q and V from shared memory itself) with the one-loop compiler-pipelined schedule
H64 = dict(block_h=64, schedule=2)
RUN11_LARGE = [("default", {}),
               ("S0 fp16", dict(F16)),
               ("BH=64 S2 BKV=32 st3", dict(H64, block_kv=32, num_stages=3)),
               ("BH=64 S2 BKV=32 st3 splits=2", dict(H64, block_kv=32, num_stages=3, splits=2)),
               ("BH=64 S2 BKV=32 st2", dict(H64, block_kv=32, num_stages=2)),
               ("BH=64 S2 BKV=16 st4", dict(H64, block_kv=16, num_stages=4)),
               ("BH=64 S2 BKV=16 st3", dict(H64, block_kv=16, num_stages=3))]
RUN11_SMALL = [("default", {}),
               ("S2 BKV=64 st2", dict(schedule=2, block_kv=64, num_stages=2)),
               ("BH=64 S2 BKV=32 st3", dict(H64, block_kv=32, num_stages=3)),
               ("BH=64 S2 BKV=16 st3", dict(H64, block_kv=16, num_stages=3))]
# run12-decode: two programs per multiprocessor (4 warps, 32-entry tiles, <= 85 KB of shared memory, <= 255
# registers at 128 threads), since every variant of runs 10-11 took 4.5-6 us per tile and program whatever its
# loads in flight: the single 8-warp program per multiprocessor waits on its own dots, reductions and barriers
RUN8 = dict(schedule=0, block_h=32, block_kv=64, num_stages=2, num_warps=8)  # the default of runs 8-10 at B >= 8
W4 = dict(num_warps=4, block_kv=32, num_stages=2)
RUN12_LARGE = [("run8 default", RUN8),
               ("default", {}),
               ("BH=32 w4 S0 BKV=32 splits=2", dict(W4, block_h=32, schedule=0, splits=2)),
               ("BH=32 w4 S2 BKV=32 st2 splits=2", dict(W4, block_h=32, schedule=2, splits=2)),
               ("BH=16 w4 S0 BKV=32", dict(W4, block_h=16, schedule=0, splits=1)),
               ("BH=16 w4 S2 BKV=32 st2", dict(W4, block_h=16, schedule=2, splits=1)),
               ("BH=16 w4 S0 BKV=32 fp16", dict(W4, block_h=16, schedule=0, splits=1, qk_fp16=True))]
RUN12_SMALL = [("run8 default", dict(RUN8, block_h=16, num_warps=4)), ("default", {})]
# run15-decode: fewer instructions per tile on today's defaults (sm_90a SASS per warp and 32-entry tile at B=64:
# default 1514, fp16 score dots + lazy rescale 1203 on tiles that skip the rescale), then two diagnostics of
# why a tile takes ~5 us: 16-entry tiles at 3 stages (two tiles of loads in flight at two programs per
# multiprocessor, twice the instructions per entry) and 8-warp programs capped at 128 registers (two per
# multiprocessor: 16 warps instead of 8). Runs 15-16 (commit ef71511, "default" = its defaults): the three
# options together are the B=64 default since, defer_sum the B=128 one, qk_fp16 the B=1 one; max_registers (the
# W8_R128 rows, 71.2-71.5 us) was removed after run 16 (commit 7681136 has it), so those rows now report an error
LAZY = dict(lazy_rescale=True)
DEFER = dict(defer_sum=True)
W8_R128 = dict(block_h=32, num_warps=8, block_kv=32, num_stages=2, schedule=0, splits=2, max_registers=128)
RUN15_64 = [("default", {}),
            ("fp16", dict(F16)),
            ("lazy", dict(LAZY)),
            ("defer", dict(DEFER)),
            ("fp16 lazy", dict(F16, **LAZY)),
            ("fp16 lazy defer", dict(F16, **LAZY, **DEFER)),
            ("fp16 lazy BKV=16 st3", dict(F16, **LAZY, block_kv=16, num_stages=3)),
            ("w8 r128", dict(W8_R128)),
            ("w8 r128 fp16 lazy defer", dict(W8_R128, **F16, **LAZY, **DEFER))]
RUN15_SMALL = [("default", {}), ("fp16", dict(F16)), ("lazy", dict(LAZY)),
               ("fp16 lazy defer", dict(F16, **LAZY, **DEFER))]
RUN15_128 = [("default", {}), ("fp16", dict(F16)), ("lazy", dict(LAZY)), ("defer", dict(DEFER))]
# run17-decode: the two-pass schedule (schedule=3, dual_scope_two_pass.py: scores and probabilities of every
# tile by all 64 heads, then the values by 128-column blocks; no online softmax, no accumulator of all 512
# columns); splits = scores programs per sequence, num_warps/num_stages the scores pass, values_* the values pass
TP = dict(schedule=3)
TPF = dict(schedule=3, qk_fp16=True)
RUN17_LARGE = [("default", {}), ("2P", TP), ("2P fp16", TPF),
               ("2P fp16 s10", dict(TPF, splits=10)), ("2P fp16 s3", dict(TPF, splits=3)),
               ("2P fp16 w8", dict(TPF, num_warps=8)), ("2P fp16 vw8 vst4", dict(TPF, values_warps=8, values_stages=4)),
               ("2P fp16 dv64", dict(TPF, block_dv=64)), ("2P fp16 dv256 vw8", dict(TPF, block_dv=256, values_warps=8)),
               ("2P fp16 BKV=32 vst4", dict(TPF, block_kv=32, values_stages=4)),
               ("2P fp16 st2", dict(TPF, num_stages=2, values_stages=2))]
RUN17_SMALL = [("default", {}), ("2P", TP), ("2P fp16", TPF), ("2P fp16 dv64", dict(TPF, block_dv=64)),
               ("2P fp16 w8 vw8", dict(TPF, num_warps=8, values_warps=8))]
RUN17_128 = [("default", {}), ("2P", TP), ("2P fp16", TPF), ("2P fp16 vw8 vst4", dict(TPF, values_warps=8, values_stages=4)),
             ("2P fp16 dv64", dict(TPF, block_dv=64)), ("2P fp16 s2", dict(TPF, splits=2))]
# run18-decode: the two-pass schedule after runs 17 (per-launch times: `sparse_decode_profile.py`): indices
# loaded before the entry loops (an index load inside made each tile wait for every copy), and the score dots
# as two fp8 MMAs on q split into e4m3 parts (`qk_fp8`, the default with bf16 q: no conversion of K)
NO8 = dict(schedule=3, qk_fp8=False, qk_fp16=True)
RUN18_LARGE = [("default", {}), ("2P", TP), ("2P st2", dict(TP, num_stages=2)),
               ("2P BKV=32", dict(TP, block_kv=32)), ("2P BKV=32 st2", dict(TP, block_kv=32, num_stages=2)),
               ("2P s2", dict(TP, splits=2)), ("2P s3", dict(TP, splits=3)),
               ("2P BKV=32 st2 s3", dict(TP, block_kv=32, num_stages=2, splits=3)),
               ("2P vw8", dict(TP, values_warps=8)), ("2P dv256 vw8", dict(TP, block_dv=256, values_warps=8)),
               ("2P vst4", dict(TP, values_stages=4)), ("2P no-fp8 fp16", NO8)]
RUN18_SMALL = [("default", {}), ("2P", TP), ("2P BKV=32 st2", dict(TP, block_kv=32, num_stages=2)),
               ("2P dv64", dict(TP, block_dv=64)), ("2P no-fp8 fp16", NO8)]
RUN18_128 = [("default", {}), ("2P", TP), ("2P BKV=32 st2", dict(TP, block_kv=32, num_stages=2)),
             ("2P s2", dict(TP, splits=2)), ("2P vw8", dict(TP, values_warps=8)), ("2P no-fp8 fp16", NO8)]
# run19-decode: run 18's two-pass with the entry scales and the values pass's per-tile factors loaded before
# the loops as well (each tile waited on those loads: a load that feeds no dot is not pipelined)
RUN19_LARGE = [("default", {}), ("2P", TP), ("2P s2", dict(TP, splits=2)), ("2P s3", dict(TP, splits=3)),
               ("2P s2 st2", dict(TP, splits=2, num_stages=2)), ("2P BKV=32 st2 s2", dict(TP, block_kv=32, num_stages=2, splits=2)),
               ("2P s2 dv256 vw8", dict(TP, splits=2, block_dv=256, values_warps=8)),
               ("2P s2 vst4", dict(TP, splits=2, values_stages=4)), ("2P s2 vst2", dict(TP, splits=2, values_stages=2))]
RUN19_SMALL = [("default", {}), ("2P", TP), ("2P s2", dict(TP, splits=2))]
# run20-decode: the scores programs per sequence for one wave (B x splits <= 132), 8 warps on the scores
RUN20_LARGE = [("default", {}), ("2P s1", dict(TP, splits=1)), ("2P s2", dict(TP, splits=2)),
               ("2P s3", dict(TP, splits=3)), ("2P s4", dict(TP, splits=4)), ("2P s2 w8", dict(TP, splits=2, num_warps=8)),
               ("2P s2 vst4", dict(TP, splits=2, values_stages=4))]
# run21-decode: the defaults since commit 4d35802 (two passes from B=32 with bf16 q over fp8 keys) beside
# the one-pass defaults they replaced (qk_fp8=False: no fp8 score dots, so launch_config keeps the one pass)
RUN21 = [("default", {}), ("one-pass default", dict(qk_fp8=False))]
# run22-decode: the values pass in Gluon on Hopper (dual_scope_two_pass_gluon.py: hand-written cp.async ring, the
# indices of each thread's rows loaded one tile ahead in their own layout, one warpgroup MMA per tile)
GV = dict(gluon_values=True)
RUN22 = [("default", {}), ("2P triton values", dict(gluon_values=False)), ("2P gluon vst2", dict(GV, values_stages=2)),
         ("2P gluon vst4", dict(GV, values_stages=4)), ("2P gluon dv64 vst4", dict(GV, block_dv=64, values_stages=4)),
         ("2P gluon dv256", dict(GV, block_dv=256)), ("one-pass default", dict(qk_fp8=False))]
# run23-decode: both passes in Gluon on Hopper (the scores pass too: q split into e4m3 parts in shared memory
# once, fp8 key rows gathered by cp.async into a ring, two fp8 warpgroup MMAs per tile)
TRI = dict(gluon_values=False, gluon_scores=False)
RUN23 = [("default", {}), ("triton both", TRI), ("gluon values only", dict(gluon_scores=False)),
         ("gluon w8", dict(num_warps=8)), ("gluon st2", dict(num_stages=2)), ("gluon s1", dict(splits=1)),
         ("gluon s2", dict(splits=2)), ("gluon s4", dict(splits=4)), ("gluon dv256 vw8", dict(block_dv=256, values_warps=8)),
         ("gluon w8 dv256 vw8", dict(num_warps=8, block_dv=256, values_warps=8)), ("one-pass default", dict(qk_fp8=False))]
# run24-decode (commit 02e5a75, reverted in the next commit): the Gluon scores pass on q split beforehand by a
# separate launch; the split was wrong on the GPU (every Gluon row failed its check), the scores pass took
# 18.9 us at B=64 and the split 3.6 us; the in-program split (runs 23, 25) stays
# run25-decode: today's defaults (both passes in Gluon on Hopper, its scores pass with 8 warps) against the
# Triton passes and the one-pass defaults, at every batch
RUN25 = [("default", {}), ("two passes", dict(schedule=3)), ("triton both", TRI), ("one-pass default", dict(qk_fp8=False))]
# run26-decode: the one-pass Gluon kernel (schedule 4) at its tile sizes and rings, beside today's defaults
RUN26 = [("default", {}), ("fused 64x2", dict(schedule=4, block_kv=64, num_stages=2)),
         ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4)),
         ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused 64x2 dv128", dict(schedule=4, block_dv=128, block_kv=64, num_stages=2)),
         ("fused 64x2 split2", dict(schedule=4, block_kv=64, num_stages=2, splits=2))]
# run27-decode: the one-pass Gluon kernel with two warpgroups (warp specialization) or the scores a tile ahead
# (runs 27-30 ran options removed after them: warp_specialize, scores_ahead; their commits are in sparse_README.md)
RUN27 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused ws 32x2", dict(schedule=4, block_kv=32, num_stages=2, warp_specialize=True)),
         ("fused ahead 32x4", dict(schedule=4, block_kv=32, num_stages=4, scores_ahead=True)),
         ("fused ahead 32x3", dict(schedule=4, block_kv=32, num_stages=3, scores_ahead=True)),
         ("fused ws 32x2 split2", dict(schedule=4, block_kv=32, num_stages=2, warp_specialize=True, splits=2))]
# run28-decode: q split once per sequence by its own launch (split_q_kernel), copied in by the one-pass kernel
RUN28 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4)),
         ("fused ws 32x2", dict(schedule=4, block_kv=32, num_stages=2, warp_specialize=True)),
         ("fused ahead 32x4", dict(schedule=4, block_kv=32, num_stages=4, scores_ahead=True))]
# run29-decode: the one-pass kernel with warp specialization (a producer warpgroup, two consumers) at its rings
RUN29 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused ws 32x5", dict(schedule=4, block_kv=32, num_stages=5, warp_specialize=True)),
         ("fused ws 32x4", dict(schedule=4, block_kv=32, num_stages=4, warp_specialize=True)),
         ("fused ws 64x2", dict(schedule=4, block_kv=64, num_stages=2, warp_specialize=True))]
# run30-decode: the one-pass kernel with the program's selected indices staged in shared memory
RUN30 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4)),
         ("fused 64x2", dict(schedule=4, block_kv=64, num_stages=2)),
         ("fused ws 32x4", dict(schedule=4, block_kv=32, num_stages=4, warp_specialize=True))]
# run31-decode: the one-pass kernel with its indices loaded first and 16-byte output stores, at every batch
RUN31 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4)),
         ("two passes", dict(schedule=3))]
# run32-decode: the one-pass kernel's lazy rescale (the accumulator multiplied only when a maximum grows by > 2^8)
RUN32 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)),
         ("fused 32x3 eager", dict(schedule=4, block_kv=32, num_stages=3, lazy_rescale=False)),
         ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4))]
# run33-decode: today's defaults (the one-pass Gluon kernel from B=8 on Hopper) beside the Gluon two passes and
# the one-pass Triton kernel they replaced, at every batch
RUN33 = [("default", {}), ("two passes", dict(schedule=3)), ("one-pass triton", dict(qk_fp8=False))]
# runs 34-39-decode ran experimental constexprs of the one-pass kernel ("knobs", set through a module dict of the
# launcher at commits 835e322 to 0dba633; sparse_README.md names each run's); today's code has no knobs, so these
# lists now report an error for those variants
# run34-decode: the one-pass kernel's q descriptors computed in the loop (OPAQUE_Q), copies issued right after the
# score MMAs (EARLY_COPY), the softmax as fused multiply-adds (FMA_SOFTMAX), 64-entry tiles
_K3 = dict(OPAQUE_Q=1, EARLY_COPY=1, FMA_SOFTMAX=1)
RUN34 = [("default", {}), ("fused 32x3 opq", dict(schedule=4, block_kv=32, num_stages=3, knobs=dict(OPAQUE_Q=1))),
         ("fused 32x3 opq+early+fma", dict(schedule=4, block_kv=32, num_stages=3, knobs=_K3)),
         ("fused 64x2 opq+fma", dict(schedule=4, block_kv=64, num_stages=2, knobs=dict(OPAQUE_Q=1, FMA_SOFTMAX=1))),
         ("fused 64x2 opq+early+fma", dict(schedule=4, block_kv=64, num_stages=2, knobs=_K3))]
# run35-decode: 32-entry tiles at 4 slots; the q split's heads per program and warps
_64 = dict(schedule=4, block_kv=64, num_stages=2)
RUN35 = [("default", {}), ("fused 64x2 opq+early+fma", dict(_64, knobs=_K3)),
         ("fused 32x4 opq+early+fma", dict(schedule=4, block_kv=32, num_stages=4, knobs=_K3)),
         ("64x2 split h1 w1", dict(_64, knobs=dict(_K3, split_heads=1, split_warps=1))),
         ("64x2 split h2 w2", dict(_64, knobs=dict(_K3, split_heads=2, split_warps=2))),
         ("64x2 split h16 w4", dict(_64, knobs=dict(_K3, split_heads=16, split_warps=4))),
         ("64x2 split h16 w8", dict(_64, knobs=dict(_K3, split_heads=16, split_warps=8)))]
# run36-decode: keys two tiles ahead in a ring of three and values one tile ahead (fused_kv_kernel)
RUN36 = [("default", {}), ("fused 64x2 opq+early+fma", dict(_64, knobs=_K3)),
         ("kv 64 K3V2", dict(_64, knobs=dict(kv=True))),
         ("kv 64 K3V2 split h16 w8", dict(_64, knobs=dict(kv=True, split_heads=16, split_warps=8))),
         ("64x2 split h16 w8", dict(_64, knobs=dict(_K3, split_heads=16, split_warps=8)))]
# run37-decode: fused_kv_kernel with its copies' rows by a branch on the scope, one wait per tile
_H16 = dict(split_heads=16, split_warps=8)
RUN37 = [("default", {}), ("kv", dict(_64, knobs=dict(kv=True))), ("kv h16", dict(_64, knobs=dict(kv=True, **_H16))),
         ("kv one-wait", dict(_64, knobs=dict(kv=True, one_wait=1))),
         ("kv one-wait h16", dict(_64, knobs=dict(kv=True, one_wait=1, **_H16)))]
# run38-decode: what the q split costs the call (a diagnostic: q's parts kept from the previous call)
RUN38 = [("default", {}), ("kv", dict(_64, knobs=dict(kv=True))), ("kv h16", dict(_64, knobs=dict(kv=True, **_H16))),
         ("kv no split (diagnostic)", dict(_64, knobs=dict(kv=True, skip_split=True)))]
# run39-decode: q split inside fused_kv_kernel while its first copies fly (no split launch)
RUN39 = [("default", {}), ("kv", dict(_64, knobs=dict(kv=True))),
         ("kv insplit", dict(_64, knobs=dict(kv=True, insplit=1))),
         ("kv no split (diagnostic)", dict(_64, knobs=dict(kv=True, skip_split=True)))]
# run40-decode: today's defaults (the one-pass Gluon kernel with 64-entry tiles, keys two tiles ahead) beside the
# same kernel at 32-entry tiles and 4 key slots, the Gluon two passes and the one-pass Triton kernel, every batch
RUN40 = [("default", {}), ("fused 32x4", dict(schedule=4, block_kv=32, num_stages=4)), ("two passes", dict(schedule=3)),
         ("one-pass triton", dict(qk_fp8=False))]
# run41-decode: q by plain loads outside the copies' commit groups (reverted: slower); run42-decode: the loop's
# first wait for tile 0's keys and q only (q's copies their own commit group after tile 0's keys); both beside the
# same kernel at 32-entry tiles, the Gluon two passes and the one-pass Triton kernel
RUN41 = [("default", {}), ("fused 32x3", dict(schedule=4, block_kv=32, num_stages=3)), ("two passes", dict(schedule=3)),
         ("one-pass triton", dict(qk_fp8=False))]
# run43-decode: the default measured again, not first in its batch (the first timing after a batch's draw and
# checks runs 1-4 us slow in every run), beside the two passes
RUN43 = [("two passes", dict(schedule=3)), ("default", {}), ("one-pass triton", dict(qk_fp8=False)),
         ("default, again", {})]
# (B >= 32, B < 32[, B >= 128]) lists of each run
SETS = {"run10": (LARGE_B, SMALL_B), "run11": (RUN11_LARGE, RUN11_SMALL), "run12": (RUN12_LARGE, RUN12_SMALL),
        "run15": (RUN15_64, RUN15_SMALL, RUN15_128), "run17": (RUN17_LARGE, RUN17_SMALL, RUN17_128),
        "run18": (RUN18_LARGE, RUN18_SMALL, RUN18_128), "run19": (RUN19_LARGE, RUN19_SMALL, RUN19_LARGE),
        "run20": (RUN20_LARGE, RUN20_LARGE, RUN20_LARGE), "run21": (RUN21, RUN21, RUN21),
        "run22": (RUN22, RUN21, RUN22), "run23": (RUN23, RUN23, RUN23),
        "run25": (RUN25, RUN25, RUN25), "run26": (RUN26, RUN26, RUN26),
        "run27": (RUN27, RUN27, RUN27), "run28": (RUN28, RUN28, RUN28),
        "run29": (RUN29, RUN29, RUN29),
        "run30": (RUN30, RUN30, RUN30), "run31": (RUN31, RUN31, RUN31),
        "run32": (RUN32, RUN32, RUN32), "run33": (RUN33, RUN33, RUN33),
        "run34": (RUN34, RUN34, RUN34), "run35": (RUN35, RUN35, RUN35), "run36": (RUN36, RUN36, RUN36), "run37": (RUN37, RUN37, RUN37), "run38": (RUN38, RUN38, RUN38), "run39": (RUN39, RUN39, RUN39), "run40": (RUN40, RUN40, RUN40), "run41": (RUN41, RUN41, RUN41),
        "run42": (RUN41, RUN41, RUN41), "run43": (RUN43, RUN43, RUN43)}
VARIANT_SET = "run42"


def variants(b: int) -> list[tuple[str, dict]]:
    lists = SETS[VARIANT_SET]
    if b >= 128 and len(lists) > 2:
        return lists[2]
    return lists[0] if b >= 32 else lists[1]


def _check(sb, draw, cfg) -> float:
    """Relative error of the variant against gather + two batched matmuls on one draw, NaN if any output is not
    finite. The call's outputs and partials are poisoned: torch.empty returns NaN-filled CUDA memory during the call, so an
    element the kernels fail to write shows."""
    import torch

    from zoe_kernels.csa import dual_scope_decode

    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = draw
    ref = sb._torch_dual_scope_bmm(q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks).float()
    plain = torch.empty

    def poisoned(*args, **kwargs):
        t = plain(*args, **kwargs)
        if t.is_cuda and t.is_floating_point():
            t.fill_(float("nan"))
        return t

    torch.empty = poisoned
    try:
        out = dual_scope_decode(q, win_k, win_v, win_len, comp_k, comp_v, idx, win_k_scale=win_ks,
                                comp_k_scale=comp_ks, **cfg).float()
    finally:
        torch.empty = plain
    if not bool(out.isfinite().all()):
        return float("nan")
    return float((out - ref).norm() / ref.norm())


def worker(index: int, count: int, batches: list[int], log_path: Path) -> None:
    """Compiles (and checks) this worker's share of the (batch, variant) pairs, filling Triton's cache."""
    import sparse_bench as sb
    import torch

    jobs = [(b, name, cfg) for b in batches for name, cfg in variants(b)]
    lines = []
    for j, (b, name, cfg) in enumerate(jobs):
        if j % count != index:
            continue
        t0 = time.time()
        try:
            err = _check(sb, sb._decode_inputs(b, ragged=True), cfg)
            lines.append(f"B={b} {name}: compiled+checked in {time.time() - t0:.1f} s, err {err:.1e}")
        except Exception as exc:  # noqa: BLE001 - reported, the timing pass reports it again
            lines.append(f"B={b} {name}: ERROR {exc!r:.300}")
        torch.cuda.empty_cache()  # the baseline's expanded K/V: keep the workers' memory small
    log_path.write_text("\n".join(lines) + "\n")


def sweep(out: Path, batches: list[int]) -> None:
    import sparse_bench as sb
    import torch
    import triton

    from zoe_kernels.csa import dual_scope_decode

    meta = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                command="python bench/kernels/sparse_decode_sweep.py " + " ".join(sys.argv[1:]),
                started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    sb.META.update(meta)
    sb.measure_ceilings()
    rows: list[dict] = []

    def save():
        (out / "decode_sweep.json").write_text(json.dumps({"meta": {**sb.META}, "rows": rows}, indent=1))
        (out / "sparse_results.json").write_text(json.dumps({"meta": {**sb.META}, "rows": sb.ROWS}, indent=1))

    for b in batches:
        draw = sb._decode_inputs(b)
        ragged = sb._decode_inputs(b, ragged=True)
        q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = draw
        args = (q, win_k, win_v, win_len, comp_k, comp_v, idx)
        kw = dict(win_k_scale=win_ks, comp_k_scale=comp_ks)
        h, d = q.shape[1], q.shape[2]
        entries = win_k.shape[1] + idx.shape[1]
        bytes_min = b * entries * (d * (1 + 2) + 4 + 4) + 2 * q.numel() * 2
        floor_us = bytes_min / (sb.META["copy_tbps"] * 1e6)
        shape = f"B={b} H={h} D={d} W=128 k=512"
        base = sb.median_us(lambda: sb._torch_dual_scope_bmm(*args, win_ks, comp_ks), graph=True, rep_ms=30)
        sb.add_row(op="csa_dual_scope_decode", shape=shape, provider="torch gather+bmm", config="", median_us=base,
                   gbps=bytes_min / base / 1e3, pct_roofline=100 * floor_us / base)
        for name, cfg in variants(b):
            try:
                errs = [_check(sb, draw, cfg), _check(sb, ragged, cfg)]
            except Exception as exc:  # noqa: BLE001 - a variant that does not fit is reported, not fatal
                rows.append(dict(shape=f"B={b}", variant=name, config=json.dumps(cfg), error=repr(exc)[:300]))
                sb.log(f"decode B={b:<3d} {name:22s} ERROR {exc!r:.150}")
                save()
                continue
            ok = all(e < 2e-2 for e in errs)  # NaN compares False
            us = sb.median_us(lambda: dual_scope_decode(*args, **kw, **cfg), graph=True, rep_ms=30)
            us2 = sb.median_us(lambda: dual_scope_decode(*args, **kw, **cfg), graph=True, rep_ms=30)
            rows.append(dict(shape=f"B={b}", variant=name, config=json.dumps(cfg), median_us=us, repeat_us=us2,
                             pct_hbm=100 * floor_us / us, rel_err=errs, correct=ok, speedup_vs_torch=base / us))
            sb.add_row(op="csa_dual_scope_decode", shape=shape, provider=f"zoe {name}", config=json.dumps(cfg),
                       median_us=us, gbps=bytes_min / us / 1e3, pct_roofline=100 * floor_us / us,
                       speedup_vs_torch=base / us, rel_err_vs_torch=max(errs), correct=ok)
            sb.log(f"decode B={b:<3d} {name:22s} {us:7.1f} us (again {us2:7.1f})  {100 * floor_us / us:5.1f}% of "
                   f"{floor_us:.1f} us floor  {base / us:6.1f}x torch  err {errs[0]:.1e}/{errs[1]:.1e} ok={ok}")
            save()
        del draw, ragged, args
        torch.cuda.empty_cache()
    save()


def aot(out_json: Path) -> None:
    """sm_90a compile of the run15 variants' main kernel with the launch configuration `launch_config` picks at
    their batch (registers, spills, shared memory); variants capped with max_registers are left out (the
    compile helper takes no register cap)."""
    import sparse_aot as sa
    import triton
    import triton.language as tl

    import sparse_bench  # noqa: F401  (makes zoe_kernels importable)
    dsd = importlib.import_module("zoe_kernels.csa.dual_scope_decode")  # the module (the package exports the function)

    ptrs = {"q_ptr": "*bf16", "win_k_ptr": "*fp8e4nv", "win_v_ptr": "*bf16", "win_len_ptr": "*i32",
            "comp_k_ptr": "*fp8e4nv", "comp_v_ptr": "*bf16", "comp_idx_ptr": "*i32", "win_ks_ptr": "*fp32",
            "win_vs_ptr": "*fp32", "comp_ks_ptr": "*fp32", "comp_vs_ptr": "*fp32", "part_out_ptr": "*fp32",
            "part_lse_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16"}
    launch_keys = ("block_h", "block_dv", "block_kv", "splits", "num_warps", "schedule", "num_stages")
    rows = []
    for b in (64, 128, 1):
        for name, cfg in variants(b):
            if cfg.get("max_registers"):
                continue
            lc = dsd.launch_config(b, 64, 512, 640, **{k: v for k, v in cfg.items() if k in launch_keys})
            tiles = 128 // lc["block_kv"] + 512 // lc["block_kv"]
            constexprs = dict(D=512, DV=lc["block_dv"], BH=lc["block_h"], BKV=lc["block_kv"],
                              TILES_PER_SPLIT=triton.cdiv(tiles, lc["splits"]), K_SCALED=True, V_SCALED=False,
                              DOT_DTYPE=tl.bfloat16, PRECISION="tf32", FINAL=lc["splits"] == 1, HAS_SINK=False,
                              SCHEDULE=lc["schedule"], SEL_TILES=512 // lc["block_kv"],
                              QK_F16=cfg.get("qk_fp16", False), LAZY_RESCALE=cfg.get("lazy_rescale", False),
                              DEFER_SUM=cfg.get("defer_sum", False))
            rows.append(sa.compile_one(f"dual_scope B={b} {name}", dsd._dual_scope_partial_kernel, ptrs, constexprs,
                                       lc["num_warps"], floats=("qk_scale_log2",), num_stages=lc["num_stages"]))
    meta = {"triton": triton.__version__, "ptxas": sa._ptxas(), "target": "sm_90a",
            "command": "PYTHONPATH=<triton 3.6.0 wheel> python bench/kernels/sparse_decode_sweep.py --aot"}
    out_json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--batches", default="64,1,8,32,128")
    ap.add_argument("--workers", type=int, default=8, help="parallel compile processes before timing (0: none)")
    ap.add_argument("--pytest", nargs="?", const="", default=None,
                    help="run the dual-scope GPU tests beside the compiles (optionally only those matching -k EXPR)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--aot", action="store_true", help="compile for sm_90a here (no GPU) and write the report")
    ap.add_argument("--set", default=VARIANT_SET, choices=sorted(SETS), help="variant lists of a run")
    args = ap.parse_args()
    globals()["VARIANT_SET"] = args.set
    batches = [int(x) for x in args.batches.split(",")]
    out = Path(args.out)
    if args.aot:
        aot(HERE / "results" / "sparse_decode_aot_run15.json")
        return
    if args.worker is not None:
        worker(args.worker, args.workers, batches, Path(f"/tmp/decode_warm_{args.worker}.log"))
        return
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--workers", str(args.workers),
                               "--batches", args.batches, "--set", args.set]) for i in range(args.workers)]
    if args.pytest is not None:
        repo = HERE.parents[1]
        env = dict(os.environ, PYTHONPATH=f"/tmp/zoe_kernels_shim:{repo}:" + os.environ.get("PYTHONPATH", ""))
        with open(out / "decode_pytest.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                           "tests/kernels/test_csa_dual_scope.py",
                                           "tests/kernels/test_paged_dual_scope.py"]
                                          + (["-k", args.pytest] if args.pytest else []),
                                          cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()
    warm = "".join(Path(f"/tmp/decode_warm_{i}.log").read_text() for i in range(args.workers)
                   if Path(f"/tmp/decode_warm_{i}.log").exists())
    print(warm, f"compiles (and pytest) took {time.time() - t0:.0f} s", flush=True)
    sweep(out, batches)


if __name__ == "__main__":
    main()
