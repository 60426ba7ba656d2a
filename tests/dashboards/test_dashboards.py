"""Grafana dashboards: well-formed JSON models, and every query parses and reads only metrics that exist."""

from __future__ import annotations

import json

import pytest

from tests.dashboards.promql import DASHBOARDS, dashboard_exprs, known_names, metric_names, rule_exprs, zoe_names
from tests.helm.chart import MONITORING, by_kind, docs

EXPECTED = {"zoe-router", "zoe-engines", "zoe-switching", "zoe-kernels"}


def test_the_four_dashboards_exist_with_unique_uids():
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(uids) == len(set(uids))
    assert {p.stem for p in DASHBOARDS} == set(uids)
    missing = EXPECTED - set(uids)
    assert not missing, f"dashboards missing: {missing}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_model_is_well_formed(path):
    d = json.loads(path.read_text())
    assert d["title"].startswith("zoe / ") and "zoe" in d["tags"] and d["description"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in d["templating"]["list"]}
    assert "datasource" in variables
    occupied = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, f"{p['title']} is wider than the grid"
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & occupied, f"{path.name}: panel {p['title']!r} overlaps another"
        occupied |= cells
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], f"{p['title']} has no query"
        for t in p["targets"]:
            for var in __import__("re").findall(r"\$([a-z_]+)", t["expr"]):
                assert var.startswith("__") or var in variables, f"{p['title']}: unknown variable ${var}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_query_parses_and_reads_known_metrics(path):
    known = known_names()
    for where, expr in dashboard_exprs(path):
        try:
            names = metric_names(expr)
        except ValueError as e:
            pytest.fail(f"{where}: {e}")
        assert names, f"{where}: reads no metric"
        assert names <= known, f"{where}: unknown metrics {sorted(names - known)}"


@pytest.mark.helm
def test_every_alert_rule_parses_and_reads_known_metrics():
    (rule,) = by_kind(docs({}, api_versions=(MONITORING,)), "PrometheusRule")
    known = known_names()
    for where, expr in rule_exprs(rule["spec"]):
        names = metric_names(expr)
        assert names and names <= known, f"{where}: unknown metrics {sorted(names - known)}"


def test_the_router_dashboard_covers_every_router_metric():
    used = set().union(*(metric_names(e) for p in DASHBOARDS if p.stem == "zoe-router" for _, e in dashboard_exprs(p)))
    used = {n.removesuffix("_bucket") for n in used}
    router = {n for n in zoe_names() if n.startswith("zoe_router_") and not n.endswith(("_sum", "_count"))}
    router = {n.removesuffix("_bucket") for n in router}
    assert router <= used, f"router metrics with no panel: {sorted(router - used)}"


def test_parser_rejects_broken_promql():
    with pytest.raises(ValueError):
        metric_names("sum(rate(zoe_router_requests_total[5m])")
