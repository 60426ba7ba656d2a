"""PromQL in the dashboards and the alert rules: where it is, how to parse it, which metric names it reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

import promql_parser

from zoe_cluster.metrics import METRICS

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))

# Engine names the dashboards may read and the simulated engine fakes, as Prometheus stores them (colons kept: a
# scrape by Prometheus 2.42 stores `vllm:num_requests_running` under that name; test_live_scrape.py checks it on a
# real one). test_engine_metric_names.py checks each against what the installed vLLM and SGLang construct.
VLLM = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_success_total"]
VLLM_HISTOGRAMS = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"]
SGLANG = ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:prompt_tokens_total",
          "sglang:generation_tokens_total", "sglang:cached_tokens_total", "sglang:cache_hit_rate", "sglang:num_retracted_requests_total"]
SGLANG_HISTOGRAMS = ["sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds", "sglang:e2e_request_latency_seconds"]
PROMETHEUS = ["up"]  # written by Prometheus itself for every target


def kernel_names() -> set[str]:
    """What the zoe_kernels plugin exports on an engine's /metrics (its collector's own description)."""
    from zoe_kernels.integrations.report import ReportCollector

    out = set()
    for fam in ReportCollector(".").describe():
        out.add(fam.name + "_total" if fam.type == "counter" else fam.name)
    return out

_SUFFIXES = ("_bucket", "_sum", "_count")


def _expand(histograms: list[str]) -> list[str]:
    return [h + s for h in histograms for s in _SUFFIXES]


def zoe_names() -> set[str]:
    out = set()
    for m in METRICS:
        out |= set(_expand([m.name])) if m.kind == "histogram" else {m.exposed_name}
    return out


def controller_names() -> set[str]:
    """What the deployment controller exports on its own /metrics (recipe switching), not the router or engines."""
    from zoe_cluster.metrics import metric_names as zoe_metric_names

    return set(zoe_metric_names("switching"))


def known_names() -> set[str]:
    return zoe_names() | kernel_names() | set(VLLM + SGLANG + PROMETHEUS) | set(_expand(VLLM_HISTOGRAMS + SGLANG_HISTOGRAMS))


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with values PromQL parses ($__rate_interval -> 5m, $var -> .*)."""
    expr = re.sub(r"\$__(rate_)?interval|\$__range", "5m", expr)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def dashboard_exprs(path: Path) -> Iterator[tuple[str, str]]:
    """(where, expr) for every query of a dashboard: panel targets and template variables."""
    d = json.loads(path.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            yield f"{path.name}: panel {p['title']!r} {t['refId']}", t["expr"]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", v["query"]["query"])
            assert m, f"{path.name}: variable {v['name']} is not a label_values() query"
            yield f"{path.name}: variable {v['name']}", m.group(1)


def rule_exprs(spec: dict) -> Iterator[tuple[str, str]]:
    for g in spec["groups"]:
        for r in g["rules"]:
            yield f"rule {r.get('alert') or r.get('record')}", r["expr"]


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads; raises ValueError when it does not parse."""
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            if node.name is None:
                raise ValueError(f"selector without a metric name in {expr!r}")
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(grafana_to_promql(expr)), visit)
    return names
