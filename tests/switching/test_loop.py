"""The controller's switching loop: swaps through its fleet control, counts outcomes, exports its inputs."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.switching import SwitchConfig
from zoe_cluster.switching.actuator import FleetReplica
from zoe_cluster.switching.loop import SwitchLoop
from zoe_cluster.routing.load_report import LoadReport

GLM = RecipeRegistry.default().get("glm-5.3")
CFG = SwitchConfig(candidates=["fp8-tp8-nightly", "mxfp4-tp8"], window_s=60, interval_s=1, dwell_s=600,
                   horizon_s=7200, drain_s=30)


class FakeController:
    """Stands in for the live deployment's fleet control (the real one, `cluster.fleet_load.LiveFleet`, is tested
    in tests/cluster)."""

    def __init__(self, fail: bool = False):
        self.variants = ["fp8-tp8-nightly", "fp8-tp8-nightly"]
        self.per_replica = 32
        self.fail = fail
        self.swapped: list[tuple[int, str, str]] = []

    def replicas(self):
        return [FleetReplica(i, f"glm/{i}/0", v, "ready", None) for i, v in enumerate(self.variants)]

    def by_class(self):
        return {}

    async def load(self):
        return LoadReport(in_flight={f"glm/{i}/0": self.per_replica for i in range(len(self.variants))},
                          in_flight_by_class=self.by_class())

    async def swap(self, index, variant, reason):
        await asyncio.sleep(0)
        self.swapped.append((index, variant, reason))
        if self.fail:
            raise RuntimeError("new generation failed")
        self.variants[index] = variant
        return None


def _run(ctl):
    reg = CollectorRegistry()
    loop = SwitchLoop(GLM, CFG, ctl, reg)

    async def go():
        decisions = await loop.tick()
        await asyncio.gather(*loop._swaps)
        return decisions

    return loop, reg, asyncio.run(go())


def test_high_load_starts_one_swap_and_counts_it_completed():
    ctl = FakeController()
    loop, reg, decisions = _run(ctl)
    assert [d.action for d in decisions] == ["swap", "hold"]
    assert ctl.swapped[0][:2] == (0, "mxfp4-tp8") and "1338.7" in ctl.swapped[0][2]
    text = generate_latest(reg).decode()
    assert 'zoe_switch_swaps_total{outcome="started"} 1.0' in text
    assert 'zoe_switch_swaps_total{outcome="completed"} 1.0' in text
    assert 'zoe_switch_concurrency_estimate{replica="glm/0/0"} 32.0' in text
    assert 'zoe_switch_predicted_tok_s{replica="glm/0/0",variant="fp8-tp8-nightly"} 1223.6' in text
    rep = loop.report()
    assert rep["recent_swaps"][0]["variant"] == "mxfp4-tp8" and len(rep["latest"]) == 2


def test_a_failed_swap_is_counted_failed():
    ctl = FakeController(fail=True)
    _, reg, _ = _run(ctl)
    text = generate_latest(reg).decode()
    assert 'zoe_switch_swaps_total{outcome="failed"} 1.0' in text


def test_with_classes_the_loop_steers_a_mix_from_the_controllers_per_class_counts():
    from zoe_cluster.switching.vocabulary import ServiceClass

    class ClassCountingController(FakeController):
        def __init__(self):
            super().__init__()
            self.variants = ["fp8-tp8-nightly"] * 4
            self.per_replica = 12

        def by_class(self):
            return {"interactive": 10, "standard": 38}

    cfg = CFG.model_copy(update={"classes": [ServiceClass(name="interactive", ttft_s=1.0, itl_s=0.020),
                                             ServiceClass(name="standard", ttft_s=2.0, itl_s=0.030)],
                                 "dwell_s": 1800})
    ctl = ClassCountingController()
    loop = SwitchLoop(GLM, cfg, ctl, CollectorRegistry())

    async def go():
        decisions = await loop.tick()
        await asyncio.gather(*loop._swaps)
        return decisions

    decisions = asyncio.run(go())
    assert [d.action for d in decisions].count("swap") == 1
    assert ctl.swapped[0][1] == "mxfp4-tp8" and "in flight by class: interactive 10" in ctl.swapped[0][2]
    assert loop.report()["demand"] == {"interactive": 10.0, "standard": 38.0}


def test_when_no_router_answers_the_loop_decides_per_replica_without_class_counts():
    from zoe_cluster.switching.vocabulary import ServiceClass

    class Unanswered(FakeController):
        async def load(self):
            return None  # neither the own router nor a router pod answered

    cfg = CFG.model_copy(update={"classes": [ServiceClass(name="interactive", ttft_s=1.0, itl_s=0.020),
                                             ServiceClass(name="standard", ttft_s=2.0, itl_s=0.030)]})
    ctl = Unanswered()
    loop = SwitchLoop(GLM, cfg, ctl, CollectorRegistry())
    decisions = asyncio.run(loop.tick())
    assert [d.action for d in decisions] == ["hold", "hold"] and ctl.swapped == []
    assert loop.report()["demand"] is None
    assert all(r["concurrency"] == 0.0 for r in loop.report()["latest"])
