"""The actuator samples the router's counts over a window and applies only what decide() chose."""

from __future__ import annotations

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.switching import SwitchConfig
from zoe_cluster.switching.actuator import FleetReplica, SwitchActuator
from zoe_cluster.switching.window import ConcurrencyWindow

GLM = RecipeRegistry.default().get("glm-5.3")


def test_window_is_time_weighted_and_forgets_old_samples():
    w = ConcurrencyWindow(window_s=100)
    w.add(0, {"a": 10})
    w.add(90, {"a": 0})
    assert w.mean("a", 100) == pytest.approx(9.0)  # 10 for 90 s, 0 for 10 s
    w.add(300, {"a": 4})
    assert w.mean("a", 350) == pytest.approx(2.0)  # 0 for 250..300, 4 for 300..350
    w.add(400, {})
    assert w.mean("a", 400) == 0.0  # replica gone from membership
    w.add(500, {"a": 1})
    with pytest.raises(ValueError, match="older"):
        w.add(10, {"a": 1})


class FakeFleet:
    """An in-memory FleetControl (names itself a fake: the live one is the controller)."""

    def __init__(self, variants):
        self.variants = list(variants)
        self.counts = [0] * len(variants)
        self.swaps = []

    def replicas(self):
        return [FleetReplica(i, f"d/{i}/0", v, "ready", None) for i, v in enumerate(self.variants)]

    def load(self):
        return LoadReport(in_flight={f"d/{i}/0": c for i, c in enumerate(self.counts)})

    def swap(self, index, variant, reason):
        self.swaps.append((index, variant))
        self.variants[index] = variant


def test_actuator_swaps_after_load_rises_and_records_reasons():
    t = [0.0]
    fleet = FakeFleet(["fp8-tp8-nightly", "fp8-tp8-nightly"])
    cfg = SwitchConfig(candidates=["fp8-tp8-nightly", "mxfp4-tp8"], window_s=120, interval_s=30, dwell_s=600,
                       horizon_s=7200, drain_s=30)
    act = SwitchActuator(GLM, cfg, fleet, clock=lambda: t[0])
    fleet.counts = [1, 1]
    for _ in range(5):
        act.step()
        t[0] += 30
    assert fleet.swaps == []  # low load: FP8 is right
    fleet.counts = [32, 32]
    for _ in range(10):
        act.step()
        t[0] += 30
    assert fleet.swaps[0] == (0, "mxfp4-tp8")
    assert [r.decision.action for r in act.history] == ["swap"] * len(fleet.swaps)
    assert "mxfp4-tp8 1338.7" in act.history[0].decision.reason or "mxfp4-tp8" in act.history[0].decision.reason
    assert set(act.latest) == {0, 1}
    assert act.swaps_started == len(fleet.swaps) >= 1
