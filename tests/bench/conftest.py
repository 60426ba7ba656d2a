"""Servers the bench tests measure: a fake engine subprocess (until zoe's simulated engine is used)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO, free_port


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


@pytest.fixture(scope="module")
def fake_engine_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.bench.fake_engine", str(port)], cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
