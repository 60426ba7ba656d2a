"""A real Prometheus (the Debian package) scrapes the simulated engine's /metrics."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
import yaml

from tests.conftest import free_port
from tests.sim.helpers import sim_server

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def _query(api: str, q: str) -> list:
    return httpx.get(f"{api}/query", params={"query": q}, timeout=5).json()["data"]["result"]


def test_prometheus_scrapes_sim_metrics(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus not found: run scripts/setup_test_envs.sh (apt: prometheus)")
    with sim_server("--model", "glm-5.3", "--variant", "fp8-tp8", "--time-scale", "0.001", "--startup-s", "0",
                    "--served-model-name", "glm") as (url, _):
        prompt = "shared system prompt " * 100
        for i in range(3):
            r = httpx.post(url + "/v1/completions", json={"model": "glm", "prompt": prompt + str(i), "max_tokens": 4},
                           timeout=30)
            assert r.status_code == 200
        port = free_port()
        cfg = {"global": {"scrape_interval": "1s"},
               "scrape_configs": [{"job_name": "zoe-sim", "static_configs": [{"targets": [url.removeprefix("http://")]}]}]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        log = open(tmp_path / "prometheus.log", "wb")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
        api = f"http://127.0.0.1:{port}/api/v1"
        try:
            deadline = time.monotonic() + 60
            hits: list = []
            while time.monotonic() < deadline:
                try:
                    hits = _query(api, '{__name__=~"vllm.prefix_cache_hits_total", job="zoe-sim"}')
                except (httpx.HTTPError, ValueError, KeyError):
                    hits = []
                if hits:
                    break
                time.sleep(0.5)
            assert hits, "Prometheus never stored the sim's prefix-cache hits"
            assert float(hits[0]["value"][1]) > 0
            assert hits[0]["metric"]["model_name"] == "glm" and hits[0]["metric"]["engine"] == "0"
            up = _query(api, 'up{job="zoe-sim"}')
            assert up and up[0]["value"][1] == "1"
            ttft = _query(api, '{__name__=~"vllm.time_to_first_token_seconds_count"}')
            assert ttft and float(ttft[0]["value"][1]) == 3
        finally:
            prom.terminate()
            try:
                prom.wait(10)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
            log.close()
