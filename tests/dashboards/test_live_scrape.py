"""A real Prometheus scrapes a real router and simulated engines (vLLM and SGLang modes); every metric the
dashboards and alert rules read must be one it knows (as a series, or as metadata for a labelled family that
has seen no event yet), and the main panels' queries return data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.dashboards.promql import (
    DASHBOARDS, controller_names, SGLANG, SGLANG_HISTOGRAMS, VLLM, VLLM_HISTOGRAMS, dashboard_exprs, grafana_to_promql, kernel_names,
    metric_names, rule_exprs,
)
from tests.helm.chart import MONITORING, by_kind, docs
from tests.support.vllm_server import kill_process_group

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

PY = sys.executable
ADMIN_KEY = "live-scrape-admin-key"


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer in {timeout_s}s")


class Processes:
    """Processes this test starts, stopped by PID (their own process group) at the end."""

    def __init__(self, log_dir: Path):
        self.log_dir, self.procs = log_dir, []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=os.environ | {"ZOE_ROUTER_API_KEYS": ""})
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            kill_process_group(p.pid)


def _sim(procs: Processes, name: str, port: int, extra: list[str]) -> str:
    p = procs.start(name, [PY, "-m", "zoe_cluster.cli.main", "sim", "serve", "--model", "glm-5.3", "--variant", "fp8-tp8",
                           "--host", "127.0.0.1", "--port", str(port), "--time-scale", "0.01", "--startup-s", "0", *extra])
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/health", p)
    return url


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: run scripts/setup_test_envs.sh (apt: prometheus)")
    tmp = tmp_path_factory.mktemp("live")
    procs = Processes(tmp)
    try:
        vllm_url = _sim(procs, "sim-vllm", free_port(), [])
        sglang_url = _sim(procs, "sim-sglang", free_port(), ["--metrics", "sglang"])
        rport = free_port()
        router = procs.start("router", [PY, "-m", "zoe_cluster.cli.main", "router", "--host", "127.0.0.1", "--port",
                                        str(rport), "--replica", vllm_url, "--engine", "sim", "--admin-key", ADMIN_KEY])
        router_url = f"http://127.0.0.1:{rport}"
        _wait_http(router_url + "/health", router)
        # Traffic: a shared prefix twice through the router (prefix hits), and one request to the SGLang sim.
        prompt = "You are a helpful assistant. " * 60
        with httpx.Client(timeout=60) as c:
            for i in range(3):
                body = {"model": "glm-5.3", "prompt": prompt + str(i), "max_tokens": 8, "stream": i == 2}
                r = c.post(router_url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
            r = c.post(sglang_url + "/v1/completions", json={"model": "glm-5.3", "prompt": prompt, "max_tokens": 8})
            assert r.status_code == 200, r.text
        pport = free_port()
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [url.removeprefix("http://")]}]}
                                  for job, url in (("zoe-router", router_url), ("zoe-engines", vllm_url),
                                                   ("zoe-engines-sglang", sglang_url))]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        prom = procs.start("prometheus", ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                          f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{pport}"])
        api = f"http://127.0.0.1:{pport}/api/v1"
        _wait_http(f"http://127.0.0.1:{pport}/-/ready", prom)
        deadline = time.monotonic() + 60
        while True:  # three targets up, and a few scrapes each so that rate() has two points
            up = httpx.get(f"{api}/query", params={"query": "count_over_time(up[1m]) > 3 and up == 1"}).json()["data"]["result"]
            if len(up) == 3:
                break
            assert time.monotonic() < deadline, f"targets not up: {up}"
            time.sleep(0.5)
        yield api
    finally:
        procs.stop()


def _live_names(api: str) -> set[str]:
    names = set(httpx.get(f"{api}/label/__name__/values").json()["data"])
    for name, entries in httpx.get(f"{api}/metadata").json()["data"].items():
        kind = entries[0]["type"]
        names.add(name)
        if kind == "counter" and not name.endswith("_total"):
            names.add(name + "_total")
        if kind == "histogram":
            names |= {name + s for s in ("_bucket", "_sum", "_count")}
    return names


def _referenced() -> dict[str, set[str]]:
    (rule,) = by_kind(docs({}, api_versions=(MONITORING,)), "PrometheusRule")
    out: dict[str, set[str]] = {}
    for where, expr in [*(x for p in DASHBOARDS for x in dashboard_exprs(p)), *rule_exprs(rule["spec"])]:
        for n in metric_names(expr):
            out.setdefault(n, set()).add(where)
    return out


def test_every_metric_the_dashboards_and_rules_read_is_exported(scraped):
    live = _live_names(scraped)
    # The sims do not load the zoe_kernels plugin: its names come from the plugin's own collector instead; the
    # switching names come from the controller's /metrics (tested in tests/cluster).
    exported_elsewhere = kernel_names() | controller_names()
    missing = {n: sorted(w)[:2] for n, w in _referenced().items() if n not in live and n not in exported_elsewhere}
    assert not missing, f"queried but not exported by the router or the engines: {missing}"
    engines = set(VLLM + SGLANG) | {h + "_bucket" for h in VLLM_HISTOGRAMS + SGLANG_HISTOGRAMS}
    assert engines <= live, f"engine names listed in tests/dashboards/promql.py but not scraped: {sorted(engines - live)}"
    assert "vllm:num_requests_running" in live  # stored with its colon, as queried


@pytest.mark.parametrize("title,expr", [
    ("requests/s", "sum(rate(zoe_router_responses_total[$__rate_interval]))"),
    ("per-replica requests", "sum by (replica) (rate(zoe_router_requests_total[$__rate_interval]))"),
    ("vLLM prefix queries", "sum(rate(vllm:prefix_cache_queries_total[$__rate_interval]))"),
    ("SGLang prompt tokens", "sum(rate(sglang:prompt_tokens_total[$__rate_interval]))"),
    ("router TTFT", "histogram_quantile(0.5, sum by (le) (rate(zoe_router_ttft_seconds_bucket[$__rate_interval])))"),
])
def test_main_panel_queries_return_data(scraped, title, expr):
    promql = grafana_to_promql(expr).replace("[5m]", "[1m]")
    res = httpx.get(f"{scraped}/query", params={"query": promql}).json()
    assert res["status"] == "success" and res["data"]["result"], f"{title}: {promql} returned nothing"
