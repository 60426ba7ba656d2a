"""sglang-router's `cache_aware` as the benchmarks model it (`SglangCacheAwarePolicy`), with plain values: balance
thresholds first, then the best match over the cache threshold, else the smallest tree."""

from __future__ import annotations

from zoe_cluster.routing import POLICIES, ReplicaView, context_from_trace
from zoe_cluster.routing.policies import SglangCacheAwarePolicy


def replicas(n):
    return [ReplicaView(f"d/{i}/0", f"http://r{i}") for i in range(n)]


def req(rid, blocks):
    return context_from_trace(rid, "m", blocks, 512 * len(blocks), 10)


def send(p, ctx, reps):
    d = p.select(ctx, reps)
    p.on_routed(ctx, d)
    return d


def test_defaults_are_sglang_routers_and_it_is_not_a_router_choice():
    c = SglangCacheAwarePolicy().config
    assert (c.cache_threshold, c.balance_abs_threshold, c.balance_rel_threshold) == (0.3, 64, 1.5)
    assert c.max_tree_tokens == 2**26 // 4
    assert SglangCacheAwarePolicy.name not in POLICIES


def test_match_over_threshold_wins_else_the_smallest_tree():
    p, reps = SglangCacheAwarePolicy(), replicas(3)
    first = send(p, req("a", list(range(10))), reps)
    assert first.reason == "least_load"  # nothing matches anywhere: smallest tree (all empty)
    # 4 of 10 blocks match (40% > 30%): the replica that has them, though its tree is the largest
    d = send(p, req("b", list(range(4)) + list(range(100, 106))), reps)
    assert d.replica_id == first.replica_id and d.reason == "prefix" and d.matched_blocks == 4
    # 3 of 10 blocks (30%, not above it): the smallest tree, which is not the one holding them
    d = p.select(req("c", list(range(3)) + list(range(200, 207))), reps)
    assert d.replica_id != first.replica_id and d.reason == "least_load"


def test_imbalance_beyond_both_thresholds_goes_to_the_least_active():
    p, reps = SglangCacheAwarePolicy(), replicas(2)
    home = send(p, req("a", list(range(10))), reps).replica_id
    hot = next(r for r in reps if r.replica_id == home)
    cold = next(r for r in reps if r.replica_id != home)
    hot.active_requests, cold.active_requests = 100, 40  # differ by 60 (not > 64): still cache-aware
    assert p.select(req("b", list(range(10))), reps).replica_id == home
    hot.active_requests, cold.active_requests = 105, 40  # by 65 and 105 > 1.5 x 40: balance
    d = p.select(req("b", list(range(10))), reps)
    assert d.replica_id == cold.replica_id and d.reason == "least_load"
    hot.active_requests, cold.active_requests = 200, 134  # by 66 but 200 < 1.5 x 134: cache-aware
    assert p.select(req("b", list(range(10))), reps).replica_id == home


def test_a_removed_replica_forgets_its_tree():
    p, reps = SglangCacheAwarePolicy(), replicas(2)
    home = send(p, req("a", list(range(10))), reps).replica_id
    p.on_replica_removed(home)
    assert p.select(req("b", list(range(10))), reps).reason == "least_load"
