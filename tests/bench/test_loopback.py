"""The benchmarks' loopback fleet (`zoe_cluster.bench.loopback`): router names parsed into command lines, and a
real fleet of two `zoe sim serve` replicas behind zoe's router that answers, then is gone by PID."""

from __future__ import annotations

import os

import httpx
import pytest

from zoe_cluster.bench.loopback import RouterSpec, router_process, sim_replicas


def test_router_names_give_their_command_lines() -> None:
    spec = RouterSpec.parse("zoe-prefix:hit_weight=2,session_tokens=0")
    assert (spec.kind, spec.policy, spec.policy_config) == ("zoe", "prefix", ("hit_weight=2", "session_tokens=0"))
    argv = spec.argv(8000, ["http://a", "http://b"], model="glm-5.3", kv_capacity_tokens=1000)
    assert argv[argv.index("--policy") + 1] == "prefix" and argv[argv.index("--kv-capacity-tokens") + 1] == "1000"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--policy-config"] == ["hit_weight=2", "session_tokens=0"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--replica"] == ["http://a", "http://b"]
    assert spec.served_model("glm-5.3") == "glm-5.3"

    peer = RouterSpec.parse("sglang-router-cache_aware")
    argv = peer.argv(9000, ["http://a"], model="glm-5.3", peer_python="/p/python")
    assert argv[:3] == ["/p/python", "-m", "sglang_router.launch_router"]
    assert argv[argv.index("--policy") + 1] == "cache_aware" and argv[argv.index("--worker-urls") + 1] == "http://a"
    assert peer.served_model("glm-5.3") == "unknown"  # what sglang-router lists in /v1/models

    with pytest.raises(ValueError, match="router 'nginx'"):
        RouterSpec.parse("nginx")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie not yet reaped by its parent still answers signal 0: read its state
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_fleet_of_simulated_replicas_behind_zoes_router_serves_and_stops(tmp_path) -> None:
    with sim_replicas(2, model="glm-5.3", time_scale=0.01, log_dir=tmp_path) as urls:
        assert len(set(urls)) == 2
        with router_process(RouterSpec.parse("zoe-round_robin"), urls, model="glm-5.3", log_dir=tmp_path,
                            settle_s=0.0) as router:
            seen = set()
            for _ in range(2):
                r = httpx.post(router.url + "/v1/completions", timeout=30,
                               json={"model": "glm-5.3", "prompt": "hello " * 20, "max_tokens": 3})
                assert r.status_code == 200, r.text
                seen.add(r.headers["x-zoe-replica"])
            assert len(seen) == 2  # round robin reached both replicas
            pid = router.pid
        assert _gone(pid)
    for url in urls:  # the replicas are stopped too
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
