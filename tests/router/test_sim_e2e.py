"""End to end: the router in front of real `zoe sim serve` processes (the simulated engine), with the engine's
own fault knobs: a replica that crashes, one that hangs, one that is slow. No request may be lost, except streams
already running on the replica that died, which must end with an error event and [DONE]."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO, free_port
from tests.router.fake_backend import ServerThread
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership

pytestmark = pytest.mark.slow


def start_sim(port: int, *flags: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve", "--model", "glm-5.3", "--port", str(port),
            "--time-scale", "0.002", "--startup-s", "0", "--served-model-name", "glm-5.3", *flags]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        assert proc.poll() is None, f"sim at {url} exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


@pytest.fixture
def sim_cluster():
    ports = [free_port() for _ in range(3)]
    procs = [start_sim(ports[0], "--crash-after", "5"), start_sim(ports[1], "--hang-after", "5"),
             start_sim(ports[2], "--slowdown", "3")]
    try:
        for p, proc in zip(ports, procs):
            wait_up(f"http://127.0.0.1:{p}", proc)
        yield [f"http://127.0.0.1:{p}" for p in ports], procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_no_request_lost_when_replicas_crash_hang_or_slow_down(sim_cluster):
    urls, procs = sim_cluster
    m = Membership(version=1, replicas=[MemberReplica(id=f"sim/{i}/1", url=u, engine="sim", models=["glm-5.3"])
                                        for i, u in enumerate(urls)])
    cfg = RouterConfig(policy="round_robin", first_byte_timeout_s=3, read_timeout_s=3, health_interval_s=0.5,
                       health_timeout_s=0.5, unhealthy_after=1, max_retries=2)
    router = build_router(cfg, membership=m)
    with ServerThread(router.app) as srv, httpx.Client(base_url=srv.url, timeout=30) as client:

        def one(i: int):
            body = {"model": "glm-5.3", "prompt": f"request {i} " + "words " * 200, "max_tokens": 16,
                    "stream": i % 2 == 1}
            return i, client.post("/v1/completions", json=body)

        with cf.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, range(40)))
        broken_streams = 0
        for i, r in results:
            assert r.status_code == 200, (i, r.status_code, r.text[:200])
            if i % 2:
                events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                if any("error" in json.loads(e) for e in events[:-1]):
                    broken_streams += 1
                    assert r.headers["x-zoe-replica"] in ("sim/0/1", "sim/1/1")  # only the dead or hung one
            else:
                assert r.json()["choices"][0]["text"]
        assert broken_streams <= 4  # at most the streams in flight on the two failing replicas
        assert procs[0].poll() is not None  # the crash really happened
        # the survivors took the traffic, and the failing replicas are out of rotation
        healthy = {st.id: st.routable(router.clock()) for st in router.replicas}
        assert healthy["sim/2/1"] and not healthy["sim/0/1"] and not healthy["sim/1/1"]


def test_a_hung_engine_is_found_mid_request_without_health_checks():
    """One of two simulated engines hangs at its 4th request (no steps, no answers, connections held open). With
    /health checks off and 60 s read timeouts, the router still finds it hung within the 1 s stall timeout from
    its silent streams: those end with an error event, requests waiting for its answer move to the other engine,
    and it is ejected (cause stall)."""
    ports = [free_port() for _ in range(2)]
    slower = ("--time-scale", "0.05")  # streams of a few seconds, so some still decode when the engine hangs
    procs = [start_sim(ports[0], *slower, "--hang-after", "4"), start_sim(ports[1], *slower)]
    try:
        for p, proc in zip(ports, procs):
            wait_up(f"http://127.0.0.1:{p}", proc)
        m = Membership(version=1, replicas=[MemberReplica(id=f"sim/{i}/1", url=f"http://127.0.0.1:{p}", engine="sim",
                                                          models=["glm-5.3"]) for i, p in enumerate(ports)])
        cfg = RouterConfig(policy="round_robin", health_interval_s=0, stall_timeout_s=1.0, read_timeout_s=60,
                           first_byte_timeout_s=60, eject_s=60, max_retries=2)
        router = build_router(cfg, membership=m)
        with ServerThread(router.app) as srv, httpx.Client(base_url=srv.url, timeout=90) as client:

            def one(i: int):
                body = {"model": "glm-5.3", "prompt": f"request {i} " + "words " * 50, "max_tokens": 300 + 400 * i,
                        "stream": i % 2 == 0}
                t = time.monotonic()
                r = client.post("/v1/completions", json=body)
                return i, r, time.monotonic() - t

            t0 = time.monotonic()
            with cf.ThreadPoolExecutor(6) as pool:
                results = list(pool.map(one, range(8)))
            assert time.monotonic() - t0 < 45  # nothing waited for the 60 s timeouts
            for i, r, _ in results:
                assert r.status_code == 200, (i, r.text[:200])
                if i % 2:  # not streamed: whole, also when it first waited on the hung engine (then retried)
                    assert r.json()["choices"][0]["text"]
                else:
                    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
                    assert events[-1] == "[DONE]"
                    if any("error" in json.loads(e) for e in events[:-1]):
                        assert r.headers["x-zoe-replica"] == "sim/0/1" and "stall" in r.text
            st = router.replicas.by_id["sim/0/1"]
            assert not st.routable(router.clock()) and st.hung
            assert router.metrics.ejections.labels(replica="sim/0/1", cause="stall")._value.get() == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
