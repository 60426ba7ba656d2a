"""Every engine metric a dashboard or alert rule reads is one the REAL engines export (vLLM 0.32, SGLang 0.5.23,
read from their installed packages' source), and the simulated engine fakes those same names."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboards.engine_exports import constructed_metrics, engine_series, exposed_samples, stored_as
from tests.dashboards.promql import DASHBOARDS, dashboard_exprs, metric_names, rule_exprs
from tests.helm.chart import MONITORING, by_kind, docs

ENGINES = {"vllm:": "vllm", "sglang:": "sglang"}


@pytest.fixture(scope="module")
def real_series(vllm_python, sglang_python) -> dict[str, set[str]]:
    """prefix -> every series name the installed engine can export, as Prometheus stores it."""
    return {"vllm:": engine_series(vllm_python, "vllm", "vllm:"),
            "sglang:": engine_series(sglang_python, "sglang", "sglang:")}


def _engine_names_read() -> dict[str, set[str]]:
    """Engine metric name -> where the dashboards and the chart's alert rules read it."""
    (rule,) = by_kind(docs({}, api_versions=(MONITORING,)), "PrometheusRule")
    out: dict[str, set[str]] = {}
    for where, expr in [*(x for p in DASHBOARDS for x in dashboard_exprs(p)), *rule_exprs(rule["spec"])]:
        for name in metric_names(expr):
            if name.startswith(tuple(ENGINES)):
                out.setdefault(name, set()).add(where)
    return out


@pytest.mark.vllm
@pytest.mark.sglang
def test_every_engine_metric_the_dashboards_and_rules_read_is_exported_by_the_real_engine(real_series):
    read = _engine_names_read()
    assert {n.split(":")[0] for n in read} == {"vllm", "sglang"}, "the dashboards read both engines' metrics"
    unknown = {name: sorted(where)[:2] for name, where in read.items()
               if name not in real_series[name.split(":")[0] + ":"]}
    assert not unknown, f"read but not exported by the installed engine: {unknown}"


@pytest.mark.vllm
@pytest.mark.sglang
@pytest.mark.parametrize("mode", ["vllm", "sglang"])
def test_the_simulated_engine_exports_real_engine_names(real_series, mode):
    from prometheus_client import generate_latest

    from zoe_cluster.sim.metrics import SimMetrics

    text = generate_latest(SimMetrics(mode, "m").registry).decode()
    faked = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples
             if s.name.startswith(mode + ":") and not s.name.endswith("_created")}
    assert len(faked) >= 8, f"the simulated engine ({mode} mode) exports too few engine names: {sorted(faked)}"
    unknown = sorted(n for n in faked if stored_as(n) not in real_series[mode + ":"])
    assert not unknown, f"the simulated engine ({mode} mode) exports names the real engine does not: {unknown}"


def test_the_reader_finds_constructors_and_expands_samples(tmp_path: Path):
    """The source reader on a small package: literal names of every constructor kind, nothing else."""
    (tmp_path / "m.py").write_text(
        "from prometheus_client import Counter, Gauge, Histogram\n"
        "class L:\n"
        "    _gauge_cls = Gauge\n"
        "    def __init__(self):\n"
        "        self._gauge_cls(name='eng:running', documentation='x')\n"
        "        Counter('eng:hits', 'x')\n"
        "        Counter(name='eng:steps_total', documentation='x')\n"
        "        Histogram(name='eng:ttft_seconds', documentation='x')\n"
        "        Gauge(name='other:thing', documentation='x')\n"
        "        Gauge(name=f'eng:{1}', documentation='x')\n"
        "        print(name='eng:not_a_metric')\n")
    found = constructed_metrics(tmp_path, "eng:")
    assert found == {"eng:running": "gauge", "eng:hits": "counter", "eng:steps_total": "counter",
                     "eng:ttft_seconds": "histogram"}
    assert exposed_samples("eng:hits", "counter") == {"eng:hits_total"}
    assert exposed_samples("eng:steps_total", "counter") == {"eng:steps_total"}
    assert exposed_samples("eng:ttft_seconds", "histogram") == {
        "eng:ttft_seconds_bucket", "eng:ttft_seconds_sum", "eng:ttft_seconds_count"}
    assert stored_as("vllm:num_requests_running") == "vllm:num_requests_running"
    assert stored_as("eng.odd-name") == "eng_odd_name"
