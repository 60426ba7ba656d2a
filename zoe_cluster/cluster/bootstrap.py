"""Connecting the CLI to Ray: join a given cluster, find a running one, or start a local one (the embedded default).

A local cluster is started with `ray start --head` so it outlives the `zoe deploy` process that started it (the
controller is a detached actor living in it). On a machine without GPUs it declares fake GPUs, enough for
`--engine sim` replicas, which Ray then places exactly as it would real ones.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from zoe_cluster.cluster.controller import NAMESPACE

LOCAL_FAKE_GPUS = 16  # two 8-GPU nodes' worth for simulated replicas


def ray_env_defaults() -> None:
    """Settings every driver and `ray start` on a single machine needs (see docs/deploy.md)."""
    # Without this Ray rewrites 127.0.0.1 to another address on some machines and drivers hang for minutes.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # A local cluster started by zoe runs without token auth; a cluster that uses it sets this itself.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")


class NoCluster(RuntimeError):
    pass


def connect(address: str | None = None, start_local: bool = False, num_gpus: int | None = None) -> str:
    """ray.init into namespace "zoe" and return the cluster's GCS address.

    `address` (or $RAY_ADDRESS) names a cluster to join. Without one, a running local cluster is joined; if there
    is none, `start_local` starts one (else NoCluster).
    """
    ray_env_defaults()  # before `import ray`: Ray reads these when it is imported
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context().gcs_address
    address = address or os.environ.get("RAY_ADDRESS") or last_started_cluster()
    if not address:
        if not start_local:
            raise NoCluster("no Ray cluster is running here; pass --address or deploy first")
        address = start_local_cluster(num_gpus)
    _check_reachable(address)
    if address.split(":")[0] in ("127.0.0.1", "localhost"):
        # A loopback cluster: the driver must use loopback too, even if ray was imported before our env defaults.
        import ray._private.ray_constants as ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
    except ConnectionError as e:
        raise NoCluster(f"cannot reach the Ray cluster at {address}: {e}") from None
    return ray.get_runtime_context().gcs_address


def _check_reachable(address: str) -> None:
    """Fail fast on a host:port nobody listens on (ray.init would retry for a minute)."""
    if "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError) as e:
        raise NoCluster(f"cannot reach the Ray cluster at {address}: {e}") from None


def last_started_cluster() -> str | None:
    """The address `ray start --head` last recorded on this machine (Ray's own bookkeeping), if it still answers.

    Unlike ray.init(address="auto"), this never joins a cluster some other program started in-process.
    """
    try:
        from ray._private.utils import read_ray_address

        addr = read_ray_address()
    except Exception:  # noqa: BLE001 - private API moved: behave as if none
        return None
    if not addr:
        return None
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return addr
    except (OSError, ValueError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def detect_gpus() -> int:
    """Real GPUs on this machine (ROCm or NVIDIA device files), 0 when none."""
    if os.path.exists("/dev/kfd"):
        return len(list(Path("/dev/dri").glob("renderD*")))
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def start_local_cluster(num_gpus: int | None = None, num_cpus: int | None = None) -> str:
    """`ray start --head` on loopback with real GPUs, or LOCAL_FAKE_GPUS fake ones; returns its address."""
    gpus = num_gpus if num_gpus is not None else (detect_gpus() or LOCAL_FAKE_GPUS)
    port = _free_port()
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray") or "ray"
    cmd = [ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
           "--num-gpus", str(gpus), "--num-cpus", str(num_cpus or max(os.cpu_count() or 1, 4)),
           "--include-dashboard", "false", "--disable-usage-stats"]
    # A session of its own: Ctrl-C on (or a timeout of) the CLI that started it must not take the cluster down.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, start_new_session=True)
    if proc.returncode != 0:
        raise NoCluster(f"`ray start --head` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return f"127.0.0.1:{port}"
