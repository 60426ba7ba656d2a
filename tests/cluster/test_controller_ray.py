"""The controller on a real local Ray: deploy, heal (crash, hang, lost actor), scale, swap, undeploy.

Engines are the simulated engine (`zoe sim serve`, 100x time scale, ready in under a second) and traffic goes
through the real router the controller starts, so these tests exercise placement, supervision and membership end
to end.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.cluster.conftest import sim_spec, group_members, pid_alive, wait_for
from tests.conftest import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def deployment(ray_cluster):
    """Two replicas of glm-5.3 (8 GPUs each) behind a router; torn down at the end of the module."""
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    port = free_port()
    handle = create_deployment(sim_spec("heal", replicas=2, router_port=port), ray_cluster)
    st = ray.get(handle.wait_ready.remote(60))
    assert st["replicas_ready"] == 2, st
    yield handle, f"http://127.0.0.1:{port}"
    if "heal" in __import__("zoe_cluster.cluster.client", fromlist=["x"]).list_deployments():
        remove_deployment("heal")


def _cmdlines(pids: list[int]) -> list[str]:
    out = []
    for p in pids:
        try:
            out.append(open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:120])
        except OSError:
            pass
    return out


def status(handle) -> dict:
    import ray

    return ray.get(handle.status.remote())


def replica(handle, index: int) -> dict:
    return next(r for r in status(handle)["replicas"] if r["index"] == index)


class Traffic:
    """Requests through the router in a background thread; records every status code."""

    def __init__(self, url: str):
        self.url, self.codes, self.errors = url, [], []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with httpx.Client(timeout=10) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url + "/v1/completions", json={"model": "glm-5.3", "prompt": "hi", "max_tokens": 1})
                    self.codes.append(r.status_code)
                    if r.status_code != 200:
                        self.errors.append(r.text[:200])
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))
                time.sleep(0.02)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(15)


def test_replicas_get_disjoint_gpus_and_serve_through_router(deployment):
    handle, url = deployment
    st = status(handle)
    gpus = [tuple(r["gpu_ids"][0]) for r in st["replicas"]]
    assert all(len(g) == 8 for g in gpus) and len(set(gpus[0]) | set(gpus[1])) == 16
    assert st["endpoint"] == url + "/v1"
    assert {r["state"] for r in st["replicas"]} == {"ready"}
    import ray

    m = ray.get(handle.membership_view.remote())
    assert sorted(r["id"] for r in m["replicas"]) == ["heal/0/1", "heal/1/1"]
    for _ in range(6):
        r = httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "x", "max_tokens": 1}, timeout=10)
        assert r.status_code == 200, r.text
    served = [generated_tokens(rep["url"]) for rep in st["replicas"]]
    assert all(n > 0 for n in served), served  # round robin reached both replicas


def generated_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:generation_tokens_total"))


def test_engine_killed_by_the_pid_status_shows_is_healed_while_traffic_continues(deployment):
    """`zoe status` shows the engine's pid (not the launcher's, which exited at once) and its process group apart:
    `kill -9 PID` ends the engine, and the controller starts a new generation on the same GPUs."""
    from zoe_cluster.cli.common import console
    from zoe_cluster.cli.deploy import render_status

    handle, url = deployment
    before = replica(handle, 0)
    pid, pgid = before["pids"][0], before["process_groups"][0]
    assert pid != pgid and pid_alive(pid) and not pid_alive(pgid)  # the group's id is the launcher's, long gone
    assert pid in group_members(pgid) and "sim serve" in _cmdlines([pid])[0]
    width, console.width = console.width, 400  # one line per replica, nothing cut
    try:
        with console.capture() as shown:
            render_status(status(handle))
    finally:
        console.width = width
    assert f" {pid} " in shown.get() and f" {pgid} " in shown.get()
    with Traffic(url) as traffic:
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        after = wait_for(lambda: (r := replica(handle, 0))["generation"] > before["generation"]
                         and r["state"] == "ready" and r, 30, what="replica 0 back on a new generation")
        time.sleep(0.5)
    assert after["restarts"] == before["restarts"] + 1
    assert after["gpu_ids"] == before["gpu_ids"]  # same gang, same GPUs: only the process was restarted
    assert traffic.codes and not traffic.errors, traffic.errors[:5]
    assert not group_members(pgid)
    hist = status(handle)["history"]
    assert any(h["id"] == before["id"] and h["state"] == "failed" and "exited" in h["failure"] for h in hist)


def test_hung_engine_is_detected_and_restarted(deployment):
    handle, url = deployment
    before = replica(handle, 1)
    pgid = before["process_groups"][0]
    os.killpg(pgid, signal.SIGSTOP)  # alive but answers nothing: only /health timeouts can tell
    after = wait_for(lambda: (r := replica(handle, 1))["generation"] > before["generation"]
                     and r["state"] == "ready" and r, 40, what="hung replica 1 replaced")
    failed = next(h for h in status(handle)["history"] if h["id"] == before["id"])
    assert failed["state"] == "failed" and failed["failure"].startswith("hung")
    wait_for(lambda: not group_members(pgid), 15, what="the stopped engine's group to be killed")
    assert after["url"] != before["url"]


def test_killed_node_actor_is_replaced_and_its_engine_not_orphaned(deployment):
    handle, url = deployment
    before = replica(handle, 0)
    engine_group = before["process_groups"][0]
    actor_pid = before["member_pids"][0]
    # the engine's supervisor watches this actor (it is detached, not the actor's child)
    assert any(f"--owner-pid {actor_pid} " in c for c in _cmdlines(group_members(engine_group)))
    with Traffic(url) as traffic:
        os.kill(actor_pid, signal.SIGKILL)
        wait_for(lambda: not group_members(engine_group), 20, what="the engine to die with its actor")
        after = wait_for(lambda: (r := replica(handle, 0))["generation"] > before["generation"]
                         and r["state"] == "ready" and r, 40, what="replica 0 re-placed")
    assert after["process_groups"][0] != engine_group
    assert traffic.codes and not traffic.errors, traffic.errors[:5]
    failed = next(h for h in status(handle)["history"] if h["id"] == before["id"])
    assert "node actor" in failed["failure"]


def test_swap_replica_drains_then_starts_new_variant_on_same_gpus(deployment):
    import ray

    handle, url = deployment
    before = replica(handle, 1)
    with Traffic(url) as traffic:
        new = ray.get(handle.swap_replica.remote(1, "mxfp4-tp8"), timeout=60)
    assert new["variant"] == "mxfp4-tp8" and new["state"] == "ready"
    assert new["generation"] == before["generation"] + 1
    assert new["gpu_ids"] == before["gpu_ids"]
    old = next(h for h in status(handle)["history"] if h["id"] == before["id"])
    whats = [e["what"] for e in old["events"]] if old["events"] else []
    assert old["state"] == "stopped" and old["drain_requested_at"] is not None, (old, whats)
    assert traffic.codes and not traffic.errors, traffic.errors[:5]
    m = ray.get(handle.membership_view.remote())
    assert {r["variant"] for r in m["replicas"]} == {"fp8-tp8", "mxfp4-tp8"}
    swapped = {f["index"]: f["last_swap_at"] for f in ray.get(handle.fleet.remote())}
    assert swapped[1] is not None and swapped[0] is None
    with pytest.raises(ray.exceptions.RayTaskError, match="no variant"):
        ray.get(handle.swap_replica.remote(0, "nope"))


def test_switch_all_rolls_one_replica_at_a_time(deployment):
    import ray

    handle, url = deployment
    before = {r["index"]: r for r in status(handle)["replicas"]}
    with Traffic(url) as traffic:
        st = ray.get(handle.switch.remote("fp8-tp8-fused-moe"), timeout=120)
    assert {r["variant"] for r in st["replicas"]} == {"fp8-tp8-fused-moe"} and st["variant"] == "fp8-tp8-fused-moe"
    assert st["replica_variants"] == {}
    old = {h["index"]: h for h in st["history"] if h["id"] in {r["id"] for r in before.values()}}
    new = {r["index"]: r for r in st["replicas"]}
    # replica 1 was drained only after replica 0 was back, on its new variant
    assert old[1]["drain_requested_at"] >= new[0]["ready_at"]
    assert traffic.codes and not traffic.errors, traffic.errors[:5]


def test_router_that_dies_is_restarted_with_the_membership(deployment):
    import ray

    handle, url = deployment
    router_pgid = ray.get(handle.__ray_call__.remote(lambda self: self.router.link.proc.pgid))
    os.killpg(router_pgid, signal.SIGKILL)

    def serving():
        try:
            r = httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "x", "max_tokens": 1},
                           timeout=5)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(serving, 30, what="the router back, routing to the replicas")
    st = status(handle)
    assert st["router_restarts"] == 1 and st["router_error"] is None


def test_scale_down_and_up(deployment):
    import ray
    from ray.util import placement_group_table

    handle, url = deployment

    def live_pgs():
        return [p for p in placement_group_table().values() if p["state"] == "CREATED"]

    with pytest.raises(ray.exceptions.RayTaskError, match="3 replicas need 24 GPUs"):
        ray.get(handle.scale.remote(3))
    st = ray.get(handle.scale.remote(1))
    wait_for(lambda: len(status(handle)["replicas"]) == 1 and len(live_pgs()) == 1, 30, what="scale down to 1")
    wait_for(lambda: ray.available_resources().get("GPU") == 8, 15, what="8 GPUs free again")  # lags a little
    ray.get(handle.scale.remote(2))
    st = wait_for(lambda: (s := status(handle))["replicas_ready"] == 2 and s, 30, what="scale up to 2")
    assert len(live_pgs()) == 2
    assert st["replicas_desired"] == 2


def test_fleet_view_for_the_switcher(deployment):
    import ray

    handle, url = deployment
    fleet = ray.get(handle.fleet.remote())
    assert [f["index"] for f in fleet] == [0, 1]
    assert all(f["state"] == "ready" and f["replica_id"].startswith("heal/") for f in fleet)
    counts = ray.get(handle.in_flight.remote())
    assert set(counts) == {f["replica_id"] for f in fleet} and all(v >= 0 for v in counts.values())


def test_restarted_controller_resumes_the_latest_intent(deployment):
    import ray

    from zoe_cluster.cluster.client import get_controller

    handle, url = deployment
    before = {r["index"]: r for r in status(handle)["replicas"]}
    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    os.kill(pid, signal.SIGKILL)  # Ray restarts it (max_restarts=-1); its gangs and router died with it
    for r in before.values():
        wait_for(lambda: not group_members(r["process_groups"][0]), 30, what=f"old engines of {r['id']} to die with the "
                 f"controller: {[(p, pid_alive(p)) for p in r['member_pids']]} {_cmdlines(group_members(r['pids'][0]))}")

    def resumed():
        try:
            st = ray.get(get_controller("heal").status.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - restarting
            return None
        return st if st["replicas_ready"] == 2 else None

    st = wait_for(resumed, 60, what="2 replicas ready under the restarted controller")
    for r in st["replicas"]:  # new engines are new generations: ids never repeat
        assert r["generation"] > before[r["index"]]["generation"], (r["id"], before[r["index"]]["id"])
    assert httpx.post(url + "/v1/completions", json={"model": "glm-5.3", "prompt": "x", "max_tokens": 1},
                      timeout=10).status_code == 200


def test_undeploy_leaves_no_process_behind(deployment):
    import ray
    from ray.util import placement_group_table

    from zoe_cluster.cluster.client import list_deployments, remove_deployment

    handle, url = deployment
    st = status(handle)
    groups = [r["process_groups"][0] for r in st["replicas"]]
    actor_pids = [p for r in st["replicas"] for p in r["member_pids"]]
    router_port = int(url.rsplit(":", 1)[1])
    remove_deployment("heal")
    assert "heal" not in list_deployments()
    for g in groups:
        wait_for(lambda: not group_members(g), 15, what=f"engine group {g} gone")
    wait_for(lambda: not [p for p in actor_pids if pid_alive(p)], 20, what="node actors gone")
    assert not [p for p in placement_group_table().values() if p["state"] == "CREATED"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{router_port}/health", timeout=2)
    wait_for(lambda: ray.available_resources().get("GPU") == 16, 15, what="all 16 GPUs free")
