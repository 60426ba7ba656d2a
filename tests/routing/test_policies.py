"""Routing policies with plain values: locality vs load, LRU forgetting, pools, sessions, the registry."""

from __future__ import annotations

import pytest

from zoe_cluster.routing import (
    POLICIES,
    Policy,
    PolicyConfigError,
    PrefixIndex,
    ReplicaView,
    context_from_trace,
    get_policy,
    policy_names,
    validate_policy_config,
)


def replicas(n, **kw):
    return [ReplicaView(f"d/{i}/0", f"http://r{i}", **kw) for i in range(n)]


def ctx(rid, ids, tokens=None, out=10, session=None):
    return context_from_trace(rid, "m", ids, tokens if tokens is not None else 512 * len(ids), out, session=session)


def route(policy, c, reps):
    d = policy.select(c, [r for r in reps if r.routable])
    policy.on_routed(c, d)
    r = next(r for r in reps if r.replica_id == d.replica_id)
    r.admit(c, d.matched_tokens(c))
    return d, r


def test_registry_drives_choices_and_validation():
    assert policy_names()[0] == "prefix"
    assert {"round_robin", "least_load", "prefix"} <= set(POLICIES)
    with pytest.raises(PolicyConfigError, match="unknown routing policy 'nope'.*prefix"):
        get_policy("nope")
    with pytest.raises(PolicyConfigError, match="decode_weight"):
        validate_policy_config("prefix", {"decode_weight": -1})
    with pytest.raises(PolicyConfigError, match="bogus"):
        get_policy("least_load", bogus=1)

    class Fixed(Policy, name="test_fixed_policy"):
        def select(self, ctx, replicas):
            from zoe_cluster.routing import RoutingDecision

            return RoutingDecision(replicas[-1].replica_id, "least_load")

    try:
        assert "test_fixed_policy" in policy_names()
        assert get_policy("test_fixed_policy").select(ctx("a", [1]), replicas(3)).replica_id == "d/2/0"
        with pytest.raises(TypeError, match="defined twice"):
            type("Again", (Policy,), {}, name="test_fixed_policy")
    finally:
        del POLICIES["test_fixed_policy"]


def test_round_robin_cycles():
    p, reps = get_policy("round_robin"), replicas(3)
    assert [p.select(ctx(str(i), [i]), reps).replica_id for i in range(6)] == [f"d/{i % 3}/0" for i in range(6)]


def test_least_load_picks_fewest_active():
    p, reps = get_policy("least_load"), replicas(3)
    reps[0].active_requests, reps[1].active_requests, reps[2].active_requests = 3, 1, 2
    assert p.select(ctx("a", [1]), reps).replica_id == "d/1/0"


def test_prefix_follows_the_cache_when_load_is_equal():
    p, reps = get_policy("prefix"), replicas(4)
    d0, r0 = route(p, ctx("a", [0, 1, 2, 3]), reps)
    r0.finish(ctx("a", [0, 1, 2, 3]), prefilled=False)  # finished; load back to 0
    d1 = p.select(ctx("b", [0, 1, 2, 3, 4]), reps)
    assert d1.replica_id == d0.replica_id and d1.matched_blocks == 4 and d1.reason == "prefix"


def test_prefix_weighs_saved_tokens_against_queued_prefill():
    p, reps = get_policy("prefix"), replicas(2)
    first = ctx("a", [0, 1, 2, 3])
    d, r = route(p, first, reps)
    r.prefill_done(first)  # decoding there now: a 4-block hit saves 2048 of 2560 tokens
    second = ctx("b", [0, 1, 2, 3, 9])
    assert p.select(second, reps).replica_id == d.replica_id
    r.queued_prefill_tokens += 8192  # but with more prefill queued there than the hit saves, go elsewhere
    d2 = p.select(second, reps)
    assert d2.replica_id != d.replica_id and d2.reason == "load_balance"


def test_long_prefills_are_not_stacked_on_one_replica():
    p, reps = get_policy("prefix"), replicas(3)
    chosen = set()
    for i in range(3):
        d, _ = route(p, ctx(f"r{i}", [100 + i * 1000 + k for k in range(200)]), reps)  # 100K-token prompts
        chosen.add(d.replica_id)
    assert len(chosen) == 3


def test_index_forgets_what_the_engine_must_have_evicted():
    idx = PrefixIndex(4)
    idx.insert([1, 2, 3])
    idx.insert([7, 8])
    assert idx.match([1, 2, 3]) == 2  # block 3 (a tail) was evicted first
    assert idx.match([7, 8]) == 2 and len(idx) == 4
    p = get_policy("prefix")
    reps = replicas(2, kv_capacity_tokens=512 * 8)
    a = ctx("a", list(range(6)))
    route(p, a, reps)
    for r in reps:
        r.active_requests = r.queued_prefill_tokens = 0
    route(p, ctx("b", list(range(50, 56))), reps)  # 12 blocks of traffic into 8-block caches
    for r in reps:
        r.active_requests = r.queued_prefill_tokens = 0
    assert sum(len(p.index_of(r.replica_id)) for r in reps) <= 16
    p.on_replica_removed("d/0/0")
    assert p.index_of("d/0/0") is None


def test_saturated_replicas_are_skipped_while_another_is_open():
    p, reps = get_policy("prefix"), replicas(2, max_active_requests=1)
    a = ctx("a", [0, 1, 2])
    d, r = route(p, a, reps)
    r.prefill_done(a)
    d2 = p.select(ctx("b", [0, 1, 2]), reps)
    assert d2.replica_id != d.replica_id


@pytest.mark.parametrize("name", ["prefix", "least_load"])
def test_long_prompts_go_to_the_long_pool_and_spill_when_it_is_saturated(name):
    p = get_policy(name, long_context_tokens=65536)
    reps = replicas(3)
    reps[2].pool = "long"
    long_ctx = ctx("L", list(range(200)))  # 102400 tokens
    d = p.select(long_ctx, reps)
    assert d.replica_id == "d/2/0" and not d.spilled
    short = p.select(ctx("s", [1, 2]), reps)
    assert short.replica_id != "d/2/0"
    reps[2].active_requests = reps[2].max_active_requests
    spilled = p.select(long_ctx, reps)
    assert spilled.spilled and spilled.reason == "pool_spill" and spilled.replica_id != "d/2/0"
    # a short request goes to the long pool only when its own pool is gone
    reps[2].active_requests = 0
    assert p.select(ctx("s2", [1]), [reps[2]]).spilled


def test_long_prefills_spill_to_an_idle_replica_rather_than_queue():
    p = get_policy("prefix", long_context_tokens=65536, spill_queued_prefill_tokens=100_000)
    reps = replicas(2)
    reps[1].pool = "long"
    reps[1].active_requests, reps[1].queued_prefill_tokens = 1, 120_000
    d = p.select(ctx("L", list(range(200))), reps)
    assert d.replica_id == "d/0/0" and d.spilled
