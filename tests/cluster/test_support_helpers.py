"""The shared test helpers in tests/support: the tiny model builder's cache and its checks."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.tiny_model import build_tiny_model


def test_unknown_arch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny-model arch 'gpt9'"):
        build_tiny_model(tmp_path, "/nonexistent/python", "gpt9")


@pytest.mark.vllm
def test_tiny_model_is_built_once_and_shared(vllm_python):
    path = build_tiny_model(None, vllm_python, "qwen3_moe")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["vocab_size"] == 2048 and cfg["dtype"] == "bfloat16"
    assert (path / "tokenizer.json").exists() and "im_start" in (path / "chat_template.jinja").read_text()
    t = time.monotonic()
    assert build_tiny_model(None, vllm_python, "qwen3_moe") == path
    assert time.monotonic() - t < 0.5  # cached: no second build


def test_failed_build_reports_stderr_and_leaves_no_half_model(tmp_path):
    with pytest.raises(RuntimeError, match="building tiny llama model failed"):
        build_tiny_model(tmp_path, "/bin/false", "llama")
    assert not (tmp_path / "llama").exists()


def test_vllm_env_steers_vllm_off_amx_only_where_its_kernel_faults(monkeypatch):
    """Where the probe saw vLLM's AMX MoE kernel die, the servers' Python processes report no AMX tiles (the
    sitecustomize in tests/support/no_amx), so vLLM picks its vector MoE path; elsewhere nothing changes."""
    import subprocess
    import sys

    from tests.support import vllm_server

    monkeypatch.setattr(vllm_server, "amx_moe_faults", lambda python: python == "faulting")
    plain = vllm_server.vllm_env(python="fine")
    assert "ZOE_TEST_NO_AMX" not in plain and str(vllm_server.NO_AMX_DIR) not in plain.get("PYTHONPATH", "")
    env = vllm_server.vllm_env(python="faulting")
    assert env["ZOE_TEST_NO_AMX"] == "1" and env["PYTHONPATH"].split(":")[0] == str(vllm_server.NO_AMX_DIR)
    ask = "import torch; print(torch.cpu._is_amx_tile_supported())"
    out = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
