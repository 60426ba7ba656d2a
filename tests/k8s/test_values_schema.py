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
    assert schema["properties"]["router"]["properties"]["policy"]["enum"] == ["prefix", "least_load", "round_robin", "slo"]


@pytest.fixture
def chart_copy(tmp_path):
    out = tmp_path / "zoe"
    (out / "templates").mkdir(parents=True)
    for name in (vs.SCHEMA_FILE, vs.RECIPES_TEMPLATE):
        shutil.copy(vs.CHART / name, out / name)
    return out


def test_a_new_variant_makes_the_check_fail_naming_the_files_and_the_command(chart_copy, monkeypatch, capsys):
    recipes, policies, engines = vs._inputs()
    glm = next(r for r in recipes if r.name == "glm-5.3")
    grown = glm.model_copy(update={"variants": {**glm.variants, "fp8-tp16": glm.variants["fp8-tp8"]}})
    monkeypatch.setattr(vs, "_inputs", lambda: ([grown if r is glm else r for r in recipes], policies, engines))
    assert vs.main(["--check", "--chart", str(chart_copy)]) == 1
    err = capsys.readouterr().err
    for name in (vs.SCHEMA_FILE, vs.RECIPES_TEMPLATE):
        assert f"{chart_copy / name} is out of date" in err and vs.REGENERATE in err
    assert vs.main(["--write", "--chart", str(chart_copy)]) == 0
    assert vs.main(["--check", "--chart", str(chart_copy)]) == 0
    schema = json.loads((chart_copy / vs.SCHEMA_FILE).read_text())
    assert "fp8-tp16" in schema["properties"]["model"]["properties"]["variant"]["enum"]
    assert '"fp8-tp16": {"engine": "vllm", "gpus": 8}' in (chart_copy / vs.RECIPES_TEMPLATE).read_text()


def test_a_hand_edit_of_a_generated_part_fails_the_check(chart_copy):
    schema = json.loads((chart_copy / vs.SCHEMA_FILE).read_text())
    schema["properties"]["router"]["properties"]["policy"]["enum"].append("magic")
    (chart_copy / vs.SCHEMA_FILE).write_text(json.dumps(schema, indent=2) + "\n")
    assert vs.stale_files(vs.expected_files(chart_copy, *vs._inputs())) == [chart_copy / vs.SCHEMA_FILE]
