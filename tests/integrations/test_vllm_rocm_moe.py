"""On ROCm, AITER's MoE (pre-shuffled weights) and zoe's fused MoE exclude each other: what the plugin does."""

from __future__ import annotations

import os

import pytest

from zoe_kernels.integrations import vllm_plugin
from zoe_kernels.integrations.report import KernelReporter


@pytest.fixture
def fake_vllm_rocm(monkeypatch, tmp_path):
    """patch_vllm on "rocm" with stand-in specs (no vLLM needed) and a clean AITER environment."""
    for name in ("VLLM_ROCM_USE_AITER", "VLLM_ROCM_USE_AITER_MOE"):
        monkeypatch.setenv(name, "x")  # so that monkeypatch restores (removes) what the plugin sets
        monkeypatch.delenv(name)
    installed = []
    spec = vllm_plugin.PatchSpec("fused_moe", "m:TritonExperts.apply", (), ("0", "1"), lambda f: f)
    monkeypatch.setattr(vllm_plugin, "KERNEL_SPECS", {"fused_moe": lambda platform, rep: [spec]})

    def install(kernel, specs, engine, version, reporter, platform=None):
        installed.append(kernel)
        return True

    monkeypatch.setattr(vllm_plugin, "install_kernel", install)
    return KernelReporter("vllm", "0.32.0", ["fused_moe"], tmp_path), installed


def _run(reporter):
    return vllm_plugin.patch_vllm(["fused_moe"], reporter, "rocm", "0.32.0")


def test_without_aiter_nothing_changes(fake_vllm_rocm):
    rep, installed = fake_vllm_rocm
    assert _run(rep) == ["fused_moe"] and installed == ["fused_moe"]
    assert "VLLM_ROCM_USE_AITER_MOE" not in os.environ and rep.report.notes == []


def test_aiter_on_switches_only_its_moe_off_and_says_so(fake_vllm_rocm, monkeypatch):
    rep, installed = fake_vllm_rocm
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    assert _run(rep) == ["fused_moe"]
    assert os.environ["VLLM_ROCM_USE_AITER_MOE"] == "0"
    assert "VLLM_ROCM_USE_AITER_MOE=0" in rep.report.notes[0]


def test_pinned_aiter_moe_is_respected_with_a_loud_fallback(fake_vllm_rocm, monkeypatch):
    rep, installed = fake_vllm_rocm
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    monkeypatch.setenv("VLLM_ROCM_USE_AITER_MOE", "1")
    assert _run(rep) == [] and installed == []
    assert rep.report.fallbacks[0]["reason"] == "engine_backend"


@pytest.mark.parametrize("kernels, platform, env, want", [
    (["fused_moe"], "rocm", {"VLLM_ROCM_USE_AITER": "1"}, {"VLLM_ROCM_USE_AITER_MOE": "0"}),
    (["fused_moe"], "rocm", {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MOE": "1"}, {}),  # pinned: wins
    (["fused_moe"], "rocm", {}, {}),  # AITER off: nothing to switch
    (["lightning_indexer"], "rocm", {"VLLM_ROCM_USE_AITER": "1"}, {}),  # AITER's MoE does not block the indexer
    (["fused_moe"], "cuda", {"VLLM_ROCM_USE_AITER": "1"}, {}),
])  # fmt: skip
def test_adapter_switches_aiter_moe_off_at_launch_only_for_zoes_rocm_moe(kernels, platform, env, want):
    from zoe_cluster.engines.vllm import aiter_moe_env

    assert aiter_moe_env(kernels, platform, env) == want
