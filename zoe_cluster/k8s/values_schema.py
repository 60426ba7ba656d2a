"""The Helm chart's knowledge of the recipes and the router, generated from them so that a list is written once.

Two files of helm/zoe are (partly) generated here:

- `values.schema.json`: the hand-written schema of every value, with the parts that enumerate what zoe knows
  replaced: `model.name` (the recipes), `model.variant` and `switching.candidates` (each model's variants, one
  `if`/`then` per model), `model.engine` (the engine adapters' names, and per model the engines its variants run
  on) and `router.policy` (the routing policy registry). `helm install` then refuses `model: llama-99` or
  `router.policy: magic` before anything runs.
- `templates/_recipes.tpl`: `zoe.recipes`, each model's variants with the engine each runs on and the GPUs one
  replica takes, which the templates read to pick the worker image by engine, to refuse an image of the other
  engine, and to declare GPUs on the head for simulated replicas.

    python -m zoe_cluster.k8s.values_schema --write    # after changing recipes or policies
    python -m zoe_cluster.k8s.values_schema --check    # what CI runs (tests/k8s/test_values_schema.py)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zoe_cluster.recipes import Recipe, RecipeRegistry

CHART = Path(__file__).resolve().parents[2] / "helm" / "zoe"
SCHEMA_FILE = "values.schema.json"
RECIPES_TEMPLATE = "templates/_recipes.tpl"
REGENERATE = "python -m zoe_cluster.k8s.values_schema --write"
GENERATED = f"generated from the recipes and the routing policy registry by `{REGENERATE}`; do not edit"


def recipe_variants(recipes: list[Recipe]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> variant -> {engine, gpus (one replica's)}, for every recipe."""
    return {r.name: {name: {"engine": v.engine, "gpus": v.parallelism.gpus} for name, v in r.variants.items()}
            for r in recipes}


def _per_model(recipes: list[Recipe], condition: Any, then: Any) -> list[dict[str, Any]]:
    """One `if model is X then ...` rule per recipe; `condition(name)` and `then(recipe)` build each half."""
    return [{"if": condition(r.name), "then": then(r)} for r in recipes]


def generated_schema(base: dict[str, Any], recipes: list[Recipe], policies: list[str], engines: list[str]) -> dict[str, Any]:
    """`base` (the committed schema) with every generated part replaced from `recipes`, `policies`, `engines`."""
    schema = json.loads(json.dumps(base))  # a deep copy; the base stays as it was
    recipes = sorted(recipes, key=lambda r: r.name)
    model = schema["properties"]["model"]
    props = model["properties"]
    props["name"] = {
        "type": "string", "description": "Recipe to serve.", "$comment": GENERATED,
        "enum": [r.name for r in recipes],
    }
    props["variant"] = {
        "type": "string", "description": "Recipe variant; empty lets the planner choose.", "$comment": GENERATED,
        "enum": [""] + sorted({v for r in recipes for v in r.variants}),
    }
    props["engine"] = {
        "type": "string", "description": "Engine override; empty means the variant's engine.", "$comment": GENERATED,
        "enum": [""] + list(engines),
    }
    model["allOf"] = _per_model(
        recipes,
        lambda name: {"properties": {"name": {"const": name}}},
        lambda r: {"properties": {
            "variant": {"enum": [""] + sorted(r.variants)},
            # the simulated engine serves any variant; a GPU engine only the variants that run on it
            "engine": {"enum": ["", "sim"] + sorted({v.engine for v in r.variants.values()})},
        }},
    )
    schema["properties"]["router"]["properties"]["policy"] = {
        "type": "string", "description": "Routing policy name.", "$comment": GENERATED, "enum": list(policies),
    }
    schema["allOf"] = _per_model(
        recipes,
        lambda name: {"properties": {"model": {"properties": {"name": {"const": name}}}}},
        lambda r: {"properties": {"switching": {"properties": {"candidates": {"items": {"enum": sorted(r.variants)}}}}}},
    )
    return schema


def recipes_template(recipes: list[Recipe]) -> str:
    """templates/_recipes.tpl: `zoe.recipes` as JSON (model -> variant -> {engine, gpus}) for
    `include ... | fromJson`."""
    data = json.dumps(recipe_variants(sorted(recipes, key=lambda r: r.name)), sort_keys=True)
    return (f"{{{{/* Each model's variants, the engine each runs on and one replica's GPUs: {GENERATED}. */}}}}\n"
            f'{{{{- define "zoe.recipes" -}}}}\n{data}\n{{{{- end -}}}}\n')


def expected_files(chart: Path, recipes: list[Recipe], policies: list[str], engines: list[str]) -> dict[Path, str]:
    """Path -> the text it should have, from the chart's committed schema and the current recipes and policies."""
    base = json.loads((chart / SCHEMA_FILE).read_text())
    schema = generated_schema(base, recipes, policies, engines)
    return {chart / SCHEMA_FILE: json.dumps(schema, indent=2, ensure_ascii=False) + "\n",
            chart / RECIPES_TEMPLATE: recipes_template(recipes)}


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """The files whose text differs from what is expected (missing ones included)."""
    return [p for p, text in expected.items() if not p.exists() or p.read_text() != text]


def _inputs() -> tuple[list[Recipe], list[str], list[str]]:
    from zoe_cluster.engines import ENGINE_NAMES
    from zoe_cluster.routing import policy_names

    return RecipeRegistry.default().all(), policy_names(), list(ENGINE_NAMES)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoe_cluster.k8s.values_schema", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="Rewrite the generated files.")
    mode.add_argument("--check", action="store_true", help="Exit 1 naming each file that is out of date.")
    p.add_argument("--chart", type=Path, default=CHART, help=f"The chart folder (default: {CHART}).")
    args = p.parse_args(argv)
    expected = expected_files(args.chart, *_inputs())
    stale = stale_files(expected)
    if args.check:
        for path in stale:
            print(f"{path} is out of date with the recipes or the routing policies; regenerate it with "
                  f"`{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
