"""Kernel reports: what one engine process writes, what the cluster reads, what /metrics exports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from zoe_kernels.integrations.report import (
    KernelReporter,
    ReportCollector,
    read_reports,
    requested_kernels,
    summarize,
)


def test_requested_kernels_parses_the_env_list():
    assert requested_kernels({"ZOE_KERNELS": " fused_moe, ,lightning_indexer,fused_moe"}) == [
        "fused_moe",
        "lightning_indexer",
    ]
    assert requested_kernels({}) == []


def test_reporter_writes_patches_fallbacks_and_counts(tmp_path):
    rep = KernelReporter("vllm", "0.32.0", ["fused_moe", "lightning_indexer"], tmp_path, flush_interval_s=0.05)
    rep.patched("fused_moe", "mod:Cls.apply", "triton")
    rep.fallback("lightning_indexer", "mod:f", "signature", "expected (a, b), found (a)")
    for _ in range(3):
        rep.count("fused_moe", "zoe")
    rep.count("fused_moe", "engine", "above_crossover")
    rep.flush()
    data = json.loads((tmp_path / f"vllm-{os.getpid()}.json").read_text())
    assert data["patched"] == {"fused_moe": {"targets": ["mod:Cls.apply"], "impl": "triton"}}
    assert data["fallbacks"][0]["reason"] == "signature"
    assert data["calls"] == {"fused_moe": {"zoe": 3, "engine": 1}}
    assert data["engine_path_reasons"] == {"fused_moe": {"above_crossover": 1}}


def test_counts_reach_the_file_without_an_explicit_flush(tmp_path):
    import time

    rep = KernelReporter("vllm", "0.32.0", ["fused_moe"], tmp_path, flush_interval_s=0.05)
    rep.count("fused_moe", "zoe")
    deadline = time.monotonic() + 5
    path = tmp_path / f"vllm-{os.getpid()}.json"
    while time.monotonic() < deadline:
        if path.exists() and json.loads(path.read_text())["calls"].get("fused_moe", {}).get("zoe") == 1:
            return
        time.sleep(0.02)
    pytest.fail("the flusher thread never wrote the counted call")


def test_summary_marks_a_kernel_active_only_without_fallbacks(tmp_path):
    a = KernelReporter("vllm", "0.32.0", ["fused_moe", "lightning_indexer"], tmp_path)
    a.patched("fused_moe", "t1", "triton")
    a.patched("lightning_indexer", "t2", "triton")
    a.count("fused_moe", "zoe")
    a.flush()
    # a second process of the same replica (a worker) where the indexer patch did not fit
    b = KernelReporter("vllm", "0.32.0", ["fused_moe", "lightning_indexer"], tmp_path)
    b.report.pid = a.report.pid + 1  # two "processes" from one test process
    b.patched("fused_moe", "t1", "triton")
    b.fallback("lightning_indexer", "t2", "engine_version", "vllm 0.1.0")
    b.report.calls = {"fused_moe": {"zoe": 1, "engine": 1}}  # count() would notice the pid is not its own
    b.flush()
    s = summarize(read_reports(tmp_path))
    assert s.active == ("fused_moe",)
    assert s.fallbacks == {"lightning_indexer": ["engine_version"]}
    assert s.calls == {"fused_moe": {"zoe": 2, "engine": 1}}
    assert s.processes == 2
    assert s.describe() == "fused_moe: on (zoe 2, engine 1 calls); lightning_indexer: OFF (engine_version)"
    assert summarize([]).describe() == "none requested"


def test_read_reports_skips_dead_processes_and_garbage(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rep = KernelReporter("sglang", "0.5.23", ["csa_topk"], tmp_path)
    rep.report.pid = int(dead.stdout)
    rep.patched("csa_topk", "t", "triton")
    (tmp_path / "broken.json").write_text("{not json")
    assert len(read_reports(tmp_path)) == 1
    assert read_reports(tmp_path, live_only=True) == []
    assert read_reports(tmp_path / "missing") == []


def test_collector_exports_the_metrics_the_engine_adapters_parse(tmp_path):
    from zoe_cluster.engines.vllm import VllmAdapter

    rep = KernelReporter("vllm", "0.32.0", ["fused_moe", "lightning_indexer"], tmp_path)
    rep.patched("fused_moe", "t", "triton")
    rep.fallback("lightning_indexer", "t2", "unsupported", "cpu")
    rep.count("fused_moe", "zoe")
    rep.flush()
    registry = CollectorRegistry()
    registry.register(ReportCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'zoe_kernel_active{kernel="fused_moe"} 1.0' in text
    assert 'zoe_kernel_active{kernel="lightning_indexer"} 0.0' in text
    assert 'zoe_kernel_fallback_total{kernel="lightning_indexer",reason="unsupported"} 1.0' in text
    assert 'zoe_kernel_calls_total{kernel="fused_moe",path="zoe"} 1.0' in text
    with pytest.raises(ValueError):  # a second registration in one process is refused, not doubled
        registry.register(ReportCollector(tmp_path))
    assert VllmAdapter().parse_metrics(text, 0.0).zoe_kernels_active == ("fused_moe",)


_MP_CHILD = """
import sys
from zoe_kernels.integrations.report import KernelReporter
rep = KernelReporter("sglang", "0.5.23", ["csa_topk"], None)
assert rep.exporter is not None
if sys.argv[1] == "ok":
    rep.patched("csa_topk", "t", "triton")
    for _ in range(3):
        rep.count("csa_topk", "zoe")
else:
    rep.fallback("csa_topk", "t", "signature", "older SGLang")
"""


def test_multiprocess_engines_aggregate_every_processs_metrics(tmp_path):
    """SGLang serves prometheus_client's multiprocess registry: each process writes, /metrics aggregates."""
    mp = tmp_path / "prom"
    mp.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    read = (
        "import sys; from prometheus_client import CollectorRegistry, generate_latest, multiprocess;"
        "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r, path=sys.argv[1]);"
        "print(generate_latest(r).decode())"
    )
    subprocess.run([sys.executable, "-c", _MP_CHILD, "ok"], env=env, check=True)
    text = subprocess.run([sys.executable, "-c", read, str(mp)], capture_output=True, text=True, check=True).stdout
    assert 'zoe_kernel_active{kernel="csa_topk"} 1.0' in text
    assert 'zoe_kernel_calls_total{kernel="csa_topk",path="zoe"} 3.0' in text
    subprocess.run([sys.executable, "-c", _MP_CHILD, "fallback"], env=env, check=True)
    text = subprocess.run([sys.executable, "-c", read, str(mp)], capture_output=True, text=True, check=True).stdout
    assert 'zoe_kernel_active{kernel="csa_topk"} 0.0' in text  # one process fell back: not active
    assert 'zoe_kernel_fallback_total{kernel="csa_topk",reason="signature"} 1.0' in text
