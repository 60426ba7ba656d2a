"""Fixtures shared by every test area: the engines' test environments and free loopback ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIRD_PARTY = REPO / "third_party"
"""Data copied from other projects (CRD schemas, public request traces; third_party/README.md)."""
TRACES = THIRD_PARTY / "traces"
TEST_ENVS = Path(os.environ.get("ZOE_TEST_ENVS", Path.home() / ".cache/zoe/test-envs"))


def _env_python(var: str, name: str) -> str:
    """The python of an engine's test venv; in CI a missing one is a failure, not a skip."""
    path = Path(os.environ.get(var, TEST_ENVS / name / "bin/python"))
    if not path.exists() or not (path.parent.parent / ".zoe-ready").exists():
        msg = f"{name} test environment missing at {path}: run scripts/setup_test_envs.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return str(path)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return _env_python("ZOE_VLLM_PYTHON", "vllm")


@pytest.fixture(scope="session")
def sglang_python() -> str:
    return _env_python("ZOE_SGLANG_PYTHON", "sglang")


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()
