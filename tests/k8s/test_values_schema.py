"""The chart's enumerations (values.schema.json, templates/_recipes.tpl) are generated from the recipes and the
routing policy registry; the committed files must be what the generator writes today."""

from __future__ import annotations

import json
import shutil

import pytest

from zoe_cluster.k8s import values_schema as vs
from zoe_cluster.recipes import RecipeRegistry


def test_the_committed_schema_and_recipe_map_are_up_to_date():
    stale = vs.stale_files(vs.expected_files(vs.CHART, *vs._inputs()))
    assert not stale, "\n".join(f"{p} is out of date with the recipes or the routing policies; regenerate it with "
                                f"`{vs.REGENERATE}`" for p in stale)


def test_the_schema_enumerates_models_variants_engines_and_policies():
    schema = json.loads((vs.CHART / vs.SCHEMA_FILE).read_text())
    model = schema["properties"]["model"]
    recipes = RecipeRegistry.default().all()
    assert model["properties"]["name"]["enum"] == sorted(r.name for r in recipes)
    kimi = next(rule["then"] for rule in model["allOf"] if rule["if"]["properties"]["name"]["const"] == "kimi-k3")
    assert kimi["properties"]["variant"]["enum"] == ["", "mxfp4-tp8-dspark"]
    assert kimi["properties"]["engine"]["enum"] == ["", "sim", "sglang"]
    assert schema["properties"]["router"]["properties"]["policy"]["enum"] == ["prefix", "least_load", "round_robin", "session_hash", "slo"]


@pytest.fixture
def chart_copy(tmp_path):
    out = tmp_path / "zoe"
    (out / "templates").mkdir(parents=True)
    for name in (vs.SCHEMA_FILE, vs.RECIPES_TEMPLATE):
        shutil.copy(vs.CHART / name, out / name)
    return out


def test_a_new_variant_makes_the_check_fail_naming_the_files_and_the_command(chart_copy, monkeypatch, capsys):
    recipes, policies, engines, images = vs._inputs()
    glm = next(r for r in recipes if r.name == "glm-5.3")
    grown = glm.model_copy(update={"variants": {**glm.variants, "fp8-tp16": glm.variants["fp8-tp8"]}})
    monkeypatch.setattr(vs, "_inputs", lambda: ([grown if r is glm else r for r in recipes], policies, engines, images))
    assert vs.main(["--check", "--chart", str(chart_copy)]) == 1
    err = capsys.readouterr().err
    for name in (vs.SCHEMA_FILE, vs.RECIPES_TEMPLATE):
        assert f"{chart_copy / name} is out of date" in err and vs.REGENERATE in err
    assert vs.main(["--write", "--chart", str(chart_copy)]) == 0
    assert vs.main(["--check", "--chart", str(chart_copy)]) == 0
    schema = json.loads((chart_copy / vs.SCHEMA_FILE).read_text())
    assert "fp8-tp16" in schema["properties"]["model"]["properties"]["variant"]["enum"]
    assert '"fp8-tp16": {"engine": "vllm", "gpus": 8, "image": "zoe-vllm-rocm"}' in (chart_copy / vs.RECIPES_TEMPLATE).read_text()


def test_a_hand_edit_of_a_generated_part_fails_the_check(chart_copy):
    schema = json.loads((chart_copy / vs.SCHEMA_FILE).read_text())
    schema["properties"]["router"]["properties"]["policy"]["enum"].append("magic")
    (chart_copy / vs.SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")
    assert vs.stale_files(vs.expected_files(chart_copy, *vs._inputs())) == [chart_copy / vs.SCHEMA_FILE]


def test_each_variant_runs_in_the_worker_image_built_from_its_recipe_image():
    """glm-5.3's nightly-image variants run in zoe-vllm-rocm-nightly, the others in zoe-vllm-rocm (docker/images.yaml
    matched by `base`); the schema keys the repositories and per-image node counts by those names."""
    recipes, _, _, images = vs._inputs()
    workers = vs.worker_images(images)
    assert sorted(workers) == ["zoe-sglang-rocm", "zoe-vllm-rocm", "zoe-vllm-rocm-nightly"]  # not the zoe image
    glm = vs.recipe_variants(recipes, workers)["glm-5.3"]
    for name, v in next(r for r in recipes if r.name == "glm-5.3").variants.items():
        assert glm[name]["image"] == ("zoe-vllm-rocm-nightly" if v.image == images["zoe-vllm-rocm-nightly"]["base"]
                                      else "zoe-vllm-rocm"), name
    assert {n for n, v in glm.items() if v["image"] == "zoe-vllm-rocm-nightly"} == {
        "fp8-tp8-nightly", "fp8-tp8-fused-moe", "mxfp4-tp8", "mxfp4-tp4-dp2"}
    worker = json.loads((vs.CHART / vs.SCHEMA_FILE).read_text())["properties"]["rayCluster"]["properties"]["worker"]
    assert list(worker["properties"]["image"]["properties"]["repositories"]["properties"]) == sorted(workers)


def test_a_variant_whose_image_has_no_entry_fails_generation_naming_the_recipe_and_variant(chart_copy, monkeypatch,
                                                                                          capsys):
    recipes, policies, engines, images = vs._inputs()
    without = {k: v for k, v in images.items() if k != "zoe-vllm-rocm-nightly"}
    monkeypatch.setattr(vs, "_inputs", lambda: (recipes, policies, engines, without))
    assert vs.main(["--check", "--chart", str(chart_copy)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("recipes/glm-5.3.yaml: variants.fp8-tp8-nightly.image "
                          "vllm/vllm-openai-rocm:nightly-rocm100-9ea8f3ffc354901b740f0b31988900897b7221d7 (vllm): no "
                          "worker image is built FROM it in docker/images.yaml"), err
    assert vs.main(["--write", "--chart", str(chart_copy)]) == 1  # and nothing is written
