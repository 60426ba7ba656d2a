"""A benchmark fleet on loopback: N `zoe sim serve` replicas and one router (zoe's, or sglang-router as the peer)
in front of them, each a process in its own group, started, waited on until healthy, and stopped by PID.

    with sim_replicas(4, model="glm-5.3", time_scale=1.0, log_dir=tmp) as urls:
        with router_process(RouterSpec.parse("zoe-prefix"), urls, model="glm-5.3", log_dir=tmp) as router:
            ... drive router.url ...

A router is named as the benchmarks name it: "zoe-<policy>[:key=value,...]" (policy tunables passed as
`--policy-config`) or "sglang-router-<policy>" (PyPI `sglang-router`, run by `peer_python`). sglang-router lists
its model as "unknown" in /v1/models and clients ask for what is listed, so behind it the replicas serve that name
(`RouterSpec.served_model`); the engines are the same either way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

ZOE = [sys.executable, "-m", "zoe_cluster.cli.main"]
SGLANG_UNLISTED_MODEL = "unknown"
"""The model name sglang-router's /v1/models lists."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Return once GET `url` answers 200; raise after `timeout_s`, or at once when `proc` exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: its process {proc.pid} exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s:g} s")


def spawn(argv: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start `argv` in a new process group (so `stop` ends it with its children), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd)


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM the process group led by `proc` (by its PID), SIGKILL it when it outlives `timeout_s`."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def sim_replicas(n: int, *, model: str, time_scale: float, log_dir: Path, served_model: str | None = None,
                 extra_args: tuple[str, ...] = ()) -> Iterator[list[str]]:
    """`n` fresh `zoe sim serve` replicas (empty caches, no startup delay) on loopback; yields their base URLs
    once all answer /health, stops them on exit."""
    if n <= 0:
        raise ValueError(f"replicas must be positive, got {n}")
    with ExitStack() as stack:
        urls = []
        for i in range(n):
            port = free_port()
            argv = [*ZOE, "sim", "serve", "--model", model, "--port", str(port), "--time-scale", str(time_scale),
                    "--startup-s", "0", "--served-model-name", served_model or model, *extra_args]
            proc = spawn(argv, log_dir / f"sim-{port}.log")
            stack.callback(stop, proc)
            urls.append((f"http://127.0.0.1:{port}", proc))
        for url, proc in urls:
            wait_http(url + "/health", proc=proc)
        yield [u for u, _ in urls]


@dataclass(frozen=True)
class RouterSpec:
    """Which router fronts the replicas (see the module docstring for the names)."""

    name: str
    kind: str
    """"zoe" or "sglang-router"."""
    policy: str
    policy_config: tuple[str, ...] = ()
    """zoe's `--policy-config key=value` items."""

    @classmethod
    def parse(cls, name: str) -> "RouterSpec":
        if name.startswith("zoe-"):
            policy, _, tunables = name.removeprefix("zoe-").partition(":")
            return cls(name, "zoe", policy, tuple(filter(None, tunables.split(","))))
        if name.startswith("sglang-router-"):
            return cls(name, "sglang-router", name.removeprefix("sglang-router-"))
        raise ValueError(f"router '{name}': expected zoe-<policy>[:key=value,...] or sglang-router-<policy>")

    def served_model(self, model: str) -> str:
        """The model name the replicas serve behind this router (and clients ask for)."""
        return model if self.kind == "zoe" else SGLANG_UNLISTED_MODEL

    def argv(self, port: int, urls: list[str], *, model: str, kv_capacity_tokens: int | None = None,
             peer_python: str = "python", extra_args: tuple[str, ...] = ()) -> list[str]:
        """The router's command line on `port` in front of `urls`. `kv_capacity_tokens` is what the controller
        would push in membership, so zoe's prefix index is sized to the replicas' KV cache."""
        if self.kind == "zoe":
            argv = [*ZOE, "router", "--port", str(port), "--model", model, "--policy", self.policy, "--engine", "sim"]
            if kv_capacity_tokens is not None:
                argv += ["--kv-capacity-tokens", str(kv_capacity_tokens)]
            for kv in self.policy_config:
                argv += ["--policy-config", kv]
            for u in urls:
                argv += ["--replica", u]
            return [*argv, *extra_args]
        # sglang-router's default Prometheus port 29000 may be taken: give it a free one
        return [peer_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", *urls, "--policy", self.policy, "--log-level", "warn", "--prometheus-port",
                str(free_port()), *extra_args]


@dataclass(frozen=True)
class RunningRouter:
    url: str
    pid: int
    argv: list[str]


@contextmanager
def router_process(spec: RouterSpec, urls: list[str], *, model: str, log_dir: Path,
                   kv_capacity_tokens: int | None = None, peer_python: str = "python",
                   extra_args: tuple[str, ...] = (), settle_s: float = 1.0) -> Iterator[RunningRouter]:
    """The router of `spec` in front of `urls` on a free loopback port; yields once it answers /health (plus
    `settle_s` for its first health checks of the replicas), stops it on exit."""
    port = free_port()
    argv = spec.argv(port, urls, model=model, kv_capacity_tokens=kv_capacity_tokens, peer_python=peer_python,
                     extra_args=extra_args)
    proc = spawn(argv, log_dir / f"router-{spec.name}.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", proc=proc)
        time.sleep(settle_s)
        yield RunningRouter(url, proc.pid, argv)
    finally:
        stop(proc)
