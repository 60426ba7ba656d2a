"""scripts/vllm_patch_signatures.py reads the plugin's vLLM patch targets from source without importing vLLM (the
way a nightly image's commit is checked): on every release with a test environment it finds exactly what the
import-based check in test_engine_releases finds, and it reads a git directory at a given commit."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from tests.integrations.engine_envs import RELEASES, TEST_ENVS, VLLM_RELEASES, engine_env
from zoe_kernels.integrations.support import SUPPORT, in_range

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_patch_signatures.py"
_spec = importlib.util.spec_from_file_location("vllm_patch_signatures", SCRIPT)
sig = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sig)


def _source_folder(release: str) -> Path:
    engine_env("vllm", release)  # skips (fails in CI) when the environment is not installed
    base, overlay = RELEASES[("vllm", release)]
    if overlay:
        return TEST_ENVS / overlay
    return next((TEST_ENVS / base).glob("lib/python*/site-packages"))


@pytest.mark.vllm
@pytest.mark.parametrize("release", VLLM_RELEASES)
def test_source_signatures_match_the_verified_specs_of_each_release(release):
    read = sig.folder_reader(_source_folder(release))
    targets = {t: sig.target_params(read, t) for v in sig.plugin_specs().values() for s in v for t, _ in s.checked()}
    matches = sig.matching_ranges(targets)
    for entry in SUPPORT:
        if entry.engine != "vllm" or not in_range(release, entry.versions):
            continue
        for platform in entry.platforms:
            for s in sig.plugin_specs()[(entry.kernel, platform)]:
                if s.versions == entry.versions:
                    for target, params in s.checked():
                        assert targets[target] == list(params), (release, target)
            assert list(entry.versions) in matches[entry.kernel][platform], (release, entry)


def test_cpu_apply_of_029_differs_and_is_reported_as_no_match():
    """vLLM 0.29's CPU experts route inside apply (support.GAPS): the script must not call that a match."""
    targets = {"vllm.model_executor.layers.fused_moe.experts.cpu_moe:CPUUnquantizedExperts.apply":
               ["self", "hidden_states", "w1", "w2", "router_logits"]}  # fmt: skip
    assert sig.matching_ranges(targets)["fused_moe"]["cpu"] == []


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_reads_a_git_directory_at_a_commit_following_imports_and_bases(tmp_path):
    repo = tmp_path / "vllm-src"
    pkg = repo / "vllm" / "ops"
    pkg.mkdir(parents=True)
    (repo / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "impl.py").write_text("def logits(q, kv, *, scale=1.0, **kw):\n    pass\n\n"
                                 "class Base:\n    def apply(self, x, w):\n        pass\n")  # fmt: skip
    (pkg / "api.py").write_text("from .impl import logits as mqa_logits, Base\nimport vllm.ops.impl as im\n\n"
                                "class Experts(Base):\n    pass\n\nclass Other(im.Base):\n    pass\n")  # fmt: skip
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD").strip()
    (pkg / "impl.py").write_text("def logits(q):\n    pass\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    read = sig.git_reader(repo / ".git", first)
    assert sig.target_params(read, "vllm.ops.api:mqa_logits") == ["q", "kv", "scale", "kw"]
    assert sig.target_params(read, "vllm.ops.api:Experts.apply") == ["self", "x", "w"]
    assert sig.target_params(read, "vllm.ops.api:Other.apply") == ["self", "x", "w"]  # a base as `module.Class`
    assert sig.target_params(read, "vllm.ops.api:Experts.gone") is None
    assert sig.target_params(read, "vllm.ops.missing:f") is None
    assert sig.target_params(sig.git_reader(repo / ".git", "HEAD"), "vllm.ops.impl:logits") == ["q"]
