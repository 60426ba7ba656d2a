"""`zoe deploy/status/logs/switch/scale/undeploy` as a user runs them, with simulated replicas on a real local Ray."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import glm
from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
SIM_ENV = ["--env", "ZOE_SIM_TIME_SCALE=0.01", "--env", "ZOE_SIM_STARTUP_S=0.5"]


def zoe(*args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200", **(env or {})})


def chat(endpoint: str, model: str = "glm-5.3") -> httpx.Response:
    return httpx.post(endpoint + "/chat/completions", timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})


@pytest.mark.parametrize(
    "args, message",
    [
        (["deploy", "nope"], "unknown model 'nope'"),
        (["deploy", "glm-5.3", "--variant", "nope", "--engine", "sim"], "no variant 'nope'"),
        (["deploy", "glm-5.3", "--engine", "tgi"], "--engine must be one of"),
        (["deploy", "glm-5.3", "--variant", "fp8-tp8", "--concurrency", "8"], "either --variant or --concurrency"),
        (["deploy", "glm-5.3", "--engine", "sim", "--env", "NOEQUALS"], "--env expects KEY=VALUE"),
        (["status", "--address", "127.0.0.1:1"], "cannot reach the Ray cluster"),
    ],
)
def test_bad_input_exits_nonzero_with_a_reason(args, message):
    r = zoe(*args, timeout=60)
    assert r.returncode != 0
    assert message in " ".join(r.stderr.split()), r.stderr


@pytest.mark.ray
@pytest.mark.slow
def test_cli_lifecycle_with_simulated_replicas(ray_cluster):
    port = free_port()
    addr = ["--address", ray_cluster]
    r = zoe("deploy", "glm-5.3", "--engine", "sim", "--concurrency", "32", "--replicas", "2", "--port", str(port),
            *SIM_ENV, *addr)
    assert r.returncode == 0, r.stdout + r.stderr
    planned = re.search(r"plan: (\S+) predicts", r.stdout).group(1)  # the planner chose the variant
    assert planned in glm().variants
    endpoint = f"http://127.0.0.1:{port}/v1"
    assert f"OpenAI endpoint: {endpoint}" in " ".join(r.stdout.split())
    try:
        again = zoe("deploy", "glm-5.3", "--engine", "sim", "--port", str(free_port()), *addr)
        assert again.returncode != 0 and "already exists" in again.stderr

        resp = chat(endpoint)
        assert resp.status_code == 200, resp.text
        assert resp.json()["choices"][0]["message"]["content"]

        st = json.loads(zoe("status", "glm-5.3", "--json", *addr).stdout)
        assert st["replicas_ready"] == 2 and st["engine"] == "sim" and st["endpoint"] == endpoint
        assert st["variant"] == planned and {r["variant"] for r in st["replicas"]} == {planned}
        assert sorted(len(r["gpu_ids"][0]) for r in st["replicas"]) == [8, 8]
        table = zoe("status", *addr).stdout
        assert "glm-5.3/0/1" in table and "ready" in table

        logs = zoe("logs", "glm-5.3", "--replica", "0", *addr)
        assert logs.returncode == 0 and "zoe supervisor" in logs.stdout and "sim serve" in logs.stdout
        assert zoe("logs", "glm-5.3", "--replica", "7", *addr).returncode != 0
        router_log = zoe("logs", "glm-5.3", "--router", *addr)
        assert router_log.returncode == 0 and "cli.main router" in router_log.stdout

        target = "fp8-tp8" if planned != "fp8-tp8" else "mxfp4-tp8"
        sw = zoe("switch", "glm-5.3", target, "--replica", "1", *addr)
        assert sw.returncode == 0, sw.stderr
        st = json.loads(zoe("status", "glm-5.3", "--json", *addr).stdout)
        r1 = next(r for r in st["replicas"] if r["index"] == 1)
        assert r1["variant"] == target and r1["generation"] == 2 and r1["state"] == "ready"
        bad = zoe("switch", "glm-5.3", "nope", *addr)
        assert bad.returncode != 0 and "no variant 'nope'" in bad.stderr

        assert zoe("scale", "glm-5.3", "1", *addr).returncode == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = json.loads(zoe("status", "glm-5.3", "--json", *addr).stdout)
            if len(st["replicas"]) == 1:
                break
            time.sleep(1)
        assert [r["index"] for r in st["replicas"]] == [0]
        assert chat(endpoint).status_code == 200
    finally:
        un = zoe("undeploy", "glm-5.3", *addr)
    assert un.returncode == 0, un.stderr
    assert "no deployments" in zoe("status", *addr).stdout
    with pytest.raises(httpx.ConnectError):
        chat(endpoint)


@pytest.mark.ray
@pytest.mark.slow
def test_deploy_that_keeps_crashing_gives_up_waiting_with_the_reason(ray_cluster):
    addr = ["--address", ray_cluster]
    r = zoe("deploy", "glm-5.3", "--engine", "sim", "--name", "broken", "--port", str(free_port()),
            "--engine-arg", "--no-such-flag", *SIM_ENV, *addr)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        err = " ".join(r.stderr.split())
        assert "0/2 replicas ready" in err and "exited with code 2" in err and "zoe logs broken" in err  # sim default: 2
        logs = zoe("logs", "broken", *addr).stdout
        assert "No such option: --no-such-flag" in logs
    finally:
        assert zoe("undeploy", "broken", "--force", *addr).returncode == 0


def _kill_cluster_in(tmpdir: str) -> None:
    """Stop the Ray processes of the cluster whose session lives under `tmpdir` (by pid; never `ray stop`)."""
    def pids():
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if tmpdir.encode() in (d / "cmdline").read_bytes():
                        out.append(int(d.name))
                except OSError:
                    pass
        return out

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids():
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.mark.ray
@pytest.mark.slow
def test_deploy_without_a_cluster_starts_a_local_ray():
    """The README's main command: `zoe deploy glm-5.3 --engine sim` on a machine with no Ray and no GPUs."""
    tmpdir = tempfile.mkdtemp(prefix="zr", dir="/tmp")  # short: Ray's socket paths live under it
    env = {"RAY_TMPDIR": tmpdir, "RAY_ADDRESS": ""}
    port = free_port()
    try:
        r = zoe("deploy", "glm-5.3", "--engine", "sim", "--port", str(port), *SIM_ENV, env=env, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert chat(f"http://127.0.0.1:{port}/v1").status_code == 200
        st = json.loads(zoe("status", "glm-5.3", "--json", env=env).stdout)
        assert st["ray_address"].startswith("127.0.0.1:") and st["replicas_ready"] == 2  # sim default: 2 replicas
        assert zoe("undeploy", "glm-5.3", env=env).returncode == 0
    finally:
        _kill_cluster_in(tmpdir)
        shutil.rmtree(tmpdir, ignore_errors=True)
