"""`RouterFleet`: N routers with their own prefix state behind a random or affinity front, sharing the replicas'
load; never registered, built by `fleet_factory`."""

from __future__ import annotations

import pytest

from zoe_cluster.routing import POLICIES, PolicyConfigError, ReplicaView, context_from_trace, get_policy, policy_names
from zoe_cluster.routing.router_fleet import (
    FLEET_POLICY,
    RouterFleet,
    RouterFleetConfig,
    fleet_factory,
)


def replicas(n):
    return [ReplicaView(f"d/{i}/0", f"http://r{i}") for i in range(n)]


def ctx(rid, ids, session=None):
    return context_from_trace(rid, "m", ids, 512 * len(ids), 10, session=session)


def fleet(**kw):
    return RouterFleet(RouterFleetConfig(**kw))


def route(policy, c, reps):
    d = policy.select(c, reps)
    policy.on_routed(c, d)
    next(r for r in reps if r.replica_id == d.replica_id).admit(c, d.matched_tokens(c))
    return d


def test_the_factory_builds_a_fresh_fleet_that_the_registry_never_names():
    make = fleet_factory(3, "affinity", policy="round_robin", affinity_blocks=2)
    pol = make()
    assert isinstance(pol, RouterFleet) and len(pol.routers) == 3 and pol.name == FLEET_POLICY
    assert {type(r).name for r in pol.routers} == {"round_robin"}
    assert len({id(r) for r in pol.routers}) == 3  # each router its own instance
    assert pol.config.front == "affinity" and pol.config.affinity_blocks == 2
    assert make() is not pol and make().routers[0] is not pol.routers[0]  # no state shared between replays
    assert FLEET_POLICY not in POLICIES and FLEET_POLICY not in policy_names()
    with pytest.raises(PolicyConfigError, match="unknown routing policy"):
        get_policy(FLEET_POLICY)


def test_bad_inner_policy_or_front_is_a_config_error():
    with pytest.raises(PolicyConfigError, match="unknown routing policy 'nope'"):
        fleet_factory(2, "random", policy="nope")
    with pytest.raises(PolicyConfigError, match="policy 'prefix'"):
        fleet_factory(2, "random", options={"no_such_knob": 1})
    with pytest.raises(PolicyConfigError, match="front"):
        fleet_factory(2, "sticky")
    with pytest.raises(PolicyConfigError, match="routers"):
        fleet_factory(0, "random")


def test_affinity_front_keeps_a_session_and_a_prefix_on_one_router():
    f = fleet(routers=4, front="affinity")
    assert len({f.router_for(ctx(f"s{i}", [i, 100 + i], session="conv-7")) for i in range(50)}) == 1
    assert len({f.router_for(ctx(f"p{i}", [9, 100 + i])) for i in range(50)}) == 1  # same first block
    spread = {f.router_for(ctx(f"k{i}", [i, 7], session=f"conv-{i}")) for i in range(200)}
    assert spread == {0, 1, 2, 3}


def test_affinity_blocks_spreads_prompts_that_share_a_system_prompt():
    one = fleet(routers=4, front="affinity")
    two = fleet(routers=4, front="affinity", affinity_blocks=2)
    convs = [[0, 1000 + c, 2000 + c] for c in range(200)]  # every conversation opens with block 0
    assert len({one.router_for(ctx(f"a{c}", ids)) for c, ids in enumerate(convs)}) == 1
    assert len({two.router_for(ctx(f"b{c}", ids)) for c, ids in enumerate(convs)}) == 4
    # a later turn (the same first two blocks, more after them) stays on its conversation's router
    for c, ids in enumerate(convs):
        assert two.router_for(ctx(f"t{c}", [*ids, 5000 + c])) == two.router_for(ctx(f"u{c}", ids))
    assert two.router_for(ctx("short", [0])) == one.router_for(ctx("short", [0]))  # fewer blocks: the last one


def test_random_front_is_seeded_and_spreads():
    def draw(seed):
        f = fleet(routers=4, front="random", seed=seed)
        return [f.router_for(ctx(f"r{i}", [1])) for i in range(400)]

    draws = [draw(0), draw(0), draw(1)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    assert all(60 < draws[0].count(k) < 140 for k in range(4))


def test_each_router_keeps_its_own_prefix_index_but_shares_load():
    reps = replicas(4)
    f = fleet(routers=2, front="random", seed=3)
    first = route(f, ctx("a", [1, 2, 3, 4]), reps)
    owner = f._router_of["a"]
    other = 1 - owner
    # the router that routed it learned the prefix; the other one did not
    assert f.routers[owner].select(ctx("x", [1, 2, 3, 4]), reps).matched_blocks == 4
    assert f.routers[other].select(ctx("y", [1, 2, 3, 4]), reps).matched_blocks == 0
    # both read the same load: the replica it went to counts one active request for either router
    assert next(r for r in reps if r.replica_id == first.replica_id).active_requests == 1


def test_affinity_front_matches_one_router_and_random_loses_hits():
    """A conversation's turns on 8 replicas: with affinity every later turn finds its prefix, as one router does
    (each router learns the shared first block once); behind a random front a turn often lands on a router that
    never saw the conversation."""
    def run(pol):
        reps = replicas(8)
        matched = 0
        for turn in range(6):
            for c in range(40):
                c_ = ctx(f"{c}-{turn}", [0, 1000 + c, *range(10_000 * c, 10_000 * c + turn + 1)], session=f"s{c}")
                d = route(pol, c_, reps)
                matched += d.matched_blocks
                pol.on_finished(c_, d.replica_id, True)
                next(r for r in reps if r.replica_id == d.replica_id).finish(c_, d.matched_tokens(c_))
        return matched

    one = run(get_policy("prefix"))
    assert run(fleet(routers=4, front="affinity")) >= 0.97 * one
    assert run(fleet(routers=4, front="random")) < 0.8 * one


def test_removals_and_evictions_reach_every_router():
    seen = []

    class Spy:
        def __init__(self, k):
            self.k = k

        def on_replica_removed(self, rid):
            seen.append(("removed", self.k, rid))

        def on_cache_evicted(self, rid, tokens):
            seen.append(("evicted", self.k, rid, tokens))

    f = fleet(routers=3, front="random")
    f.routers = [Spy(k) for k in range(3)]  # type: ignore[list-item]
    f.on_replica_removed("d/1/0")
    f.on_cache_evicted("d/2/0", None)
    assert [s[1] for s in seen if s[0] == "removed"] == [0, 1, 2]
    assert [s[1] for s in seen if s[0] == "evicted"] == [0, 1, 2]


def test_zoe_sim_replay_routers_builds_the_fleet_without_registering_it(tmp_path):
    import json

    from typer.testing import CliRunner

    from zoe_cluster.cli.main import app

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 300 * i, "input_length": 2048, "output_length": 8,
                                         "hash_ids": [0, 1, 10 + i, 20 + i]}) + "\n" for i in range(12)))
    args = ["sim", "replay", str(trace), "--model", "glm-5.3", "--replicas", "2", "--json"]
    r = CliRunner().invoke(app, [*args, "--routers", "3", "--router-front", "affinity"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["policy"] == FLEET_POLICY and out["completed"] == 12
    assert FLEET_POLICY not in POLICIES
    bad = CliRunner().invoke(app, [*args, "--routers", "2", "--router-front", "sticky"])
    assert bad.exit_code != 0 and "--router-front" in bad.output
    shared = CliRunner().invoke(app, [*args, "--routers", "3", "--router-share-s", "1"])
    assert shared.exit_code == 0 and json.loads(shared.output)["completed"] == 12, shared.output
    bad = CliRunner().invoke(app, [*args, "--routers", "2", "--router-share-s", "0"])
    assert bad.exit_code != 0 and "share_every_s" in bad.output


def _conversations(pol, n_replicas=8, turn_gap_s=10.0):
    """Prefix blocks matched over 6 turns of 40 conversations, a turn every `turn_gap_s` of the replay's clock."""
    reps = replicas(n_replicas)
    matched = 0
    for turn in range(6):
        for c in range(40):
            ids = [0, 1000 + c, *range(10_000 * c, 10_000 * c + turn + 1)]
            c_ = context_from_trace(f"{c}-{turn}", "m", ids, 512 * len(ids), 10, arrival_s=turn * turn_gap_s + c / 40)
            d = route(pol, c_, reps)
            matched += d.matched_blocks
            pol.on_finished(c_, d.replica_id, True)
            next(r for r in reps if r.replica_id == d.replica_id).finish(c_, d.matched_tokens(c_))
    return matched


def test_random_front_sharing_pictures_matches_one_router():
    """Behind a random front, routers that take their peers' inserts every second find each conversation's
    earlier turns as one router does; without sharing they lose them."""
    one = _conversations(get_policy("prefix"))
    shared = fleet(routers=4, front="random", share_every_s=1.0)
    assert _conversations(shared) >= 0.97 * one
    assert shared.shared_chains > 0 and shared.describe()["shared_chains"] == shared.shared_chains
    assert _conversations(fleet(routers=4, front="random")) < 0.8 * one
    # a period longer than the gap between turns shares too late for the next turn
    assert _conversations(fleet(routers=4, front="random", share_every_s=100.0)) < 0.8 * one


def test_sharing_period_must_be_positive():
    with pytest.raises(PolicyConfigError, match="share_every_s"):
        fleet_factory(2, "random", share_every_s=0)


def test_sharing_carries_a_sessions_affinity_to_the_other_routers():
    """A session placed by one router: after a round of sharing, a peer routes its next turn to the same replica
    by session affinity (reason "session"), as the router that placed it would; the peer's own later routing is
    not moved back by the placer's older entry."""
    reps = replicas(4)
    f = fleet(routers=2, front="random", share_every_s=100.0)
    first = context_from_trace("t1", "m", [1, 2, 3], 1536, 10, session="s1", arrival_s=0.0)
    d = route(f, first, reps)
    placer = f._router_of["t1"]
    f.on_finished(first, d.replica_id, True)
    peer = f.routers[1 - placer]
    nxt = context_from_trace("t2", "m", [1, 2, 3, 4, 5], 2560, 10, session="s1", arrival_s=2.0)
    assert peer.select(nxt, reps).reason != "session"  # not shared yet: placed anew
    f.share(512, now=2.0)
    assert f.shared_sessions == 1 and f.describe()["shared_sessions"] == 1
    again = peer.select(nxt, reps)
    assert (again.replica_id, again.reason) == (d.replica_id, "session")
    assert peer.sessions.get("s1").last_s == 0.0  # active at 0 on the placer's clock, the replay's
    peer.on_routed(nxt, again)
    f.share(512, now=3.0)  # the placer takes the peer's newer routing; the peer takes nothing new
    assert f.routers[placer].sessions.get("s1").last_s == 2.0 and f.shared_sessions == 2
