"""`zoe deploy MODEL` with no flags on a Ray cluster without GPUs: the simulated engine (said so), two replicas,
a fast simulated load, serving within a minute."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpuless_cluster():
    """A real local Ray with 16 fake GPUs and no accelerator type: what `zoe deploy` starts on a laptop."""
    ray = pytest.importorskip("ray")
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_gpus=16, num_cpus=4, include_dashboard=False, namespace="zoe",
             _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _zoe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.ray
@pytest.mark.slow
def test_deploy_with_no_flags_serves_simulated_replicas_within_a_minute(gpuless_cluster):
    port = free_port()
    started = time.monotonic()
    r = _zoe("deploy", "glm-5.3", "--address", gpuless_cluster, "--port", str(port), "--name", "plain")
    elapsed = time.monotonic() - started
    try:
        out = " ".join((r.stdout + r.stderr).split())
        assert r.returncode == 0, out
        assert "no GPUs in the Ray cluster" in out and "serving on the simulated engine" in out
        assert "2 x fp8-tp8-zoe on sim" in out  # the recipe's default variant, two replicas on 16 fake GPUs
        assert "loads for" not in out  # the fast load: no warning about the real one
        assert elapsed < 60, f"zoe deploy took {elapsed:.0f}s"
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30, json={
            "model": "glm-5.3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    finally:
        _zoe("undeploy", "plain", "--address", gpuless_cluster, "--force")


def test_an_unknown_sim_load_time_is_refused_before_touching_ray():
    r = _zoe("deploy", "glm-5.3", "--sim-load-time", "slow", timeout=60)
    assert r.returncode != 0 and "--sim-load-time must be one of fast, real" in " ".join(r.stderr.split())


@pytest.mark.parametrize("resources, local, machine_gpus, has", [
    ({"GPU": 16.0, "CPU": 4.0}, True, 0, False),  # zoe's local Ray on a laptop: fake GPUs only
    ({"GPU": 16.0, "accelerator_type:AMD-Instinct-MI355X-OAM": 2.0}, False, 0, True),  # MI355X nodes joined
    ({"CPU": 8.0}, False, 0, False),  # a head without GPU workers
    ({"GPU": 8.0}, True, 8, True),  # a local Ray on a GPU machine whose type Ray did not name
])
def test_gpus_are_real_when_ray_names_their_type_or_the_machine_has_devices(monkeypatch, resources, local,
                                                                            machine_gpus, has):
    ray = pytest.importorskip("ray")

    from zoe_cluster.cli import deploy

    monkeypatch.setattr(ray, "cluster_resources", lambda: resources)
    monkeypatch.setattr("zoe_cluster.cluster.bootstrap.detect_gpus", lambda: machine_gpus)
    assert deploy._cluster_has_gpus(local) is has


@pytest.mark.parametrize("gpus, per_replica, replicas", [(16.0, 8, 2), (8.0, 8, 1), (64.0, 8, 2), (0.0, 8, 1)])
def test_simulated_replicas_default_to_two_where_they_fit(monkeypatch, gpus, per_replica, replicas):
    ray = pytest.importorskip("ray")

    from zoe_cluster.cli import deploy

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": gpus})
    assert deploy._sim_replicas(per_replica) == replicas
