"""One real local Ray per test module (16 fake GPUs as two 8-GPU nodes' worth, MI355X-labelled), and spec helpers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

# Before anything imports ray (it reads these at import): keep every Ray address on loopback, no token auth.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec, HealthConfig
from zoe_cluster.recipes.loader import RecipeRegistry

MI355X = "AMD-Instinct-MI355X-OAM"

# Fast reactions: tests kill and hang engines on purpose and wait for the controller to notice.
FAST_HEALTH = HealthConfig(
    check_interval_s=0.5, check_timeout_s=2.0, failures_to_restart=2, load_timeout_s=90, placement_timeout_s=60,
    backoff_base_s=0.2, backoff_cap_s=2.0, stable_after_s=5.0, drain_timeout_s=5.0, stop_grace_s=2.0,
)


@pytest.fixture(scope="module")
def ray_cluster():
    """A real local Ray with 16 GPUs declared; yields its GCS address. Shared by the tests of one module."""
    ray = pytest.importorskip("ray")
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before the env above was set
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_gpus=16, num_cpus=4, include_dashboard=False, namespace="zoe",
             _node_ip_address="127.0.0.1", resources={f"accelerator_type:{MI355X}": 2}, log_to_driver=False,
             logging_level="ERROR")
    gcs = ray.get_runtime_context().gcs_address
    assert gcs.startswith("127.0.0.1:"), f"Ray left loopback ({gcs}): was ray imported before the env was set?"
    yield gcs
    ray.shutdown()


def glm():
    return RecipeRegistry.default().get("glm-5.3")


SIM_FAST_ENV = {"ZOE_SIM_TIME_SCALE": "0.01", "ZOE_SIM_STARTUP_S": "0.3"}


def sim_spec(name: str, replicas: int = 2, router_port: int | None = None, **kw) -> DeploymentSpec:
    """glm-5.3 on the simulated engine, 100x faster than the measured profile, ready in under a second."""
    return DeploymentSpec(
        name=name, recipe=glm(), variant=kw.pop("variant", "fp8-tp8"), replicas=replicas, engine="sim",
        engine_env=kw.pop("engine_env", SIM_FAST_ENV), health=kw.pop("health", FAST_HEALTH),
        router=DeploymentRouter(enabled=router_port is not None, host="127.0.0.1", port=router_port or 0,
                            policy="round_robin"),
        **kw,
    )


def wait_for(predicate, timeout_s: float = 60, interval_s: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids of process group `pgid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().split(")")[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out
