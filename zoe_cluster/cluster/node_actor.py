"""The per-node member of a replica gang: holds the node's GPUs (its placement-group bundle) and runs the engine.

Ray schedules one `NodeMember` actor into each bundle of the replica's placement group with `num_gpus` equal to
the bundle's GPUs, so `ray.get_gpu_ids()` inside it are exactly the devices this node's engine may use. The
engine runs under `supervisor` in its own process group: if this actor dies (ray.kill, node trouble), the
supervisor takes the group down, so no engine is ever orphaned.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from zoe_cluster.cluster.process_group import Supervised, group_alive, spawn_supervised


def detect_platform() -> str:
    """rocm when the node has AMD's GPU driver (/dev/kfd), cuda for NVIDIA's, else cpu."""
    if os.path.exists("/dev/kfd"):
        return "rocm"
    if os.path.exists("/dev/nvidiactl"):
        return "cuda"
    return "cpu"


def default_log_dir() -> Path:
    """<ray session dir>/logs/zoe on this node (where `ray logs` looks too), or a temp folder without Ray."""
    try:
        import ray

        return Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "zoe"
    except Exception:  # noqa: BLE001 - outside a Ray worker
        import tempfile

        return Path(tempfile.gettempdir()) / "zoe-logs"


class NodeMember:
    """One node of one replica. Plain class; the controller wraps it with `ray.remote` and placement options."""

    def __init__(self, replica_id: str, node_rank: int, log_dir: str | None = None):
        self.replica_id = replica_id
        self.node_rank = node_rank
        self.log_dir = Path(log_dir) if log_dir else default_log_dir()
        self.proc: Supervised | None = None
        self.log_path: Path | None = None

    def info(self) -> dict:
        """Where this member runs: node id and IP, hostname, the GPUs Ray gave it, platform, pid."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "gpu_ids": [int(g) if str(g).isdigit() else g for g in ray.get_gpu_ids()],
            "platform": detect_platform(),
            "pid": os.getpid(),
        }

    def free_port(self, host: str) -> int:
        """A port nobody listens on now at `host` on this node (for the engine and SGLang's dist-init)."""
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def start(self, argv: list[str], env: dict[str, str], log_name: str) -> dict[str, int] | None:
        """Start the engine (argv with env on top of this actor's environment); returns {"pid": the engine's pid,
        "process_group": its group's id}, or None for a member that only holds GPUs (e.g. vLLM's non-zero ranks
        run inside node 0's Ray executor)."""
        self.stop()
        if not argv:
            return None
        self.log_path = self.log_dir / log_name
        full_env = {**os.environ, **env}
        self.proc = spawn_supervised(argv, full_env, self.log_path, owner_pid=os.getpid(), python=sys.executable)
        return {"pid": self.proc.engine_pid, "process_group": self.proc.pgid}

    def poll(self) -> int | None:
        """The engine's exit code, or None while it runs (also None for a GPU-holding member)."""
        if self.proc is None:
            return None
        return self.proc.poll()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the engine's whole process group; returns its exit code (None if none ran)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        return proc.stop(grace_s)

    def alive_group(self) -> bool:
        return self.proc is not None and group_alive(self.proc.pgid)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            return f.read().decode(errors="replace")

    def __del__(self):  # graceful actor exit (ray.kill skips this; the supervisor covers that case)
        try:
            self.stop(grace_s=2.0)
        except Exception:  # noqa: BLE001
            pass
