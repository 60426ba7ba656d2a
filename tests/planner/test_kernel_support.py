"""The planner neither picks nor ranks a variant whose zoe kernels cannot activate on its engine image, and says
why; zoe_cluster's copy of the plugin's support table is current and read without zoe_kernels or torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from zoe_cluster.kernel_support import DEFAULT_PATH, KernelSupport, image_engine
from zoe_cluster.planner import Demand, NoFeasibleVariant, plan
from zoe_cluster.recipes import RecipeRegistry

REG = RecipeRegistry.default()
GLM = REG.get("glm-5.3")
SUPPORT = KernelSupport.load()


def test_copy_of_the_plugins_support_table_is_current():
    from zoe_kernels.integrations.support import render

    assert DEFAULT_PATH.read_text() == render(), (
        f"{DEFAULT_PATH} is out of date: python -m zoe_kernels.integrations.support --write {DEFAULT_PATH}"
    )


def test_the_recipes_kernel_names_are_the_plugins():
    from zoe_cluster.recipes.schema import KERNEL_NAMES
    from zoe_kernels.integrations.support import KERNELS

    assert KERNEL_NAMES == KERNELS


def test_zoe_cluster_reads_the_table_without_zoe_kernels_or_torch():
    code = ("import sys; from zoe_cluster.planner import plan, Demand; from zoe_cluster.recipes import RecipeRegistry; "
            "plan(RecipeRegistry.default().get('glm-5.3'), Demand(1)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'zoe_kernels', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("image, release, platform", [
    ("vllm/vllm-openai-rocm:v0.29.0", "0.29.0", "rocm"),
    ("lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910", "0.5.19", "rocm"),
    ("vllm/vllm-openai-rocm:nightly-rocm100-9ea8f3ffc354901b740f0b31988900897b7221d7", None, "rocm"),
    ("vllm/vllm-openai:v0.32.1", "0.32.1", "cuda"),
    ("registry.local:5000/vllm-openai-rocm", None, "rocm"),
    ("lmsysorg/sglang:latest", None, "cuda"),
])  # fmt: skip
def test_engine_release_and_platform_come_from_the_image(image, release, platform):
    ie = image_engine(image)
    assert (ie.release, ie.platform) == (release, platform)


def test_the_recipes_kernel_variants_on_the_seeds_images_are_supported():
    for model in ("glm-5.3", "deepseek-v3.2", "deepseek-v4-pro"):
        r = REG.get(model)
        v = r.variant("fp8-tp8-zoe")
        assert v.kernels and SUPPORT.blockers(list(v.kernels), v.engine, v.image) is None, (model, v.image)


@pytest.mark.parametrize("kernels, engine, image, want", [
    (["lightning_indexer"], "vllm", "vllm/vllm-openai-rocm:v0.31.0",
     "kernel lightning_indexer not supported on vllm 0.31.0 (verified [0.29.0, 0.30.0), [0.32.0, 0.33.0), "
     "[0.33.0, 0.34.0))"),
    (["fused_moe"], "vllm", "vllm/vllm-openai:v0.34.0", "kernel fused_moe not supported on vllm 0.34.0"),
    (["csa_dual_scope"], "sglang", "lmsysorg/sglang:v0.5.19-cu129",
     "kernel csa_dual_scope not supported on sglang 0.5.19 (verified [0.5.23, 0.5.24)): SGLang 0.5.19 has no"),
    (["csa_topk"], "vllm", "vllm/vllm-openai-rocm:v0.29.0", "kernel csa_topk has no vllm integration on rocm"),
])  # fmt: skip
def test_why_a_kernel_cannot_activate(kernels, engine, image, want):
    assert want in SUPPORT.blockers(kernels, engine, image)


def test_vllm_0_33_images_can_run_both_vllm_kernels():
    for image in ("vllm/vllm-openai:v0.33.0", "vllm/vllm-openai-rocm:v0.33.0"):
        assert SUPPORT.blockers(["fused_moe", "lightning_indexer"], "vllm", image) is None, image


def test_a_variant_outside_the_verified_releases_is_dropped_and_the_error_says_why():
    narrow = KernelSupport({"fused_moe": {"vllm": {"rocm": [("0.32.0", "0.33.0")]}},
                            "lightning_indexer": {"vllm": {"rocm": [("0.32.0", "0.33.0")]}}})  # fmt: skip
    with pytest.raises(NoFeasibleVariant) as e:  # only the indexer variant serves 256K contexts
        plan(GLM, Demand(concurrency=1, context_tokens=262144), narrow)
    assert ("fp8-tp8-zoe: kernel fused_moe not supported on vllm 0.29.0 (verified [0.32.0, 0.33.0)); "
            "kernel lightning_indexer not supported on vllm 0.29.0") in str(e.value)
    p = plan(GLM, Demand(concurrency=1), narrow)
    zoe = next(c for c in p.alternatives if c.variant == "fp8-tp8-zoe")
    assert zoe.kernels_blocked and zoe.decode_tok_s_per_node is None and p.variant != "fp8-tp8-zoe"


def test_a_broken_table_names_its_file(tmp_path):
    bad = tmp_path / "kernel_support.json"
    bad.write_text(json.dumps({"gaps": []}))
    with pytest.raises(ValueError, match=f"{bad}: not a kernel support table"):
        KernelSupport.load(bad)


def test_cli_plan_shows_why_a_kernel_variant_is_not_ranked():
    out = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "plan", "glm-5.3", "-c", "1", "--json"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    fused = next(c for c in d["alternatives"] if c["variant"] == "fp8-tp8-fused-moe")
    assert fused["eligible"] is False and fused["kernels_blocked"] and "names no vllm release" in fused["why"]


def test_cli_deploy_of_a_named_kernel_variant_warns_before_it_starts():
    """`zoe deploy --variant` deploys what was asked, saying first that its kernels would fall back (the bogus
    cluster address then ends the command: no Ray is needed to see the warning)."""
    env = {**os.environ, "COLUMNS": "400"}
    out = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "deploy", "glm-5.3", "--variant",
                          "fp8-tp8-fused-moe", "--address", "127.0.0.1:1"], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    text = " ".join((out.stdout + out.stderr).split())
    assert "warning: fp8-tp8-fused-moe: kernel fused_moe: image vllm/vllm-openai-rocm:nightly" in text
    assert "the engine serves on its own kernels" in text
