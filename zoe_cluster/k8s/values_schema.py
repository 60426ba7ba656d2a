"""The Helm chart's knowledge of the recipes and the router, generated from them so that a list is written once.

Two files of helm/zoe are (partly) generated here, from the recipes, docker/images.yaml (the images zoe ships) and
the routing policy registry:

- `values.schema.json`: the hand-written schema of every value, with the parts that enumerate what zoe knows
  replaced: `model.name` (the recipes), `model.variant` and `switching.candidates` (each model's variants, one
  `if`/`then` per model), `model.engine` (the engine adapters' names, and per model the engines its variants run
  on), `router.policy` (the routing policy registry), and `rayCluster.worker.image.repositories` /
  `rayCluster.worker.replicasByImage` (keyed by the worker images of docker/images.yaml). `helm install` then
  refuses `model: llama-99` or `router.policy: magic` before anything runs.
- `templates/_recipes.tpl`: `zoe.recipes`, each model's variants with the engine each runs on, the GPUs one
  replica takes and the worker image it runs in (the images.yaml entry built FROM the variant's recipe `image`),
  and `zoe.workerImages`, each worker image's engine and base. The templates read them to render one worker
  group per worker image the deployment can use, to refuse a repository named for another image, and to declare
  GPUs on the head for simulated replicas.

    python -m zoe_cluster.k8s.values_schema --write    # after changing recipes or policies
    python -m zoe_cluster.k8s.values_schema --check    # what CI runs (tests/k8s/test_values_schema.py)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from zoe_cluster.engines import get_adapter
from zoe_cluster.recipes import Recipe, RecipeRegistry

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "zoe"
IMAGES_FILE = REPO / "docker" / "images.yaml"
SCHEMA_FILE = "values.schema.json"
RECIPES_TEMPLATE = "templates/_recipes.tpl"
REGENERATE = "python -m zoe_cluster.k8s.values_schema --write"
GENERATED = (f"generated from the recipes, docker/images.yaml and the routing policy registry by `{REGENERATE}`; "
             "do not edit")


class GenerationError(ValueError):
    """The recipes and docker/images.yaml disagree; the message names the file and the variant."""


def worker_images(images: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The worker images of docker/images.yaml's `images` (those with an engine): name -> {engine, base}."""
    return {name: {"engine": e["engine"], "base": e["base"]} for name, e in sorted(images.items()) if "engine" in e}


def variant_image(recipe: Recipe, variant: str, workers: dict[str, dict[str, str]]) -> str:
    """The worker image a variant runs in: the one built FROM the variant's recipe `image`, for its engine."""
    v = recipe.variants[variant]
    names = [n for n, w in workers.items() if w["base"] == v.image and w["engine"] == v.engine]
    if len(names) != 1:
        found = "no worker image is" if not names else f"worker images {', '.join(names)} are"
        raise GenerationError(
            f"recipes/{recipe.name}.yaml: variants.{variant}.image {v.image} ({v.engine}): {found} built FROM it in "
            f"{IMAGES_FILE.relative_to(REPO)}; a worker group runs one image, so each variant needs exactly one")
    return names[0]


def recipe_variants(recipes: list[Recipe],
                    workers: dict[str, dict[str, str]]) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> variant -> {engine, gpus (one replica's), image (the worker image's name)}, for every recipe."""
    return {r.name: {name: {"engine": v.engine, "gpus": v.parallelism.gpus, "image": variant_image(r, name, workers)}
                     for name, v in r.variants.items()}
            for r in recipes}


def _per_model(recipes: list[Recipe], condition: Any, then: Any) -> list[dict[str, Any]]:
    """One `if model is X then ...` rule per recipe; `condition(name)` and `then(recipe)` build each half."""
    return [{"if": condition(r.name), "then": then(r)} for r in recipes]


def generated_schema(base: dict[str, Any], recipes: list[Recipe], policies: list[str], engines: list[str],
                     workers: dict[str, dict[str, str]]) -> dict[str, Any]:
    """`base` (the committed schema) with every generated part replaced from `recipes`, `policies`, `engines` and
    the worker images `workers` (name -> {engine, base})."""
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
    simulated = [e for e in engines if get_adapter(e).is_simulated]
    model["allOf"] = _per_model(
        recipes,
        lambda name: {"properties": {"name": {"const": name}}},
        lambda r: {"properties": {
            "variant": {"enum": [""] + sorted(r.variants)},
            # the simulated engine serves any variant; a GPU engine only the variants that run on it
            "engine": {"enum": ["", *simulated] + sorted({v.engine for v in r.variants.values()})},
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
    worker = schema["properties"]["rayCluster"]["properties"]["worker"]["properties"]
    worker["image"]["properties"]["repositories"] = {
        "type": "object", "additionalProperties": False, "required": list(workers), "$comment": GENERATED,
        "description": "Repository of each worker image of docker/images.yaml, by image name.",
        "properties": {name: {"type": "string", "minLength": 1,
                              "description": f"Repository of {name} ({w['engine']}, FROM {w['base']})."}
                       for name, w in workers.items()},
    }
    worker["replicasByImage"] = {
        "type": "object", "$comment": GENERATED,
        "description": "Worker nodes of the group of each worker image (image name -> nodes); others get `replicas`.",
        # patternProperties, not propertyNames: Helm then names the key and its path when a name is unknown
        "patternProperties": {f"^({'|'.join(re.escape(n) for n in workers)})$": {"type": "integer", "minimum": 0}},
        "additionalProperties": False,
    }
    return schema


def recipes_template(recipes: list[Recipe], workers: dict[str, dict[str, str]]) -> str:
    """templates/_recipes.tpl: `zoe.recipes` (model -> variant -> {engine, gpus, image}) and `zoe.workerImages`
    (image name -> {engine, base}) as JSON for `include ... | fromJson`."""
    data = json.dumps(recipe_variants(sorted(recipes, key=lambda r: r.name), workers), sort_keys=True)
    images = json.dumps(workers, sort_keys=True)
    return (f"{{{{/* Each model's variants, the engine each runs on, one replica's GPUs and the worker image it runs "
            f"in: {GENERATED}. */}}}}\n"
            f'{{{{- define "zoe.recipes" -}}}}\n{data}\n{{{{- end -}}}}\n'
            f"{{{{/* The worker images of docker/images.yaml: their engine and the image each is built FROM. */}}}}\n"
            f'{{{{- define "zoe.workerImages" -}}}}\n{images}\n{{{{- end -}}}}\n')


def expected_files(chart: Path, recipes: list[Recipe], policies: list[str], engines: list[str],
                   images: dict[str, dict[str, Any]]) -> dict[Path, str]:
    """Path -> the text it should have, from the chart's committed schema, the current recipes and policies and
    docker/images.yaml's `images`."""
    workers = worker_images(images)
    base = json.loads((chart / SCHEMA_FILE).read_text())
    schema = generated_schema(base, recipes, policies, engines, workers)
    return {chart / SCHEMA_FILE: json.dumps(schema, indent=2, ensure_ascii=False) + "\n",
            chart / RECIPES_TEMPLATE: recipes_template(recipes, workers)}


def stale_files(expected: dict[Path, str]) -> list[Path]:
    """The files whose text differs from what is expected (missing ones included)."""
    return [p for p, text in expected.items() if not p.exists() or p.read_text() != text]


def _inputs() -> tuple[list[Recipe], list[str], list[str], dict[str, dict[str, Any]]]:
    from zoe_cluster.engines import ENGINE_NAMES
    from zoe_cluster.routing import policy_names

    images = yaml.safe_load(IMAGES_FILE.read_text())["images"]
    return RecipeRegistry.default().all(), policy_names(), list(ENGINE_NAMES), images


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoe_cluster.k8s.values_schema", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="Rewrite the generated files.")
    mode.add_argument("--check", action="store_true", help="Exit 1 naming each file that is out of date.")
    p.add_argument("--chart", type=Path, default=CHART, help=f"The chart folder (default: {CHART}).")
    args = p.parse_args(argv)
    try:
        expected = expected_files(args.chart, *_inputs())
    except GenerationError as e:
        print(e, file=sys.stderr)
        return 1
    stale = stale_files(expected)
    if args.check:
        for path in stale:
            print(f"{path} is out of date with the recipes, docker/images.yaml or the routing policies; "
                  f"regenerate it with `{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
