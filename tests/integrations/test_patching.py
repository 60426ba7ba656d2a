"""The shared patch helper: version and signature checks, all-or-nothing installs, loud fallbacks."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from zoe_kernels.integrations.patching import PatchSpec, install_kernel, release, uninstall, version_supported
from zoe_kernels.integrations.report import KernelReporter, log


@pytest.fixture
def engine_module():
    """A stand-in engine module with a class method, a static method and a function."""
    mod = types.ModuleType("fake_engine_mod")

    class Experts:
        def apply(self, x, w):
            return ("engine", x)

        @staticmethod
        def pick(m):
            return "engine"

    def logits(q, kv, weights):
        return "engine"

    mod.Experts, mod.logits = Experts, logits
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]


def _wrap_tag(tag):
    def wrap(original):
        def replacement(*args, **kwargs):
            return (tag, original(*args, **kwargs))

        return replacement

    return wrap


def _reporter(tmp_path):
    return KernelReporter("fake", "1.2.3", ["k"], tmp_path)


def test_release_and_range():
    assert release("0.32.0+cpu") == (0, 32, 0)
    assert release("v0.5.23rc1") == (0, 5, 23)
    assert version_supported("0.32.0+cpu", ("0.32.0", "0.33.0"))
    assert version_supported("0.32", ("0.32.0", "0.33.0"))
    assert not version_supported("0.33.0", ("0.32.0", "0.33.0"))
    assert not version_supported("0.29.0", ("0.32.0", "0.33.0"))
    assert not version_supported("unknown", ("0.32.0", "0.33.0"))


def test_installs_method_and_staticmethod_and_function(engine_module, tmp_path):
    rep = _reporter(tmp_path)
    specs = [
        PatchSpec("k", "fake_engine_mod:Experts.apply", ("self", "x", "w"), ("1.0", "2.0"), _wrap_tag("zoe")),
        PatchSpec("k", "fake_engine_mod:Experts.pick", ("m",), ("1.0", "2.0"), _wrap_tag("zoe")),
        PatchSpec("k", "fake_engine_mod:logits", ("q", "kv", "weights"), ("1.0", "2.0"), _wrap_tag("zoe")),
    ]
    assert install_kernel("k", specs, "fake", "1.2.3", rep)
    assert engine_module.Experts().apply(1, 2) == ("zoe", ("engine", 1))
    assert engine_module.Experts.pick(3) == ("zoe", "engine")
    assert engine_module.logits(1, 2, 3) == ("zoe", "engine")
    # a second register() in the same process does not wrap twice
    assert install_kernel("k", specs, "fake", "1.2.3", rep)
    assert engine_module.Experts().apply(1, 2) == ("zoe", ("engine", 1))
    assert rep.report.patched["k"]["targets"] == [s.target for s in specs]
    assert uninstall("fake_engine_mod:Experts.pick")
    assert engine_module.Experts.pick(3) == "engine"


@pytest.mark.parametrize(
    "version, spec_kwargs, reason",
    [
        ("0.1.0", {}, "engine_version"),
        ("1.2.3", {"params": ("self", "x")}, "signature"),
        ("1.2.3", {"target": "fake_engine_mod:Experts.gone"}, "missing_target"),
        ("1.2.3", {"target": "no_such_engine_module:f"}, "missing_target"),
    ],
)
def test_mismatch_falls_back_loudly_and_installs_nothing(engine_module, tmp_path, caplog, version, spec_kwargs, reason):
    rep = _reporter(tmp_path)
    good = PatchSpec("k", "fake_engine_mod:logits", ("q", "kv", "weights"), ("1.0", "2.0"), _wrap_tag("zoe"))
    bad = PatchSpec(
        "k",
        spec_kwargs.get("target", "fake_engine_mod:Experts.apply"),
        spec_kwargs.get("params", ("self", "x", "w")),
        ("1.0", "2.0"),
        _wrap_tag("zoe"),
    )
    log.addHandler(caplog.handler)  # the plugin's logger does not propagate to the root, where caplog listens
    try:
        assert not install_kernel("k", [good, bad], "fake", version, rep)
    finally:
        log.removeHandler(caplog.handler)
    assert engine_module.logits(1, 2, 3) == "engine"  # all or nothing: the good spec was not installed
    assert engine_module.Experts().apply(1, 2) == ("engine", 1)
    assert "k" not in rep.report.patched
    assert rep.report.fallbacks[0]["reason"] == reason
    assert any("FALLBACK" in r.message and reason in r.message for r in caplog.records)
    data = json.loads((tmp_path / f"fake-{os.getpid()}.json").read_text())
    assert data["fallbacks"][0]["reason"] == reason


def test_a_release_in_a_checked_gap_says_what_differs_there(engine_module, tmp_path):
    """vLLM 0.29 on the CPU: the CPU experts' patch (verified on 0.32) falls back with the support table's
    reason for 0.29, not only the range."""
    from zoe_kernels.integrations.support import VLLM_032

    rep = _reporter(tmp_path)
    spec = PatchSpec("fused_moe", "fake_engine_mod:Experts.apply", ("self", "x", "w"), VLLM_032, _wrap_tag("zoe"))
    assert not install_kernel("fused_moe", [spec], "vllm", "0.29.0", rep, "cpu")
    (fb,) = rep.report.fallbacks
    assert fb["reason"] == "engine_version"
    assert fb["detail"].startswith("vllm 0.29.0 is outside the verified range [0.32.0, 0.33.0): vLLM 0.29's "
                                   "CPUUnquantizedExperts.apply routes inside the experts")  # fmt: skip
    assert install_kernel("fused_moe", [spec], "vllm", "0.32.1", _reporter(tmp_path), "cpu")
    assert engine_module.Experts().apply(1, 2) == ("zoe", ("engine", 1))


@pytest.mark.parametrize("call, reason", [
    (("fake_engine_mod:Experts.gone", ("self",)), "missing_target"),
    (("fake_engine_mod:logits", ("q", "kv")), "signature"),
])  # fmt: skip
def test_an_engine_function_the_replacement_calls_is_checked_like_the_target(engine_module, tmp_path, call, reason):
    rep = _reporter(tmp_path)
    good = ("fake_engine_mod:Experts.pick", ("m",))
    spec = PatchSpec("k", "fake_engine_mod:Experts.apply", ("self", "x", "w"), ("1.0.0", "2.0.0"), _wrap_tag("zoe"),
                     calls=(good, call))  # fmt: skip
    assert spec.checked() == (("fake_engine_mod:Experts.apply", ("self", "x", "w")), good, call)
    assert not install_kernel("k", [spec], "fake", "1.2.3", rep)
    assert engine_module.Experts().apply(1, 2) == ("engine", 1)  # nothing installed
    (fb,) = rep.report.fallbacks
    assert (fb["reason"], fb["target"]) == (reason, call[0])
    ok = PatchSpec("k", "fake_engine_mod:Experts.apply", ("self", "x", "w"), ("1.0.0", "2.0.0"), _wrap_tag("zoe"),
                   calls=(good, ("fake_engine_mod:logits", ("q", "kv", "weights"))))  # fmt: skip
    assert install_kernel("k", [ok], "fake", "1.2.3", _reporter(tmp_path))
    assert engine_module.Experts().apply(1, 2) == ("zoe", ("engine", 1))
