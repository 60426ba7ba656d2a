"""Session-aware routing with plain values: the hash ring and `session_hash`, and `prefix`'s session affinity
(held until saturation, one clean move), placement of new sessions and sub-agents, KV tiers."""

from __future__ import annotations

from collections import Counter

import pytest

from zoe_cluster.routing import PrefixIndex, ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.hash_ring import HashRing
from zoe_cluster.routing.sessions import SessionTable, session_family


def replicas(n, **kw):
    return [ReplicaView(f"d/{i}/0", f"http://r{i}", **kw) for i in range(n)]


def turn(rid, session, blocks, t=0.0, out=10):
    return context_from_trace(rid, "m", blocks, 512 * len(blocks), out, session=session, arrival_s=t)


def route(policy, c, reps):
    d = policy.select(c, [r for r in reps if r.routable])
    policy.on_routed(c, d)
    r = next(r for r in reps if r.replica_id == d.replica_id)
    r.admit(c, d.matched_tokens(c))
    return d, r


def finish(policy, c, d, reps):
    r = next(r for r in reps if r.replica_id == d.replica_id)
    r.prefill_done(c, d.matched_tokens(c))
    r.finish(c, d.matched_tokens(c))
    policy.on_finished(c, r.replica_id, True)


# --- the ring -----------------------------------------------------------------------------------------------
def test_ring_moves_only_the_changed_replicas_share():
    ring = HashRing(100, [f"d/{i}/0" for i in range(4)])
    keys = [f"session-{k}" for k in range(4000)]
    before = {k: ring.lookup(k) for k in keys}
    shares = Counter(before.values())
    assert all(600 <= n <= 1400 for n in shares.values()), shares  # about 1/4 each
    ring.add("d/4/0")
    after = {k: ring.lookup(k) for k in keys}
    moved = [k for k in keys if after[k] != before[k]]
    assert all(after[k] == "d/4/0" for k in moved)  # only to the newcomer
    assert 0.1 < len(moved) / len(keys) < 0.3  # about 1/5
    ring.remove("d/1/0")
    again = {k: ring.lookup(k) for k in keys}
    assert all(again[k] == after[k] for k in keys if after[k] != "d/1/0")  # nobody else moves
    assert "d/1/0" not in again.values()
    # the ring does not depend on the order replicas joined
    assert HashRing(100, ["d/4/0", "d/3/0", "d/2/0", "d/0/0"]).lookup("x") == ring.lookup("x")


def test_session_hash_is_sticky_and_passes_over_saturated_owners():
    p, reps = get_policy("session_hash"), replicas(4, max_active_requests=1)
    first = p.select(turn("a", "s1", [1, 2]), reps)
    assert first.reason == "session_hash"
    assert all(p.select(turn(f"b{i}", "s1", [9 + i]), reps).replica_id == first.replica_id for i in range(5))
    owner = next(r for r in reps if r.replica_id == first.replica_id)
    owner.active_requests = 1  # saturated: the next replica clockwise takes it, then it comes back
    moved = p.select(turn("c", "s1", [1]), reps)
    assert moved.replica_id != owner.replica_id
    owner.active_requests = 0
    assert p.select(turn("d", "s1", [1]), reps).replica_id == owner.replica_id
    # no session: the prompt's first block is the key, so a shared system prompt meets on one replica
    no_session = {p.select(context_from_trace(f"n{i}", "m", [7, 100 + i], 1024, 1), reps).replica_id
                  for i in range(10)}
    assert len(no_session) == 1
    spread = Counter(p.select(turn(f"x{i}", f"user-{i}", [i]), reps).replica_id for i in range(400))
    assert len(spread) == 4 and min(spread.values()) > 50
    p.on_replica_removed(first.replica_id)
    assert p.select(turn("e", "s1", [1]), reps[:0] + [r for r in reps if r is not owner]).replica_id != owner.replica_id


# --- prefix: affinity held until saturation, then one clean move --------------------------------------------
def test_affinity_holds_under_a_load_gap_and_moves_once_when_a_backlog_persists():
    p, reps = get_policy("prefix", session_saturation_prefill_tokens=40_000), replicas(3)
    chain = list(range(100))  # 51K tokens
    c0 = turn("t0", "s", chain)
    d0, home = route(p, c0, reps)
    finish(p, c0, d0, reps)
    home.queued_prefill_tokens = 30_000  # busy, not saturated: another replica is far cheaper on load alone
    c1 = turn("t1", "s", chain + [100, 101], t=10)
    d1 = p.select(c1, reps)
    assert d1.replica_id == home.replica_id and d1.reason == "session"
    home.queued_prefill_tokens = 200_000  # a backlog, but only just: one long prefill passing through stays
    assert p.select(turn("t1", "s", chain + [100, 101], t=20), reps).reason == "session"
    assert p.select(turn("t1", "s", chain + [100, 101], t=79), reps).reason == "session"  # held 59 s of 60
    c1 = turn("t1", "s", chain + [100, 101], t=80)  # held 60 s: saturated, and waiting costs more than moving
    d2, new_home = route(p, c1, reps)
    assert d2.reason == "session_move" and new_home is not home
    finish(p, c1, d2, reps)
    home.queued_prefill_tokens = 0  # the old replica is free again: the session does not flap back
    c2 = turn("t2", "s", chain + [100, 101, 102], t=90)
    d3 = p.select(c2, reps)
    assert d3.replica_id == new_home.replica_id and d3.reason == "session"
    assert p.sessions.get("s").moves == 1


def test_a_backlog_that_drains_between_requests_starts_over():
    p, reps = get_policy("prefix", session_saturation_prefill_tokens=40_000, session_saturation_s=30), replicas(2)
    chain = list(range(100))
    c0 = turn("t0", "s", chain)
    d0, home = route(p, c0, reps)
    finish(p, c0, d0, reps)
    home.queued_prefill_tokens = 200_000
    assert p.select(turn("t1", "s", chain + [1], t=10), reps).reason == "session"
    home.queued_prefill_tokens = 0  # seen drained at t=30
    assert p.select(turn("t2", "x", [7, 8], t=30), reps) is not None
    home.queued_prefill_tokens = 200_000
    assert p.select(turn("t3", "s", chain + [1], t=45), reps).reason == "session"  # 15 s since it rose again
    assert p.select(turn("t4", "s", chain + [1], t=75), reps).reason == "session_move"  # 30 s
    assert p.session_saturated(home) and not p.session_saturated(reps[1 - reps.index(home)])
    p.on_replica_removed(home.replica_id)
    assert home.replica_id not in p._backlog_since


def test_no_moves_when_every_replica_is_saturated():
    p, reps = get_policy("prefix", session_saturation_prefill_tokens=10_000, session_saturation_s=0), replicas(2)
    c0 = turn("t0", "s", list(range(40)))
    d0, home = route(p, c0, reps)
    finish(p, c0, d0, reps)
    for r in reps:
        r.queued_prefill_tokens = 50_000
    d = p.select(turn("t1", "s", list(range(41)), t=5), reps)
    assert d.replica_id == home.replica_id and d.reason == "session"


def test_a_moved_session_only_moves_when_waiting_costs_more_than_re_prefilling():
    p, reps = get_policy("prefix", session_saturation_prefill_tokens=10_000, session_saturation_s=0), replicas(2)
    c0 = turn("t0", "s", list(range(200)))  # 102K tokens of chain
    d0, home = route(p, c0, reps)
    finish(p, c0, d0, reps)
    home.queued_prefill_tokens = 20_000  # saturated, but re-prefilling 102K elsewhere is worse than waiting
    assert p.select(turn("t1", "s", list(range(201)), t=5), reps).replica_id == home.replica_id


# --- placement of new sessions ------------------------------------------------------------------------------
def test_new_sessions_spread_over_live_sessions_including_thinking_ones():
    p, reps = get_policy("prefix"), replicas(4)
    homes = Counter()
    for k in range(8):
        c = turn(f"s{k}", f"s{k}", [10_000 * k + j for j in range(20)], t=k)
        d, _ = route(p, c, reps)
        finish(p, c, d, reps)  # every replica idle again: only the live (thinking) sessions tell them apart
        homes[d.replica_id] += 1
    assert sorted(homes.values()) == [2, 2, 2, 2]
    assert sum(p.sessions.on_replica(r.replica_id).thinking for r in reps) == 8
    # sessions idle past session_idle_s are forgotten, and stop counting
    c = turn("late", "late", [999], t=8 + 301)
    route(p, c, reps)
    assert len(p.sessions) == 1


def test_subagent_bursts_spread_and_keep_the_parents_prefix():
    p, reps = get_policy("prefix"), replicas(4)
    system = list(range(30))  # 15K tokens of system prompt + tools shared by the parent and its sub-agents
    parent = turn("p0", "s", system + [500, 501], t=0)
    dp, home = route(p, parent, reps)
    finish(p, parent, dp, reps)
    placed = []
    for a in range(4):  # a burst: four sub-agents start at once, none finishes before the next starts
        c = turn(f"a{a}", f"s/agent_{a:03d}", system + [1000 * (a + 1)], t=1)
        d, _ = route(p, c, reps)
        placed.append(d)
    assert len({d.replica_id for d in placed}) >= 3  # spread over the fleet
    assert placed[0].replica_id == home.replica_id and placed[0].matched_blocks == 30  # first one uses the cache
    assert session_family("s/agent_001") == ("s", "agent_001") and session_family("s") == ("s", None)


def test_a_new_session_avoids_the_replica_of_thinking_sessions():
    # replica 0 holds three sessions in a tool pause; replica 1 holds none but has a little prefill queued
    p, reps = get_policy("prefix"), replicas(2)
    for k in range(3):
        c = turn(f"s{k}", f"s{k}", [100 * k + j for j in range(10)])
        d = p.select(c, [reps[0]])
        p.on_routed(c, d)
        reps[0].admit(c, 0)
        finish(p, c, d, reps)
    reps[1].queued_prefill_tokens = 3_000
    assert p.select(turn("n", "n", list(range(1000, 1040)), t=1), reps).replica_id == "d/1/0"
    plain = get_policy("prefix", session_tokens=0.0)  # instantaneous load alone puts it with the thinkers
    plain._indexes, plain.sessions = p._indexes, p.sessions
    assert plain.select(turn("n", "n", list(range(1000, 1040)), t=1), reps).replica_id == "d/0/0"


# --- KV tiers -------------------------------------------------------------------------------------------------
def test_index_tiers_and_tier_aware_cost():
    idx = PrefixIndex(4, host_capacity_blocks=10)
    idx.insert([1, 2, 3, 4, 5, 6])  # HBM keeps the head (4 blocks), the host tier all six
    assert idx.match_tiers([1, 2, 3, 4, 5, 6, 7]) == (4, 2)
    idx.insert([20, 21, 22, 23])  # evicts the first chain from HBM; still in host memory
    assert idx.match_tiers([1, 2, 3]) == (0, 3) and idx.match([1, 2, 3]) == 3
    assert len(idx) == 10
    p = get_policy("prefix", host_transfer_cost=0.1)
    c = turn("r", None, [1, 2, 3])
    r = ReplicaView("x/0/0", "sim://0")
    hbm, host, miss = p.cost(c, r, 3), p.cost(c, r, 0, host_blocks=3), p.cost(c, r, 0)
    assert hbm < host < miss
    assert host - hbm == pytest.approx(4 * 0.1 * 3 * 512)  # hit_weight x transfer share x tokens


def test_router_prefers_an_hbm_hit_to_a_host_hit_to_a_miss():
    p = get_policy("prefix")
    reps = [ReplicaView(f"d/{i}/0", f"sim://{i}", kv_capacity_tokens=4 * 512, host_kv_capacity_tokens=40 * 512)
            for i in range(3)]
    q, other = turn("q", None, [1, 2, 3, 4]), turn("o", None, [50, 51, 52, 53])
    p.index(reps[0], 512).insert(q.block_hashes)  # HBM
    p.index(reps[1], 512).insert(q.block_hashes)
    p.index(reps[1], 512).insert(other.block_hashes)  # pushes q out of HBM; it stays in host memory
    p.index(reps[2], 512)
    assert p.index_of("d/1/0").match_tiers(q.block_hashes) == (0, 4)
    assert p.select(q, reps).replica_id == "d/0/0"
    assert p.select(q, reps[1:]).replica_id == "d/1/0"


def test_session_table_sums_stay_consistent():
    t = SessionTable(max_sessions=3, idle_s=100)
    t.routed("a", "r0", 1000, 0)
    t.routed("a/x", "r0", 500, 0)
    t.routed("b", "r1", 700, 1)
    assert t.on_replica("r0").sessions == 2 and t.on_replica("r0").context_tokens == 1500
    assert t.siblings_on("a", "r0") == 1 and t.on_replica("r0").thinking == 0
    t.finished("a", 2)
    assert t.on_replica("r0").thinking == 1
    t.routed("a", "r1", 1200, 3)  # moved while thinking
    assert t.on_replica("r0").context_tokens == 500 and t.on_replica("r1").context_tokens == 1900
    assert t.on_replica("r0").thinking == 0 and t.on_replica("r1").thinking == 0 and t.moves == 1
    t.finished("a", 4), t.finished("a/x", 4), t.finished("b", 4)
    t.expire(200)
    assert len(t) == 0 and t.on_replica("r1").context_tokens == 0 and t.on_replica("r1").thinking == 0
    assert t.siblings_on("a", "r0") == 0
