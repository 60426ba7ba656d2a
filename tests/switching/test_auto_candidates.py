"""`--switch auto` switches only among variants whose kernels can activate on their image: the caller passes
the blocked set (`KernelSupport.blocked_variants`) and `candidate_variants` leaves those out."""

from __future__ import annotations

import os
import subprocess
import sys

from zoe_cluster.kernel_support import KernelSupport
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.switching import ReplicaObservation, SwitchConfig, candidate_variants, decide

GLM = RecipeRegistry.default().get("glm-5.3")
NARROW = KernelSupport({"fused_moe": {"vllm": {"rocm": [("0.32.0", "0.33.0")]}}})
"""A table that verifies fused_moe on no release the GLM-5.3 recipe names."""


def test_blocked_variants_are_the_ones_the_planner_drops():
    blocked = NARROW.blocked_variants(GLM)
    assert {n for n, v in GLM.variants.items() if "fused_moe" in v.kernels} <= set(blocked)
    assert "fused_moe not supported on vllm 0.29.0" in blocked["fp8-tp8-zoe"]
    assert not any(n in blocked for n, v in GLM.variants.items() if not v.kernels)


def test_auto_candidates_leave_out_blocked_variants():
    everyone = candidate_variants(GLM, "mxfp4-tp8", SwitchConfig())
    blocked = NARROW.blocked_variants(GLM)
    auto = candidate_variants(GLM, "mxfp4-tp8", SwitchConfig(), blocked)
    assert "fp8-tp8-fused-moe" in everyone and "fp8-tp8-zoe" in everyone
    assert auto == [n for n in everyone if n not in blocked] and "fp8-tp8-nightly" in auto
    # named candidates are the operator's choice: the blocked set does not touch them
    named = SwitchConfig(candidates=["fp8-tp8-fused-moe", "mxfp4-tp8"])
    assert candidate_variants(GLM, "mxfp4-tp8", named, blocked) == ["fp8-tp8-fused-moe", "mxfp4-tp8"]


def test_at_low_load_the_switcher_picks_the_fastest_variant_that_can_run():
    """fp8-tp8-fused-moe is the fastest at concurrency 1 (64.6 tok/s, seed table A8), but its nightly image names
    no vLLM release the plugin was verified on, so auto switches to fp8-tp8-nightly (62.4 tok/s) instead."""
    fleet = [ReplicaObservation(i, "mxfp4-tp8", "ready", 1.0) for i in range(2)]
    assert decide(GLM, fleet, SwitchConfig(), now=0)[0].variant == "fp8-tp8-fused-moe"
    blocked = KernelSupport.load().blocked_variants(GLM)
    assert "names no vllm release" in blocked["fp8-tp8-fused-moe"]
    auto = SwitchConfig(candidates=candidate_variants(GLM, "mxfp4-tp8", SwitchConfig(), blocked))
    d = decide(GLM, fleet, auto, now=0)[0]
    assert d.action == "swap" and d.variant == "fp8-tp8-nightly" and d.predicted_tok_s_target == 62.4


def test_cli_switch_auto_says_what_it_leaves_out():
    """Resolved before the cluster is reached: the bogus address then ends the command."""
    out = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "deploy", "glm-5.3", "--switch", "auto",
                          "--address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "400"})  # fmt: skip
    text = " ".join((out.stdout + out.stderr).split())
    why = KernelSupport.load().blocked_variants(GLM)["fp8-tp8-fused-moe"]
    assert f"--switch auto leaves out fp8-tp8-fused-moe: {why}" in text
