"""`replay` with a `RequestSource`: a list of rows and `RowSource` give the same result, a source that creates
arrivals on completions sees each one after the completion that released it, and a source that stalls is an
error rather than a silent early end."""

from __future__ import annotations

import pytest

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.calibrate import calibrate
from zoe_cluster.sim.replay import Arrival, Outcome, RowSource, SimReplayConfig, TraceRow, replay, rows_from

KV = 1_000_000


@pytest.fixture(scope="module")
def glm():
    r = RecipeRegistry.default().get("glm-5.3")
    return r, calibrate(r, r.default_variant)


def _rows(n: int) -> list[TraceRow]:
    return rows_from((0.05 * i, 2048 + 512 * (i % 3), 32, (1, 2, 3, 10 + i)) for i in range(n))


def test_row_source_equals_the_list_path(glm) -> None:
    recipe, cal = glm
    config = SimReplayConfig(recipe, recipe.default_variant, 2, "prefix", calibration=cal, kv_tokens=KV)
    a = replay(config, _rows(40)).to_dict()
    b = replay(config, RowSource(_rows(40))).to_dict()
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b and a["completed"] == 40


class Chain:
    """A closed loop of one user: request k+1 arrives `think_s` after request k completed."""

    block_tokens = 512

    def __init__(self, n: int, think_s: float) -> None:
        self.n, self.think_s, self.sent = n, think_s, 0
        self.next_at: float | None = 0.0
        self.log: list[tuple[float, float]] = []  # (arrival, completion)

    def next_arrival_s(self) -> float:
        return self.next_at if self.next_at is not None else float("inf")

    def pop(self) -> Arrival:
        at, self.next_at = self.next_at, None
        k = self.sent
        self.sent += 1
        return Arrival(f"c{k}", TraceRow(at, 1024 * (k + 1), 16, tuple(range(2 * (k + 1)))), "user")

    def exhausted(self) -> bool:
        return self.sent >= self.n and self.next_at is None

    def horizon_s(self, next_event_s: float) -> float:
        return min(self.next_arrival_s(), next_event_s)

    def finished(self, arrival: Arrival, now: float, outcome: Outcome) -> None:
        assert not outcome.dropped
        self.log.append((arrival.row.arrival_s, now))
        if self.sent < self.n:
            self.next_at = now + self.think_s


def test_arrivals_created_on_completions(glm) -> None:
    recipe, cal = glm
    src = Chain(5, think_s=2.0)
    res = replay(SimReplayConfig(recipe, recipe.default_variant, 1, "round_robin", calibration=cal, kv_tokens=KV), src)
    assert res.completed == res.requests == 5
    for (_, done), (arrived, _) in zip(src.log, src.log[1:]):
        assert arrived == pytest.approx(done + 2.0)
    assert res.prefix_hit_rate > 0.3  # each prompt extends the previous one


def test_a_stalled_source_is_an_error(glm) -> None:
    recipe, cal = glm

    class Stalled(Chain):
        def finished(self, arrival, now, outcome) -> None:  # forgets to release the next request
            self.log.append((arrival.row.arrival_s, now))

    with pytest.raises(RuntimeError, match="nothing pending or in flight"):
        replay(SimReplayConfig(recipe, recipe.default_variant, 1, "round_robin", calibration=cal, kv_tokens=KV),
               Stalled(3, 1.0))


def test_a_policy_factory_builds_a_fresh_policy_for_each_replay(glm) -> None:
    """A policy the registry does not name (the router fleet) is given by its factory; one router behind the front
    routes exactly as the plain policy does, and a second replay of the same config starts from a fresh fleet."""
    from zoe_cluster.routing import POLICIES
    from zoe_cluster.routing.router_fleet import FLEET_POLICY, fleet_factory

    recipe, cal = glm
    plain = replay(SimReplayConfig(recipe, recipe.default_variant, 2, "prefix", calibration=cal, kv_tokens=KV),
                   _rows(40)).to_dict()
    config = SimReplayConfig(recipe, recipe.default_variant, 2, fleet_factory(1, "random"), calibration=cal,
                             kv_tokens=KV)
    one, again = replay(config, _rows(40)).to_dict(), replay(config, _rows(40)).to_dict()
    for d in (plain, one, again):
        d.pop("wall_s")
    assert one["policy"] == FLEET_POLICY and FLEET_POLICY not in POLICIES
    assert one == again
    assert {**one, "policy": "prefix"} == plain
    with pytest.raises(ValueError, match="policy_options"):
        SimReplayConfig(recipe, recipe.default_variant, 2, fleet_factory(2), policy_options={"seed": 1})


def test_the_controller_reads_the_routers_ledger_report(glm) -> None:
    """The replay's fleet hands the switcher what the live router answers at GET /admin/load: its LoadLedger's
    report, classes named as the policy names them (the slo filter's default class for requests that name none)."""
    from dataclasses import replace as with_

    from zoe_cluster.routing.load_report import LoadReport

    recipe, cal = glm
    v = recipe.default_variant
    rows = [with_(r, slo_class="interactive" if i % 4 == 0 else None) for i, r in enumerate(_rows(40))]
    seen: list[LoadReport] = []
    config = SimReplayConfig(recipe, v, 2, "slo", policy_options={"classes": {"interactive": {v: 8}}},
                             calibration=cal, kv_tokens=KV, controller=lambda fleet: seen.append(fleet.load()),
                             tick_s=0.5)
    res = replay(config, rows)
    assert seen and all(isinstance(r, LoadReport) and set(r.in_flight) == {"sim/0/0", "sim/1/0"} for r in seen)
    assert any(r.in_flight_by_class.get("interactive") for r in seen)
    assert {c for r in seen for c in r.in_flight_by_class} == {"interactive", "standard"}
    assert [row["in_flight_by_class"] for row in res.timeline] == [r.in_flight_by_class for r in seen]
    last = seen[-1].prefill_tokens_by_class
    assert last["interactive"] > 0 and last["standard"] > last["interactive"]  # cumulative, 3 of 4 are standard
