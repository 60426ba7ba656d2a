"""Runs under a vLLM test environment's python: loads the zoe vLLM plugin in one of a few set-ups, prints JSON.

    python _vllm_probe.py ok|fake_version|bad_signature|other_backend|indexer|moe_finish|aiter|entry_point REPORT_DIR
"""

from __future__ import annotations

import json
import os
import sys

mode, report_dir = sys.argv[1], sys.argv[2]
os.environ["ZOE_KERNELS_REPORT_DIR"] = report_dir
os.environ["ZOE_KERNELS"] = "fused_moe,lightning_indexer"

if mode == "entry_point":  # vLLM's own plugin loader runs zoe's entry point
    from vllm.plugins import load_general_plugins

    from zoe_kernels.integrations.report import read_reports

    load_general_plugins()
    print(json.dumps({"reports": [r.__dict__ for r in read_reports(report_dir)]}))
    sys.exit(0)

if mode == "aiter":  # vLLM read the AITER switches (and cached vllm.envs) before the plugin runs
    import vllm.envs as envs
    from vllm._aiter_ops import rocm_aiter_ops

    envs.enable_envs_cache()
    before = {"class": rocm_aiter_ops._FMOE_ENABLED, "envs": envs.VLLM_ROCM_USE_AITER_MOE}
    from zoe_kernels.integrations import vllm_plugin
    from zoe_kernels.integrations.report import KernelReporter

    rep = KernelReporter("vllm", "probe", ["fused_moe"], None)
    vllm_plugin.route_rocm_moe_to_triton(rep)
    after = {"class": rocm_aiter_ops._FMOE_ENABLED, "envs": envs.VLLM_ROCM_USE_AITER_MOE,
             "aiter": rocm_aiter_ops._AITER_ENABLED}  # fmt: skip
    print(json.dumps({"before": before, "after": after, "environ": os.environ.get("VLLM_ROCM_USE_AITER_MOE"),
                      "notes": rep.report.notes}))  # fmt: skip
    sys.exit(0)

import vllm  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts import cpu_moe  # noqa: E402

if mode == "fake_version":
    vllm.__version__ = "0.1.0"
elif mode == "bad_signature":

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation):  # an older vLLM's shape
        raise AssertionError("never called")

    cpu_moe.CPUUnquantizedExperts.apply = apply

from zoe_kernels.integrations import vllm_plugin  # noqa: E402
from zoe_kernels.integrations.report import read_reports  # noqa: E402

vllm_plugin.register()
reports = [r.__dict__ for r in read_reports(report_dir)]
patched_apply = hasattr(cpu_moe.CPUUnquantizedExperts.apply, "__zoe_original__")
print(json.dumps({"reports": reports, "apply_patched": patched_apply}))

if mode == "other_backend":  # vLLM building its MoE with a class zoe did not patch must be reported, not ignored
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig

    class OtherExperts(mk.FusedMoEExpertsModular):  # e.g. DeepGEMM's or FlashInfer's experts
        @staticmethod
        def activation_format():
            return mk.FusedMoEActivationFormat.Standard

    OtherExperts.__abstractmethods__ = frozenset()
    import types

    moe_config = types.SimpleNamespace(swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None,
                                       activation_situ_beta=None, activation_situ_linear_beta=None)
    OtherExperts(moe_config, FusedMoEQuantConfig.make())
    reports = [r.__dict__ for r in read_reports(report_dir)]
    print(json.dumps({"reports": reports, "apply_patched": patched_apply}))

if mode == "indexer":  # the CUDA lightning-indexer patches, run on the CPU through Triton's interpreter
    import torch

    from zoe_kernels.integrations.patching import install_kernel
    from zoe_kernels.integrations.report import KernelReporter
    from zoe_kernels.integrations.vllm_indexer import lightning_indexer_specs
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers import sparse_attn_indexer as sai
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_mqa_logits_torch  # vLLM's own reference

    rep = KernelReporter("vllm", vllm.__version__, ["lightning_indexer"], None)
    ok = install_kernel("lightning_indexer", lightning_indexer_specs("cuda", rep), "vllm", vllm.__version__, rep)
    torch.manual_seed(0)
    m, h, d, n, topk = 6, 32, 128, 70, 16
    q = (torch.randn(m, h, d) * 0.5).to(torch.float8_e4m3fn)
    k = (torch.randn(n, d) * 0.5).to(torch.float8_e4m3fn)
    k_scale = torch.rand(n, 1) + 0.5
    weights = torch.randn(m, h)
    ks = torch.tensor([0, 0, 10, 10, 30, 60], dtype=torch.int32)
    ke = torch.tensor([5, 12, 40, 41, 70, 62], dtype=torch.int32)
    want = fp8_mqa_logits_torch(q, (k, k_scale), weights, ks, ke)
    inside = torch.isfinite(want)
    import inspect

    compressed = "max_seqlen_k" in inspect.signature(sai.fp8_fp4_mqa_logits).parameters  # vLLM 0.33
    if compressed:  # row i holds keys ks[i] .. ke[i]-1 from column 0, as vLLM 0.33's indexer reads them
        width = int((ke - ks).max())
        got = sai.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, width)
        cols = torch.arange(width)
        in_row = cols[None, :] < (ke - ks)[:, None]
        full = torch.full((m, n), float("-inf"))
        rows_idx, cols_idx = in_row.nonzero(as_tuple=True)
        full[rows_idx, ks[rows_idx].long() + cols_idx] = got[rows_idx, cols_idx]
        got_full, starts, ends = full, torch.zeros_like(ks), ke - ks
    else:
        got = got_full = sai.fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, clean_logits=False)
        starts, ends = ks, ke
    logits_err = ((got_full - want).abs()[inside].max() / want[inside].abs().max()).item()
    out = torch.full((m, topk), -7, dtype=torch.int32)
    ops.top_k_per_row_prefill(got, starts, ends, out, m, got.stride(0), got.stride(1), topk)
    topk_ok = True
    for i in range(m):  # positions relative to ks, -1 padded, the set torch.topk picks
        width = int(ke[i] - ks[i])
        sel = torch.topk(want[i, ks[i] : ke[i]], min(topk, width)).indices.sort().values.tolist()
        row = sorted(x for x in out[i].tolist() if x >= 0)
        topk_ok &= row == sel and out[i].tolist().count(-1) == topk - len(sel)
    # the ROCm patch, called through the module attribute the way rocm_aiter_mla_sparse's indexer calls it
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rams

    rocm_rep = KernelReporter("vllm", vllm.__version__, ["lightning_indexer"], None)
    rocm_ok = install_kernel("lightning_indexer", lightning_indexer_specs("rocm", rocm_rep), "vllm", vllm.__version__,
                             rocm_rep)  # fmt: skip
    rocm_got = rams.rocm_fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)
    rocm_err = ((rocm_got - want).abs()[inside].max() / want[inside].abs().max()).item()
    print(json.dumps({"installed": ok, "compressed": compressed,
                      "outside_inf": bool(torch.isinf(got_full[~inside]).all()),
                      "logits_rel_err": logits_err, "topk_ok": topk_ok, "calls": rep.report.calls,
                      "rocm_installed": rocm_ok, "rocm_rel_err": rocm_err, "rocm_calls": rocm_rep.report.calls}))

if mode == "moe_finish":  # TritonExperts.apply patched on the GPU path, run through Triton's interpreter on the CPU
    import types

    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    from zoe_kernels.integrations.patching import install_kernel
    from zoe_kernels.integrations.report import KernelReporter
    from zoe_kernels.integrations.vllm_moe import fused_moe_specs
    from zoe_kernels.moe.reference import fused_moe_reference

    rep = KernelReporter("vllm", vllm.__version__, ["fused_moe"], None)
    ok = install_kernel("fused_moe", fused_moe_specs("cuda", rep), "vllm", vllm.__version__, rep, "cuda")
    torch.manual_seed(0)
    m, h, i, e, k = 3, 128, 64, 4, 2
    x = torch.randn(m, h)
    w13, w2 = torch.randn(e, 2 * i, h) / h**0.5, torch.randn(e, h, i) / i**0.5
    topk_w = torch.rand(m, k)
    topk_ids = torch.tensor([[0, 2], [3, 1], [2, 0]], dtype=torch.int32)
    want = fused_moe_reference(x, w13, w2, topk_w, topk_ids)
    want_rows = torch.stack([fused_moe_reference(x, w13, w2, torch.ones(m, 1), topk_ids[:, s : s + 1])
                             for s in range(k)], dim=1)  # fmt: skip  unweighted [M, k, H]
    moe_config = types.SimpleNamespace(in_dtype=torch.float32, swiglu_limit=None, swiglu_alpha=None,
                                       swiglu_beta=None, activation_situ_beta=None,
                                       activation_situ_linear_beta=None)  # fmt: skip

    def run(experts) -> torch.Tensor:
        out = torch.full((m, h), float("nan"))
        experts.apply(out, x, w13, w2, topk_w, topk_ids, MoEActivation.SILU, e, None, None, None, None, None, None,
                      False)  # fmt: skip
        return out

    def err(got, ref) -> float:
        return ((got - ref).abs().max() / ref.abs().max()).item()

    result = {"installed": ok, "fallbacks": [f["reason"] for f in rep.report.fallbacks]}
    result["plain_err"] = err(run(TritonExperts(moe_config, FusedMoEQuantConfig.make())), want)
    if hasattr(TritonExperts, "post_gemm2_hook"):  # vLLM 0.33: the ways apply can finish other than its own sum
        seen = {}

        def hook(unfinalized, out):  # weights and sums the rows, as a fused consumer would
            seen.update(route_major=unfinalized.route_major, shape=list(unfinalized.gemm2_permuted.shape),
                        rows_err=err(unfinalized.gemm2_permuted.view(m, k, h), want_rows),
                        map_ok=unfinalized.expanded_idx_to_permuted_idx.tolist() == [[0, 1], [2, 3], [4, 5]])
            rows = unfinalized.gemm2_permuted.view(m, k, h) * unfinalized.expert_weights.unsqueeze(-1)
            out.copy_(rows.sum(1))

        hooked = TritonExperts(moe_config, FusedMoEQuantConfig.make())
        hooked.post_gemm2_hook = hook
        result["hook_err"] = err(run(hooked), want)
        result["hook_seen"] = seen

        class ParkingExperts(TritonExperts):  # a subclass that keeps the unweighted rows (as MuseSpark's does)
            def _apply_router_weight_in_gemm2(self, apply_router_weight_on_input):
                return False

            def _finalize_expert_output(self, expert_output, output, topk_ids=None, expert_map=None):
                self.parked = expert_output.clone()

        parking = ParkingExperts(moe_config, FusedMoEQuantConfig.make())
        untouched = run(parking)
        result["parked_err"] = err(parking.parked.view(m, k, h), want_rows)
        result["parked_output_untouched"] = bool(untouched.isnan().all())
    result["calls"] = rep.report.calls
    print(json.dumps(result))
