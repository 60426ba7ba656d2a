"""Sharing the approximate picture between routers: the prefix index's numbered insert log, `picture_delta` and
`apply_picture_delta` (what `zoe sim replay --routers N --router-share-s` and the live router both use)."""

from __future__ import annotations

from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.picture_sharing import apply_picture_delta, indexing_policy, picture_delta
from zoe_cluster.routing.prefix_index import PrefixIndex


def test_the_index_logs_its_inserts_numbered_and_absorbs_without_logging():
    idx = PrefixIndex(100)
    assert idx.next_seq == 1 and idx.inserted_since(0) == []
    idx.insert((1, 2, 3))
    idx.insert((4, 5))
    assert idx.next_seq == 3
    assert idx.inserted_since(0) == [(1, 2, 3), (4, 5)]
    assert idx.inserted_since(2) == [(4, 5)] and idx.inserted_since(3) == []
    idx.absorb([(7, 8), (9,)])  # a peer's chains: in the index, not in the log
    assert idx.match((7, 8)) == 2 and idx.match((9,)) == 1
    assert idx.next_seq == 3 and idx.inserted_since(0) == [(1, 2, 3), (4, 5)]
    assert idx.inserted_since(50) == [(1, 2, 3), (4, 5)]  # past the end: a new index of that id, from the start
    idx.insert(())
    assert idx.next_seq == 3  # nothing inserted, nothing logged


def test_the_log_holds_at_most_the_index_capacity_in_blocks():
    idx = PrefixIndex(5)
    for k in range(4):
        idx.insert((10 * k, 10 * k + 1))
    assert idx.next_seq == 5
    assert idx.inserted_since(0) == [(20, 21), (30, 31)]  # 4 blocks kept; a third chain would make 6
    long = PrefixIndex(3, host_capacity_blocks=4)
    long.insert(tuple(range(10)))
    assert long.inserted_since(0) == [(0, 1, 2, 3)]  # a chain is cut to what the larger tier keeps


def _ctx(rid, ids):
    return context_from_trace(rid, "m", ids, 512 * len(ids), 8)


def test_a_peer_takes_what_a_router_inserted_once_and_only_for_its_members():
    views = {f"d/{i}/0": ReplicaView(f"d/{i}/0", f"http://r{i}") for i in range(3)}
    a, b = get_policy("prefix"), get_policy("prefix")
    for i, ids in enumerate(([1, 2, 3], [1, 2, 9], [5, 6])):
        c = _ctx(f"q{i}", ids)
        d = a.select(c, list(views.values()))
        a.on_routed(c, d)
    cursors: dict[str, int] = {}
    delta = picture_delta(a, cursors, views)
    assert sum(len(chains) for _, chains in delta.values()) == 3
    assert apply_picture_delta(b, views, 512, delta, cursors) == 3
    def matches(pol, ids):
        idx = [indexing_policy(pol).index_of(r) for r in views]
        return [i.match(_ctx("probe", ids).block_hashes) if i is not None else 0 for i in idx]

    for ids in ([1, 2, 3], [1, 2, 9], [5, 6]):  # b's indexes now say what a's say
        assert matches(b, ids) == matches(a, ids) and sum(matches(a, ids)) == len(ids)
    assert all(cursors[r] == indexing_policy(a).index_of(r).next_seq for r in views)
    assert apply_picture_delta(b, views, 512, picture_delta(a, cursors, views), cursors) == 0  # nothing new
    # a replica b does not list (not a member there) is skipped, cursor included
    assert apply_picture_delta(b, {}, 512, picture_delta(a, {}, views), cursors := {}) == 0 and cursors == {}
    # b's own inserts are not echoed back: it logs only its own decisions
    assert all(not i.inserted_since(0) for i in map(indexing_policy(b).index_of, views) if i is not None)


def test_a_policy_without_indexes_shares_nothing():
    views = {"d/0/0": ReplicaView("d/0/0", "http://r0")}
    rr = get_policy("round_robin")
    assert indexing_policy(rr) is None and picture_delta(rr, {}, views) == {}
    assert apply_picture_delta(rr, views, 512, {"d/0/0": (3, [(1, 2)])}) == 0


def test_a_session_table_numbers_its_routings_and_a_peer_binds_them_once():
    from zoe_cluster.routing.sessions import SessionTable

    a, b = SessionTable(100, idle_s=60), SessionTable(100, idle_s=60)
    assert a.next_seq == 1 and a.routed_since(0, 0.0) == []
    a.routed("s1", "r0", 1000, now=1.0)
    a.routed("s2/agent_1", "r1", 500, now=2.0)
    a.finished("s1", now=3.0)
    a.routed("s1", "r0", 1200, now=4.0)  # one entry per session: its latest routing
    assert a.next_seq == 4
    assert a.routed_since(0, 5.0) == [("s2/agent_1", "r1", 500, 3.0), ("s1", "r0", 1200, 1.0)]
    assert a.routed_since(3, 5.0) == [("s1", "r0", 1200, 1.0)] and a.routed_since(4, 5.0) == []
    assert a.routed_since(99, 5.0) == a.routed_since(0, 5.0)  # past the end: a new table, from the start
    assert b.absorb(a.routed_since(0, 5.0), now=105.0) == 2
    s1 = b.get("s1")
    assert (s1.replica_id, s1.context_tokens, s1.in_flight, s1.last_s) == ("r0", 1200, 0, 104.0)
    assert b.on_replica("r0").sessions == 1 and b.on_replica("r0").thinking == 1
    assert b.on_replica("r0").context_tokens == 1200 and b.siblings_on("s2", "r1") == 1
    assert b.next_seq == 1 and b.routed_since(0, 105.0) == []  # absorbed, not numbered: b publishes only its own
    # b routed s1 itself after a's routing: a's older entry does not move it back
    b.routed("s1", "r2", 1300, now=106.0)
    assert b.absorb([("s1", "r0", 1200, 5.0)], now=107.0) == 0 and b.get("s1").replica_id == "r2"
    b.finished("s1", now=108.0)
    # a newer routing by the peer (a move) rebinds it, per-replica sums following
    assert b.absorb([("s1", "r1", 1400, 0.5)], now=110.0) == 1
    assert b.get("s1").replica_id == "r1" and b.on_replica("r2").sessions == 0
    assert b.on_replica("r1").context_tokens == 500 + 1400 and b.on_replica("r1").thinking == 2
    # a forgotten session leaves the log
    a.drop_replica("r0")
    assert [e[0] for e in a.routed_since(0, 5.0)] == ["s2/agent_1"]
