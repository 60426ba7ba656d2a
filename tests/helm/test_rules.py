"""The chart's alert rules: promtool checks them and runs their unit tests (tests/helm/alerts_test.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import MONITORING, by_kind, docs

pytestmark = [pytest.mark.helm, pytest.mark.prometheus]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: run scripts/setup_test_envs.sh (apt: prometheus)")
    return path


def rendered_rules(values: dict | None = None) -> dict:
    (rule,) = by_kind(docs(values or {}, api_versions=(MONITORING,)), "PrometheusRule")
    return rule["spec"]


def test_promtool_checks_the_rendered_rules(tmp_path: Path):
    spec = rendered_rules()
    f = tmp_path / "zoe.rules.yaml"
    f.write_text(yaml.safe_dump(spec))
    out = subprocess.run([_promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in spec['groups'])} rules found" in out.stdout


def test_promtool_unit_tests_of_every_alert(tmp_path: Path):
    spec = rendered_rules()
    (tmp_path / "zoe.rules.yaml").write_text(yaml.safe_dump(spec))
    tests_yaml = (Path(__file__).parent / "alerts_test.yaml").read_text().replace("RULES_FILE", "zoe.rules.yaml")
    (tmp_path / "alerts_test.yaml").write_text(tests_yaml)
    out = subprocess.run([_promtool(), "test", "rules", "alerts_test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    tested = {t["alertname"] for case in yaml.safe_load(tests_yaml)["tests"] for t in case["alert_rule_test"]}
    alerts = {r["alert"] for g in spec["groups"] for r in g["rules"]}
    assert tested == alerts, f"alerts without a unit test: {alerts - tested}"


def test_thresholds_come_from_the_values():
    spec = rendered_rules({"metrics": {"prometheusRule": {"hitRateCollapseRatio": 0.25, "queuedRequestsPerReplica": 4, "pictureShareLagSeconds": 12, "for": "10m"}}})
    rules = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
    assert "< 0.25 * (sum(rate(zoe_router_prefix_matched_tokens_total[1d]))" in rules["ZoePrefixHitRateCollapse"]["expr"]
    assert "> 4 * ((count(vllm:num_requests_running)" in rules["ZoeEngineQueueing"]["expr"]
    assert rules["ZoeReplicaDown"]["for"] == "10m"
    assert rules["ZoeRouterPictureSharingLags"]["expr"].endswith("(zoe_router_picture_share_lag_seconds) > 12")
