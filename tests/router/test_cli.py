"""`zoe router` as a process: the way the controller runs it (membership pushed through the admin API)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO, free_port
from tests.router.fake_backend import FakeBackend, ServerThread
from zoe_cluster.router.membership import MemberReplica, Membership


def run_cli(*args, env=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", "router", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--replica", "http://127.0.0.1:1", "--policy", "nope"], "unknown routing policy 'nope'"),
        (["--replica", "http://127.0.0.1:1", "--policy-config", "decode_weight=-1"], "decode_weight"),
        (["--replica", "http://127.0.0.1:1", "--policy-config", "oops"], "key=value"),
        (["--replica", "not-a-url"], "http://"),
        ([], "no --replica"),
        (["--replica", "http://127.0.0.1:1", "--slo-class", "fast:1:0.02"], "--slo-class needs --slo-model"),
        (["--replica", "http://127.0.0.1:1", "--slo-class", "fast:1", "--slo-model", "glm-5.3", "--slo-variants",
          "mxfp4-tp8"], "--slo-class expects NAME:TTFT_S:ITL_S"),
        (["--replica", "http://127.0.0.1:1", "--slo-class", "fast:1:0.02", "--slo-model", "glm-5.3",
          "--slo-variants", "mxfp4-tp8,fp9"], "--slo-variants: model glm-5.3 has no variant 'fp9'"),
        (["--replica", "http://127.0.0.1:1", "--slo-class", "fast:1:0.02", "--slo-model", "glm-9",
          "--slo-variants", "a"], "--slo-model"),
        (["--replica", "http://127.0.0.1:1", "--slo-model", "glm-5.3"], "only apply with --slo-class"),
        (["--replica", "http://127.0.0.1:1", "--migration-limit", "-1"], "--migration-limit"),
    ],
)
def test_bad_arguments_exit_with_a_reason(args, needle):
    r = run_cli(*args, env={"ZOE_ROUTER_ADMIN_KEY": ""})
    assert r.returncode != 0 and needle in (r.stderr + r.stdout)


def test_router_process_takes_membership_from_the_admin_api():
    backend = ServerThread(FakeBackend("b0").app).start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--port", str(port), "--model", "m"],
        cwd=REPO, env={**os.environ, "ZOE_ROUTER_ADMIN_KEY": "secret"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    admin = {"Authorization": "Bearer secret"}
    try:
        deadline = time.time() + 30
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.time() < deadline, "router did not start"
            time.sleep(0.1)
        m = Membership(version=1, replicas=[MemberReplica(id="glm/0/1", url=backend.url, engine="vllm", models=["m"])])
        assert httpx.put(url + "/admin/membership", json=m.model_dump(), headers=admin).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "stream": True})
        assert r.status_code == 200 and r.headers["x-zoe-replica"] == "glm/0/1" and "[DONE]" in r.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        backend.stop()


def _wait_serving(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> float:
    """Seconds until a completion through the router succeeds."""
    t0 = time.monotonic()
    while True:
        try:
            r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hi"}, timeout=5)
            if r.status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() - t0 < timeout_s, "router did not serve"
        time.sleep(0.05)


def test_a_restarted_router_serves_the_membership_it_had(tmp_path):
    """Router HA: a router killed with SIGKILL and started again serves every replica of its last applied
    membership (kept in --membership-file) without waiting for the controller's next push."""
    backends = [ServerThread(FakeBackend(f"b{i}").app).start() for i in range(3)]
    port = free_port()
    argv = [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--port", str(port), "--model", "m",
            "--policy", "round_robin", "--membership-file", str(tmp_path / "membership.json")]
    env = {**os.environ, "ZOE_ROUTER_ADMIN_KEY": "secret"}
    url = f"http://127.0.0.1:{port}"
    admin = {"Authorization": "Bearer secret"}

    def start() -> subprocess.Popen:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                start_new_session=True)

    proc = start()
    try:
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        m = Membership(version=1_700_000_000_000, replicas=[
            MemberReplica(id=f"glm/{i}/1", url=b.url, models=["m"]) for i, b in enumerate(backends)])
        assert httpx.put(url + "/admin/membership", json=m.model_dump(), headers=admin).status_code == 200
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        proc = start()
        serving_s = _wait_serving(url, proc)
        got = httpx.get(url + "/admin/membership", headers=admin).json()
        assert got["version"] == m.version and len(got["replicas"]) == 3
        # every replica takes requests again, before any push
        seen = {httpx.post(url + "/v1/completions", json={"model": "m", "prompt": f"p{i}"}).headers["x-zoe-replica"]
                for i in range(30)}
        assert seen == {"glm/0/1", "glm/1/1", "glm/2/1"}
        # the next push still has to be newer than what the file held
        stale = Membership(version=1, replicas=m.replicas[:1])
        assert httpx.put(url + "/admin/membership", json=stale.model_dump(), headers=admin).status_code == 409
        assert serving_s < 15  # Python start and imports included; about 2 s on an idle machine
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        for b in backends:
            b.stop()
