"""Router pods found by label (in-memory Kubernetes API) and the membership push to every one of them."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from zoe_cluster.k8s import MembershipFanout, RouterDiscovery, RouterEndpoint, core_api, ready_router_endpoints
from zoe_cluster.router.membership import MemberReplica, Membership

SELECTOR = "app.kubernetes.io/instance=zoe,app.kubernetes.io/component=router"


def _pod(name, ip="10.0.0.1", ready=True, instance="zoe", component="router", phase="Running", restarts=0, ns="serving"):
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"app.kubernetes.io/instance": instance, "app.kubernetes.io/component": component}},
        "spec": {"containers": [{"name": "router", "image": "zoe"}]},
        "status": {"phase": phase, "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "router", "restartCount": restarts, "image": "zoe", "imageID": "", "ready": ready}]},
    }


def test_only_ready_addressed_pods_of_the_release_are_endpoints():
    pods = [
        _pod("r-b", "10.0.0.2"), _pod("r-a", "10.0.0.1"), _pod("r-notready", ready=False),
        _pod("r-noip", ip=None), _pod("other-release", instance="other"), _pod("ray-head", component="ray-head"),
        _pod("r-pending", phase="Pending"), _pod("r-v6", "fd00::5"),
    ]
    eps = ready_router_endpoints(pods, SELECTOR, 8001)
    assert [(e.pod, e.url) for e in eps] == [
        ("r-a", "http://10.0.0.1:8001"), ("r-b", "http://10.0.0.2:8001"), ("r-v6", "http://[fd00::5]:8001")]


def test_discovery_from_the_charts_environment():
    env = {"ZOE_K8S_NAMESPACE": "serving", "ZOE_K8S_ROUTER_SELECTOR": SELECTOR, "ZOE_K8S_ROUTER_PORT": "8001"}
    assert RouterDiscovery.from_env(env) == RouterDiscovery("serving", SELECTOR, 8001)
    with pytest.raises(ValueError, match="ZOE_K8S_ROUTER_SELECTOR"):
        RouterDiscovery.from_env({"ZOE_K8S_NAMESPACE": "serving", "ZOE_K8S_ROUTER_PORT": "8001"})
    with pytest.raises(ValueError, match="port number"):
        RouterDiscovery.from_env(env | {"ZOE_K8S_ROUTER_PORT": "admin"})


@pytest.mark.asyncio
async def test_discovery_lists_router_pods_in_its_namespace_only(kmock):
    kmock.resources["v1/pods"] = {}
    core = core_api(host=str(kmock.url))
    for p in [_pod("r-1", "10.0.0.1"), _pod("r-2", "10.0.0.2", ready=False), _pod("r-3", "10.0.0.3", ns="staging")]:
        await asyncio.to_thread(core.create_namespaced_pod, p["metadata"]["namespace"], p)
    eps = await asyncio.to_thread(RouterDiscovery("serving", SELECTOR, 8001).endpoints, core)
    assert [e.pod for e in eps] == ["r-1"]


class _Routers:
    """The admin API's versioning contract (zoe_cluster/router/membership.py), per router address."""

    def __init__(self, down=()):
        self.version: dict[str, int] = {}
        self.down = set(down)
        self.auth: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.auth.append(request.headers.get("authorization", ""))
        if request.method == "GET":
            return httpx.Response(200, json={"version": self.version.get(host, 0), "replicas": []})
        m = Membership.model_validate_json(request.content)
        if m.version <= self.version.get(host, -1):
            return httpx.Response(409, json={"error": "stale"})
        self.version[host] = m.version
        return httpx.Response(200, json={"version": m.version, "replicas": len(m.replicas)})


def _membership(version):
    return Membership(version=version, replicas=[MemberReplica(id="glm-5.3/0/1", url="http://10.1.0.1:8100", variant="fp8-tp8")])


def test_fanout_pushes_to_every_router_and_catches_up_new_and_restarted_ones():
    routers = _Routers(down={"10.0.0.3"})
    eps = [RouterEndpoint("r-1", "http://10.0.0.1:8001"), RouterEndpoint("r-3", "http://10.0.0.3:8001")]
    fan = MembershipFanout(lambda: list(eps), "s3cret", httpx.Client(transport=httpx.MockTransport(routers.handler)))
    res = fan.publish(_membership(1))
    assert res.applied == ["r-1"] and "ConnectError" in res.failed["r-3"]  # one dead pod does not stop the others
    assert set(routers.auth) == {"Bearer s3cret"}

    eps.append(RouterEndpoint("r-2", "http://10.0.0.2:8001"))  # scaled up
    routers.down.clear()
    res = fan.resync()
    assert sorted(res.applied) == ["r-2", "r-3"]  # r-1 already has version 1
    assert fan.resync().applied == []

    eps[0] = RouterEndpoint("r-1", "http://10.0.0.1:8001", restarts=1)  # container restarted: membership lost
    routers.version.pop("10.0.0.1")
    assert fan.resync().applied == ["r-1"]

    routers.version["10.0.0.2"] = 7  # a router that kept a previous controller's newer version: base moves above it
    res = fan.publish(_membership(2))
    assert sorted(res.applied) == ["r-1", "r-2", "r-3"] and not res.failed
    assert fan.base == 6 and routers.version == {"10.0.0.1": 2, "10.0.0.3": 2, "10.0.0.2": 8}
    assert sorted(fan.publish(_membership(3)).applied) == ["r-1", "r-2", "r-3"]  # still monotonic everywhere
    assert set(routers.version.values()) == {9}


@pytest.fixture
def two_routers():
    """Two real `zoe router` processes on one port, as two pods would be (127.0.0.2 is loopback too)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from tests.conftest import free_port

    port, key, procs = free_port(), "admin-key-for-the-test", []
    for host in ("127.0.0.1", "127.0.0.2"):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--host", host, "--port", str(port), "--admin-key", key],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ | {"ZOE_ROUTER_API_KEYS": ""},
        ))
    try:
        deadline = time.monotonic() + 60
        for host, p in zip(("127.0.0.1", "127.0.0.2"), procs):
            while True:
                assert p.poll() is None, p.stderr.read().decode()
                try:
                    socket.create_connection((host, port), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"router on {host}:{port} did not start"
                    time.sleep(0.2)
        yield port, key
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.mark.asyncio
async def test_chart_environment_fanout_reaches_every_real_router_pod(kmock, two_routers):
    from zoe_cluster.k8s import fanout_from_env

    port, key = two_routers
    kmock.resources["v1/pods"] = {}
    core = core_api(host=str(kmock.url))
    for p in [_pod("zoe-router-a", "127.0.0.1"), _pod("zoe-router-b", "127.0.0.2"), _pod("zoe-router-c", "127.0.0.3", ready=False)]:
        await asyncio.to_thread(core.create_namespaced_pod, "serving", p)
    env = {"ZOE_K8S_NAMESPACE": "serving", "ZOE_K8S_ROUTER_SELECTOR": SELECTOR, "ZOE_K8S_ROUTER_PORT": str(port),
           "ZOE_ROUTER_ADMIN_KEY": key}
    assert fanout_from_env({}) is None  # not under the chart
    with httpx.Client() as http:
        fan = fanout_from_env(env, core=core, http=http)
        res = await asyncio.to_thread(fan.publish, _membership(5))
        assert sorted(res.applied) == ["zoe-router-a", "zoe-router-b"] and not res.failed
        for host in ("127.0.0.1", "127.0.0.2"):
            got = (await asyncio.to_thread(http.get, f"http://{host}:{port}/admin/membership",
                                           headers={"Authorization": f"Bearer {key}"})).json()
            assert got["version"] == 5 and [r["id"] for r in got["replicas"]] == ["glm-5.3/0/1"]
        # Ray restarted the controller: it counts from 1 again; the real routers (409) are moved past their version.
        fresh = fanout_from_env(env, core=core, http=http)
        res = await asyncio.to_thread(fresh.publish, _membership(1))
        assert sorted(res.applied) == ["zoe-router-a", "zoe-router-b"] and fresh.base == 5
        got = (await asyncio.to_thread(http.get, f"http://127.0.0.1:{port}/admin/membership",
                                       headers={"Authorization": f"Bearer {key}"})).json()
        assert got["version"] == 6
        bad = fanout_from_env(env | {"ZOE_ROUTER_ADMIN_KEY": "wrong"}, core=core, http=http)
        res = await asyncio.to_thread(bad.publish, _membership(6))
        assert set(res.failed) == {"zoe-router-a", "zoe-router-b"} and "401" in res.failed["zoe-router-a"]


def test_fanout_load_sums_every_router_pods_own_counts():
    """The controller's switcher reads the load the router pods carry (MockTransport stand-ins for the pods'
    `GET /admin/load`): counts add up across pods key by key, a dead pod or one that answers no report adds
    nothing, and with no pod answering there is no report."""
    from zoe_cluster.routing.load_report import LoadReport

    reports = {
        "10.0.0.1": LoadReport(in_flight={"d/0/1": 3, "d/1/1": 1}, in_flight_by_class={"interactive": 1, "standard": 3},
                               prefill_tokens_by_class={"interactive": 500, "standard": 9000}),
        "10.0.0.2": LoadReport(in_flight={"d/0/1": 2}, in_flight_by_class={"standard": 2},
                               prefill_tokens_by_class={"standard": 100}),
    }

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/admin/load" and request.headers["authorization"] == "Bearer k"
        if request.url.host == "10.0.0.3":
            raise httpx.ConnectError("down", request=request)
        if request.url.host == "10.0.0.4":
            return httpx.Response(200, json={"in_flight": {"d/0/1": "many"}})  # not a report
        return httpx.Response(200, content=reports[request.url.host].model_dump_json())

    eps = [RouterEndpoint(f"r-{i}", f"http://10.0.0.{i}:8001") for i in (1, 2, 3, 4)]
    fan = MembershipFanout(lambda: eps, "k", httpx.Client(transport=httpx.MockTransport(handler)))
    assert fan.load() == LoadReport(in_flight={"d/0/1": 5, "d/1/1": 1},
                                    in_flight_by_class={"interactive": 1, "standard": 5},
                                    prefill_tokens_by_class={"interactive": 500, "standard": 9100})
    eps[:] = eps[2:]
    assert fan.load() is None
