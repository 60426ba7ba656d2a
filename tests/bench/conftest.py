"""Servers the bench tests measure: zoe's simulated engine (`zoe sim serve`) in vLLM and SGLang metrics modes."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import REPO, free_port

SIM_TIME_SCALE = 0.05
"""Wall seconds per modelled second: GLM-5.3's 0.44 s TTFT at 8K takes 22 ms."""


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


def start_sim(*extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve", "--model", "glm-5.3", "--variant",
            "fp8-tp8", "--port", str(port), "--time-scale", str(SIM_TIME_SCALE), "--startup-s", "0", *extra]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc, url


@pytest.fixture(scope="module")
def sim_url():
    """A simulated GLM-5.3 (fp8-tp8 baseline) replica with vLLM's metric names."""
    proc, url = start_sim()
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def sim_sglang_url():
    """The same simulated replica exposing SGLang's metric names (`sglang:cached_tokens_total`, ...)."""
    proc, url = start_sim("--metrics", "sglang")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
