"""The planner agrees with the seed tables it cites (seed table A8 for GLM-5.3's FP8 vs MXFP4 choice)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zoe_cluster.planner import Demand, NoFeasibleVariant, plan
from zoe_cluster.recipes import RecipeRegistry

REG = RecipeRegistry.default()
GLM = REG.get("glm-5.3")


def test_low_concurrency_chooses_fp8_among_variants_whose_kernels_can_run():
    p = plan(GLM, Demand(concurrency=1))
    assert (p.variant, p.quantization, p.tp) == ("fp8-tp8-nightly", "fp8", 8)
    assert p.predicted_decode_tok_s_per_node == 62.4
    mx = next(c for c in p.alternatives if c.variant == "mxfp4-tp8")
    assert mx.decode_tok_s_per_node == 52.2
    assert "seed table A8" in p.reason
    # the fused-MoE variant measured 64.6 (seed table A8) on a nightly image whose tag names no vLLM release
    fused = next(c for c in p.alternatives if c.variant == "fp8-tp8-fused-moe")
    assert not fused.eligible and fused.kernels_blocked and fused.decode_tok_s_per_node is None
    assert "names no vllm release" in fused.why and "not ranked: fp8-tp8-fused-moe: kernel fused_moe" in p.reason


def test_high_concurrency_chooses_mxfp4_and_says_by_how_much():
    p = plan(GLM, Demand(concurrency=32))
    assert p.variant == "mxfp4-tp8" and p.predicted_decode_tok_s_per_node == 1338.7
    assert "fp8-tp8-zoe at 1267.9" in p.reason and "+5.6% faster" in p.reason


@pytest.mark.parametrize("c", [1, 2, 4, 8, 16, 24, 32, 48, 64, 128])
def test_tp4_dp2_is_never_chosen_for_glm(c):
    assert plan(GLM, Demand(concurrency=c)).variant != "mxfp4-tp4-dp2"


def test_long_context_needs_the_indexer_variant():
    p = plan(GLM, Demand(concurrency=1, context_tokens=262144))
    assert p.variant == "fp8-tp8-zoe" and "lightning_indexer" in p.kernels
    assert p.predicted_ttft_s == pytest.approx(20.772)  # seed table A5, ZOE, 256K, no hit


def test_more_nodes_means_more_replicas_and_less_load_each():
    p = plan(GLM, Demand(concurrency=64, nodes=4))
    assert p.replicas == 4 and p.concurrency_per_replica == 16


def test_speculative_variants_only_when_asked_or_the_only_kind():
    assert plan(GLM, Demand(concurrency=1, speculative=True)).speculative == "mtp"
    assert plan(REG.get("kimi-k3"), Demand(concurrency=4)).variant == "mxfp4-tp8-dspark"


def test_kv_that_does_not_fit_is_rejected_with_numbers():
    with pytest.raises(NoFeasibleVariant, match="exceeds the replica's KV capacity"):
        plan(REG.get("deepseek-v3.2"), Demand(concurrency=5000, context_tokens=160000))


def test_bad_demand_is_rejected():
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        Demand(concurrency=0)


def _zoe(*args):
    return subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *args], capture_output=True, text=True)


def test_cli_plan_json_has_the_documented_fields():
    out = _zoe("plan", "glm-5.3", "--concurrency", "32", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("model", "variant", "quantization", "tp", "dp", "replicas", "predicted_decode_tok_s_per_node", "reason"):
        assert key in d
    assert d["variant"] == "mxfp4-tp8" and d["quantization"] == "mxfp4" and d["tp"] == 8 and d["dp"] == 1


def test_cli_plan_unknown_model_lists_known_and_fails():
    out = _zoe("plan", "gpt-9", "--concurrency", "1")
    assert out.returncode != 0 and "glm-5.3" in out.stderr and "unknown model 'gpt-9'" in out.stderr
