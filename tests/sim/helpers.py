"""Start `zoe sim serve` as a real process on a loopback port, and stop it by PID."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from tests.conftest import REPO, free_port


@contextmanager
def sim_server(*args: str, env: dict[str, str] | None = None, wait_ready: bool = True,
               log: Path | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    cmd = [sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve", "--host", "127.0.0.1", "--port", str(port),
           *args]
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"zoe sim serve exited with {proc.returncode}")
            try:
                r = httpx.get(url + "/health", timeout=2)
                if r.status_code == 200 or (not wait_ready and r.status_code == 503):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("zoe sim serve did not come up in 60 s")
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log:
            out.close()  # type: ignore[union-attr]
