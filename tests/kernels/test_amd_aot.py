"""Every kernel compiles for MI355X (gfx950) and MI300X/MI325X (gfx942): `python -m zoe_kernels.aot --ci`.

The compile runs Triton's real HIP backend on this CPU (no GPU) over the representative cases of
`zoe_kernels.aot_cases.CI_CASES` (the full set, ~400 compiles, is `python -m zoe_kernels.aot`; its rows are committed
in bench/kernels/amd_aot.json). It runs in a subprocess: the other kernel tests import the kernels interpreted
(TRITON_INTERPRET=1), which cannot be compiled.
"""

import json
import os
import subprocess
import sys

import pytest

from zoe_kernels.platform import TARGETS, compile_for

pytestmark = [pytest.mark.kernels, pytest.mark.slow]

ARCHS = ("gfx950", "gfx942")
# fp4/fp8 element types of a dot's operands as the TTGIR prints them (tt.dot and tt.dot_scaled)
LOW_PRECISION = ("f8E4M3FN", "f8E4M3FNUZ", "f8E5M2", "e4m3", "e5m2", "e2m1")
# gfx950's native mxfp4 stage kernel (`grouped_gemm` FMT=5): e2m1 weights and MXFP8 activations through
# `tl.dot_scaled`, which must lower to the scaled f8f6f4 MFMAs
MXFP4_NATIVE = "FMT=5"


@pytest.fixture(scope="module")
def rows():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "zoe_kernels.aot", "--arch", ",".join(ARCHS), "--json", "--ci"],
                          capture_output=True, text=True, env=env, timeout=900)
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert out, f"no rows (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return out


def test_every_kernel_compiles_for_both_archs(rows):
    failed = [(r["arch"], r["kernel"], r["config"], r["error"]) for r in rows if r["ok"] is False]
    assert not failed, failed
    compiled = {(r["arch"], r["kernel"]) for r in rows if r["ok"]}
    for arch in ARCHS:  # every family is in the CI set, on both archs
        for kernel in ("moe.grouped_gemm._expert_gemm_kernel", "moe.gemv_4bit._gemv_4bit_kernel", "moe.gemv._gemv_kernel",
                       "moe.align._moe_align_kernel", "moe.act_quant._act_quant_fp8_kernel",
                       "moe.dequant._dequant_4bit_kernel",
                       "dsa.indexer._indexer_logits_keys_kernel", "csa.topk._split_filter_kernel",
                       "csa.topk._topk_row_kernel", "csa.radix_select._chunk_topk_kernel",
                       "csa.dual_scope_decode._dual_scope_partial_kernel", "csa.paged_dual_scope._paged_partial_kernel"):
            assert (arch, kernel) in compiled, (arch, kernel)
    # MXFP8 activation quantization runs where mxfp4 runs natively: gfx950 only
    assert ("gfx950", "moe.act_quant_mx._act_quant_mxfp8_kernel") in compiled
    assert ("gfx942", "moe.act_quant_mx._act_quant_mxfp8_kernel") not in compiled
    # the Hopper-only Gluon kernels are listed, not compiled
    na = [r for r in rows if r["ok"] is None]
    assert na and all("Gluon" in r["error"] for r in na)


def test_no_scratch_on_decode_paths_and_lds_within_the_arch(rows):
    for r in rows:
        if not r["ok"]:
            continue
        assert r["lds_bytes"] <= TARGETS[r["arch"]].lds_bytes, r
        assert r["waves_per_simd"] > 0, r
        if r["decode"]:  # no scratch (SGPR spills go to VGPR lanes, not memory: reported, allowed)
            assert (r["spill_bytes"], r["vgpr_spills"]) == (0, 0), (r["arch"], r["kernel"], r["config"], r["cases"])


def test_fp8_and_fp4_matrix_work_uses_f8f6f4_on_gfx950(rows):
    low = [r for r in rows if r["ok"] and r["arch"] == "gfx950"
           and any(t in LOW_PRECISION for t in r["dot_operands"])]
    assert low, "no fp8/fp4 dots compiled for gfx950"
    for r in low:
        assert r["mfma"] and all("f8f6f4" in m for m in r["mfma"]), (r["kernel"], r["config"], r["mfma"])
    # CDNA3 has no f8f6f4: its fp8 dots run the fp8_fp8 MFMAs (e4m3fnuz operands)
    gfx942 = [r for r in rows if r["ok"] and r["arch"] == "gfx942" and any(t in LOW_PRECISION for t in r["dot_operands"])]
    assert gfx942 and all(any("fp8" in m for m in r["mfma"]) for r in gfx942)
    # mxfp4 on gfx950: e2m1 weights x e4m3 activations, both scaled, in the scaled f8f6f4 MFMA
    mx = [r for r in rows if r["ok"] and r["arch"] == "gfx950" and MXFP4_NATIVE in r["config"]]
    assert mx, "no native mxfp4 stage compiled for gfx950"
    for r in mx:
        assert set(r["dot_operands"]) == {"e2m1", "e4m3"}, (r["config"], r["dot_operands"])
        assert r["mfma"] and all(m.startswith("v_mfma_scale_f32_") and m.endswith("_f8f6f4") for m in r["mfma"]), \
            (r["config"], r["mfma"])
    # gfx942 has no scaled MFMA: its mxfp4 stage decodes the weights in registers (FMT=3)
    assert not [r for r in rows if r["arch"] == "gfx942" and MXFP4_NATIVE in r["config"]]


def test_configurations_follow_the_target(rows):
    # the same call chooses differently on the two archs: a gated fp8 MoE stage takes 3 stages on gfx950 and 4 on
    # gfx942; dual-scope decode at B=128 takes TWO_PASS on gfx950 (e4m3fn keys) and on gfx942 the one-pass kernel
    # with 16-entry tiles, what its 64 KiB of LDS holds at three stages
    def configs(case, kernel, arch):
        return {r["config"] for r in rows if r["arch"] == arch and r["kernel"] == kernel and case in r.get("cases", [])}

    gemm = "moe.grouped_gemm._expert_gemm_kernel"
    gated = {arch: {c for c in configs("moe deepseek-v3.2 fp8 full M=16", gemm, arch) if "GATED=True" in c}
             for arch in ARCHS}
    assert all(len(c) == 1 for c in gated.values()), gated
    assert "num_stages=3" in gated["gfx950"].pop() and "num_stages=4" in gated["gfx942"].pop()
    case = "dual_scope deepseek-v4-pro B=128 H=64"
    assert configs(case, "csa.dual_scope_two_pass._scores_kernel", "gfx950")
    partial = configs(case, "csa.dual_scope_decode._dual_scope_partial_kernel", "gfx942")
    assert partial and all(" BKV=16 " in c for c in partial), partial


def test_moe_stages_follow_the_targets_lds():
    # fused MoE's pipeline depth: gfx942's 64 KiB of LDS (one tile fewer than the stages in LDS) cuts a bf16
    # prefill stage-1 tile (128 x 64 A + 64 x 128 gate and up weights: 48 KiB a stage) from 3 stages to 2; gfx950's
    # asynchronous copies hold all 3 in its 160 KiB; a gated fp8 stage takes at most 3 on gfx950 (Triton's
    # block-pingpong scheduler asserts at 4), 4 on gfx942 and the H200
    from zoe_kernels.moe.config import dot_m1_configs, stage_config

    def stages(arch, *args, **kw):
        with compile_for(TARGETS[arch]):
            return stage_config(*args, **kw)["num_stages"]

    prefill = (4096, 8, 256, 2048, 7168, "bf16")
    assert [stages(a, *prefill, gated=True) for a in ("sm_90", "gfx950", "gfx942")] == [3, 3, 2]
    decode = (16, 8, 256, 2048, 7168, "fp8")
    assert [stages(a, *decode, gated=True) for a in ("sm_90", "gfx950", "gfx942")] == [4, 3, 4]
    for arch, want in (("gfx950", 3), ("gfx942", 4)):
        with compile_for(TARGETS[arch]):
            assert dot_m1_configs(1, "fp8", 8, 2048)[0]["num_stages"] == want


def test_merge_replaces_the_rows_of_the_recompiled_cases():
    from zoe_kernels.aot_merge import merge_rows

    def row(arch, kernel, cases, vgprs=1):
        return {"arch": arch, "kernel": kernel, "config": "c", "cases": cases, "vgprs": vgprs}

    na = {"arch": "gfx950", "kernel": "g", "config": "", "ok": None}
    old = [row("gfx950", "moe.k", ["moe a", "moe b"]), row("gfx950", "topk.k", ["topk x"]), na,
           row("gfx942", "moe.k", ["moe a"], vgprs=3)]
    na_new = {"arch": "gfx950", "kernel": "g2", "config": "", "ok": None}  # a Gluon kernel added since
    new = [row("gfx950", "moe.k", ["moe a", "moe b"], vgprs=2), na, na_new]
    merged = merge_rows(old, new, "moe", ["gfx950"])
    assert sorted((r["arch"], r["kernel"], r.get("vgprs")) for r in merged) == [
        ("gfx942", "moe.k", 3), ("gfx950", "g", None), ("gfx950", "g2", None), ("gfx950", "moe.k", 2),
        ("gfx950", "topk.k", 1)]
    with pytest.raises(ValueError, match="serves cases in and out"):
        merge_rows([row("gfx950", "moe.k", ["moe a", "topk x"])], new, "moe", ["gfx950"])
