"""The zoe SGLang hook against the installed sglang 0.5.23 (a --no-deps install: its CUDA-only packages
are missing, so modules that import them cannot load here; what can be checked here is checked)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integrations.engine_envs import SGLANG_RELEASES, engine_env

PROBE = Path(__file__).with_name("_sglang_probe.py")
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.sglang


def _probe(sglang_python: str, *args: str, env: dict | None = None) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZOE_KERNELS")}
    proc = subprocess.run(
        [sglang_python, str(PROBE), *args], capture_output=True, text=True, timeout=300, env={**base, **(env or {})},
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_sglang_runs_the_hook_through_its_plugin_entry_point(sglang_python, tmp_path):
    out, log = _probe(sglang_python, "plugins", str(tmp_path))
    assert out["scheduler_loads_plugins"]  # so the hook runs in SGLang's worker processes too
    (rep,) = out["reports"]
    assert rep["engine"] == "sglang" and rep["engine_version"] == "0.5.23"
    fb = {f["kernel"]: f for f in rep["fallbacks"]}
    # this venv lacks the CUDA-only `flash_mla` wheel that SGLang's FlashMLA interface imports: a loud fallback
    assert fb["csa_dual_scope"]["reason"] == "missing_target", fb["csa_dual_scope"]
    assert "cannot import sglang.kernels.ops.attention.flash_mla_interface" in fb["csa_dual_scope"]["detail"]
    assert "FALLBACK: csa_dual_scope" in log
    if "csa_topk" in fb:  # this venv lacks SGLang's CUDA packages, so the DSv4 indexer cannot be imported
        assert fb["csa_topk"]["reason"] == "missing_target", fb["csa_topk"]
        assert "cannot import sglang.srt.layers.attention.dsv4.indexer" in fb["csa_topk"]["detail"]
    else:
        assert "csa_topk" in rep["patched"]


def test_replaced_functions_have_the_expected_parameters_in_sglang_0_5_23(sglang_python):
    out, _ = _probe(sglang_python, "sources")
    assert out["version"] == "0.5.23"
    assert out["v1"] == out["expected_v1"]
    assert out["v2"] == out["expected_v2"]
    assert out["flash_mla"] == out["expected_flash_mla"]
    assert out["hip_entry"] == out["expected_hip_entry"]


@pytest.mark.kernels
@pytest.mark.parametrize("release", SGLANG_RELEASES)
def test_zoe_paged_topk_matches_sglangs_own_transform(release):
    python, env = engine_env("sglang", release)
    out, _ = _probe(python, "topk", env={**env, "TRITON_INTERPRET": "1"})
    assert out["mismatches"] == []
    assert out["selected"] == 64 + 40 + 64 + 0 + 64  # rows shorter than k keep every entry


@pytest.mark.kernels
def test_patched_flashmla_decode_runs_zoes_paged_kernel_on_pools_sglang_wrote(sglang_python, tmp_path):
    """SGLang's real `flash_mla_interface.flash_mla_with_kvcache` (its CUDA wheel stubbed), patched by the
    hook and called the way DeepseekV4AttnBackend calls it, over pools written by SGLang's own store kernel."""
    out, _ = _probe(sglang_python, "dual_scope", str(tmp_path), env={"TRITON_INTERPRET": "1"})
    assert out["patched"] == ["csa_dual_scope"]
    assert out["backend_binds_interface"]  # the backend calls the function through the patched module attribute
    assert out["pool_bytes_match_sglang_writer"]  # zoe's test pools are byte-identical to SGLang's
    assert out["out_shape"] == [3, 1, 16, 512] and out["lse_shape"] == [3, 1, 16]
    assert out["rel_err"] < 2e-3 and out["lse_err"] < 1e-3  # fp16 q against the float64 reference
    assert out["engine_result"] == "engine" and out["engine_calls"] == 1  # a V4.1 pool went to SGLang's kernel
    (rep,) = out["reports"]
    assert rep["patched"]["csa_dual_scope"]["targets"] == [
        "sglang.kernels.ops.attention.flash_mla_interface:flash_mla_with_kvcache"
    ]
    assert rep["calls"]["csa_dual_scope"] == {"zoe": 1, "engine": 1}
    assert rep["engine_path_reasons"]["csa_dual_scope"] == {"layout": 1}
    # what `zoe status` shows: the replica's /metrics (ReportCollector over the report folder) parsed by the
    # SGLang adapter. The probe process has exited, so its report is re-dated to this live process.
    from prometheus_client import CollectorRegistry, generate_latest

    from zoe_cluster.engines.sglang import SglangAdapter
    from zoe_kernels.integrations.report import ReportCollector

    (path,) = tmp_path.glob("sglang-*.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": os.getpid()}))
    registry = CollectorRegistry()
    registry.register(ReportCollector(tmp_path))
    stats = SglangAdapter().parse_metrics(generate_latest(registry).decode(), scraped_at=0.0)
    assert stats.zoe_kernels_active == ("csa_dual_scope",)
