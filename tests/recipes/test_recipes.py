"""Recipes load, carry their sources, and broken ones fail naming the file, the field path and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zoe_cluster.recipes import RecipeError, RecipeRegistry, UnknownModelError, load_recipe_file
from zoe_cluster.recipes.profile import decode_tok_s_per_node, kv_capacity_tokens, ttft_s

REG = RecipeRegistry.default()
GLM_YAML = REG.root / "glm-5.3.yaml"


def test_all_four_models_load():
    assert REG.names() == ["deepseek-v3.2", "deepseek-v4-pro", "glm-5.3", "kimi-k3"]
    for r in REG.all():
        assert r.default_variant in r.variants


def test_every_figure_has_a_seed_source_or_is_a_reasoned_estimate():
    def walk(node, path):
        if isinstance(node, dict):
            if "value" in node and "source" in node:
                if node.get("estimate"):
                    assert node.get("reasoning"), path
                else:
                    assert node["source"].startswith("seed"), f"{path}: measured figure without a seed source"
                return
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
    for path in REG.root.glob("*.yaml"):
        walk(yaml.safe_load(path.read_text()), path.name)


def test_glm_figures_match_seed_tables():
    glm = REG.get("glm-5.3")
    # seed table A8
    assert decode_tok_s_per_node(glm, "fp8-tp8-fused-moe", 1).value == 64.6
    assert decode_tok_s_per_node(glm, "mxfp4-tp8", 1).value == 52.2
    assert decode_tok_s_per_node(glm, "mxfp4-tp8", 32).value == 1338.7
    assert decode_tok_s_per_node(glm, "fp8-tp8-fused-moe", 32).value == 1322.4
    # seed table A5: 512K tokens, no hit 178.8 s baseline vs 64.6 s with ZOE; 11.8 s at 90%
    assert ttft_s(glm, "fp8-tp8", 524288, 0.0).value == pytest.approx(178.77)
    assert ttft_s(glm, "fp8-tp8-zoe", 524288, 0.0).value == pytest.approx(64.569)
    assert ttft_s(glm, "fp8-tp8-zoe", 524288, 0.9).value == pytest.approx(11.821)
    # weights: 756 GB FP8, 410 GB MXFP4 (seed, Quantization)
    assert glm.variant("fp8-tp8").weights.size_gb.value == 756
    assert glm.variant("mxfp4-tp8").weights.size_gb.value == 410
    # MXFP4 leaves more HBM for KV. GLM's latent KV is copied on every TP rank, so two TP4 engines hold more
    # tokens than one TP8 engine even though each keeps its own copy of the weights.
    assert kv_capacity_tokens(glm, "mxfp4-tp8") > kv_capacity_tokens(glm, "fp8-tp8")
    assert kv_capacity_tokens(glm, "mxfp4-tp4-dp2") > kv_capacity_tokens(glm, "mxfp4-tp8")


def test_profile_interpolation_is_monotone_between_points():
    glm = REG.get("glm-5.3")
    vals = [decode_tok_s_per_node(glm, "fp8-tp8", c).value for c in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)]
    assert vals == sorted(vals)
    ttfts = [ttft_s(glm, "fp8-tp8-zoe", L, 0.0).value for L in (8192, 20000, 65536, 300000, 524288)]
    assert ttfts == sorted(ttfts)
    assert ttft_s(glm, "fp8-tp8-zoe", 100000, 0.6).value < ttft_s(glm, "fp8-tp8-zoe", 100000, 0.3).value


def _write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(GLM_YAML.read_text())
    mutate(data)
    out = tmp_path / "glm-5.3.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize(
    "mutate, field, why",
    [
        (lambda d: d["variants"]["mxfp4-tp8"]["parallelism"].update(tp=3), "variants.mxfp4-tp8.parallelism",
         "must equal nodes*gpus_per_node"),
        (lambda d: d["variants"]["fp8-tp8"]["weights"].update(quantization="fp5"),
         "variants.fp8-tp8.weights.quantization", "Input should be"),
        (lambda d: d["variants"]["fp8-tp8"].update(kernels=["warp_drive"]), "variants.fp8-tp8.kernels[0]",
         "Input should be"),
        (lambda d: d["variants"]["fp8-tp8"]["profile"]["decode"][0]["tok_s_per_node"].update(estimate=True),
         "variants.fp8-tp8.profile.decode[0].tok_s_per_node", "reasoning"),
        (lambda d: d.update(default_variant="nope"), "<root>", "default_variant 'nope'"),
        (lambda d: d["variants"]["fp8-tp8"].update(engine="tgi"), "variants.fp8-tp8", "tag 'tgi'"),
        (lambda d: d["architecture"].pop("kv_bytes_per_token"), "architecture.kv_bytes_per_token", "Field required"),
        (lambda d: d["variants"]["fp8-tp8"].update(tool_call_parser="glm47 --evil"),
         "variants.fp8-tp8.tool_call_parser", "should match pattern"),
        (lambda d: d["variants"]["fp8-tp8"].update(trust_remote_code="sometimes"),
         "variants.fp8-tp8.trust_remote_code", "valid boolean"),
    ],
)
def test_broken_recipe_names_file_field_and_why(tmp_path, mutate, field, why):
    path = _write(tmp_path, mutate)
    with pytest.raises(RecipeError) as err:
        load_recipe_file(path)
    text = str(err.value)
    assert str(path) in text and field in text and why in text, text


def test_yaml_syntax_error_names_line(tmp_path):
    bad = tmp_path / "glm-5.3.yaml"
    bad.write_text("name: glm-5.3\nvariants: [unclosed\n")
    with pytest.raises(RecipeError, match=r"line \d+"):
        load_recipe_file(bad)


def test_unknown_model_lists_known_ones():
    with pytest.raises(UnknownModelError, match="known models: deepseek-v3.2, deepseek-v4-pro, glm-5.3, kimi-k3"):
        REG.get("llama-9")


def test_cli_validate_exits_nonzero_with_field(tmp_path):
    path = _write(tmp_path, lambda d: d["variants"]["fp8-tp8"].update(gpu_memory_utilization=1.5))
    ok = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "recipes", "validate", str(GLM_YAML)],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "recipes", "validate", str(path)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "variants.fp8-tp8.gpu_memory_utilization" in bad.stderr and "less than or equal to 1" in bad.stderr
