"""Rendering helpers for the chart tests: the real Helm engine (helm-python-sdk), CRD schemas, rendered docs."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "zoe"
VALUES_DIR = Path(__file__).parent / "values"
CRDS = REPO / "third_party" / "crds"
MONITORING = "monitoring.coreos.com/v1"


@lru_cache(maxsize=1)
def _chart():
    import helm_python

    helm_python.disable_logging()
    return helm_python.Chart.load(str(CHART))


def render(
    values: dict | None = None, api_versions: tuple[str, ...] = (), name: str = "zoe", namespace: str = "serving", revision: int = 1
) -> dict[str, str]:
    """Template path -> rendered text, as `helm template --api-versions ...` gives it."""
    from helm_python import _native

    # Chart.render() has no api_versions option; the native call underneath takes it (helm's --api-versions).
    opts = {"name": name, "namespace": namespace, "revision": revision, "is_install": revision == 1,
            "is_upgrade": revision > 1, "kube_version": "v1.33.0", "api_versions": list(api_versions)}
    chart = _chart()
    return json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts)))


def docs(values: dict | None = None, api_versions: tuple[str, ...] = (), **kw) -> list[dict[str, Any]]:
    """Every rendered Kubernetes object (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(render(values, api_versions, **kw).items()):
        if path.endswith("NOTES.txt"):
            continue
        out += [d for d in yaml.safe_load_all(text) if d]
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def values_file(name: str) -> dict[str, Any]:
    return yaml.safe_load((VALUES_DIR / name).read_text())


def _structural(schema: Any) -> Any:
    """A CRD's openAPIV3Schema as JSON Schema: `nullable` allows null, int-or-string allows both, and objects with
    declared properties reject unknown ones (the API server would prune them silently: a typo would vanish)."""
    if isinstance(schema, list):
        return [_structural(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    s = {k: _structural(v) for k, v in schema.items()}
    if s.pop("x-kubernetes-int-or-string", False):
        s.pop("type", None)
        s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if s.pop("nullable", False) and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s and "additionalProperties" not in s and not s.get("x-kubernetes-preserve-unknown-fields"):
        s["additionalProperties"] = False
    return s


@lru_cache(maxsize=None)
def crd_schema(filename: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / filename).read_text())
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _structural(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
    schema["properties"]["metadata"] = {"type": "object"}
    return schema
