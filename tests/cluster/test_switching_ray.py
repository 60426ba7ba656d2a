"""Recipe switching on a real local Ray: the controller's switcher sees the router's load, swaps a replica to
MXFP4 drain-first while clients keep sending, no request fails, and the switching metrics and `zoe status` show it.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.cluster.conftest import sim_spec, wait_for
from tests.conftest import free_port
from zoe_cluster.switching import SwitchConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = SwitchConfig(candidates=["fp8-tp8-nightly", "mxfp4-tp8"], window_s=2, interval_s=0.5, dwell_s=600,
                      horizon_s=7200, drain_s=1, load_time_scale=0.01)


def test_high_load_swaps_one_replica_to_mxfp4_without_failing_a_request(ray_cluster):
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    port = free_port()
    spec = sim_spec("swt", replicas=2, router_port=port, variant="fp8-tp8-nightly", switching=CONFIG,
                    metrics_port=0, engine_env={"ZOE_SIM_TIME_SCALE": "1", "ZOE_SIM_STARTUP_S": "0.3"})
    handle = create_deployment(spec, ray_cluster)
    stop = threading.Event()
    results = {"ok": 0, "failed": []}
    lock = threading.Lock()

    def client():
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"http://127.0.0.1:{port}/v1/completions",
                               json={"model": "glm-5.3", "prompt": "hello " * 50, "max_tokens": 60})
                    ok = r.status_code == 200
                except httpx.HTTPError as e:  # noqa: PERF203
                    ok, r = False, e
                with lock:
                    if ok:
                        results["ok"] += 1
                    else:
                        results["failed"].append(str(getattr(r, "text", r))[:200])
    try:
        assert ray.get(handle.wait_ready.remote(60))["replicas_ready"] == 2
        threads = [threading.Thread(target=client, daemon=True) for _ in range(64)]
        for t in threads:
            t.start()

        def swapped():
            st = ray.get(handle.status.remote())
            ready = [r for r in st["replicas"] if r["state"] == "ready" and r["variant"] == "mxfp4-tp8"]
            return st if ready and st["switching"]["recent_swaps"] else None

        st = wait_for(swapped, timeout_s=90, what="a replica swapped to mxfp4-tp8 and ready")
        stop.set()
        for t in threads:
            t.join(timeout=90)
        assert results["failed"] == [], results["failed"][:3]
        assert results["ok"] > 50
        swap = st["switching"]["recent_swaps"][0]
        assert swap["variant"] == "mxfp4-tp8" and "seed" not in swap["reason"] and "tok/s" in swap["reason"]
        assert swap["concurrency"] > 8
        text = httpx.get(st["metrics_url"]).text
        assert 'zoe_switch_swaps_total{outcome="started"}' in text
        assert 'zoe_switch_swaps_total{outcome="completed"} 1.0' in text or \
               'zoe_switch_swaps_total{outcome="completed"} 2.0' in text
        assert "zoe_switch_concurrency_estimate" in text
        router_metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'variant="mxfp4-tp8"' in router_metrics and "zoe_router_replica_info" in router_metrics
        # the router sizes its prefix index to the variant's KV capacity, pushed with membership
        from zoe_cluster.router.membership import Membership

        view = ray.get(handle.membership_view.remote())
        Membership.model_validate(view)  # what the controller also publishes to the Helm release's router pods
        members = view["replicas"]
        assert all(m["kv_capacity_tokens"] > 1_000_000 for m in members)
        # the simulated engine runs no zoe kernels, and status says so (it reports, it does not infer)
        assert all(r["kernels_active"] == [] for r in st["replicas"] if r["state"] == "ready"
                   and r.get("metrics_scraped_at"))
    finally:
        stop.set()
        remove_deployment("swt")
