"""Slow and hung replicas: the pure decisions (`zoe_cluster.router.slowness`) with plain values, then the router
on loopback fake backends: a 10x slower replica stops receiving new requests and comes back once it recovers; a
replica whose stream goes silent is found hung mid-request and ejected."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections import deque

import pytest

from tests.router.test_proxy import Cluster, completion, sse_events
from zoe_cluster.router.slowness import (
    LatencyFacts,
    LatencySamples,
    next_stall_check_s,
    probe_due,
    record_sample,
    slow_replicas,
    stall_verdict,
)


def series(value, n):
    return LatencySamples(deque([value] if value is not None else []), n if value is not None else 0)


def facts(tpot_s=None, n=10, e2e=None, ne=0):
    return LatencyFacts(series(tpot_s, n), series(e2e, ne))


def test_window_median_and_probe_samples():
    f = LatencyFacts.empty()
    for x in (0.1, 0.3, 0.2):
        record_sample(f, "tpot_s", x, window=3)
    assert f.tpot_s.value == pytest.approx(0.2) and f.tpot_s.samples == 3
    record_sample(f, "tpot_s", 0.4, window=3)  # the oldest (0.1) leaves the window
    assert list(f.tpot_s.recent) == [0.3, 0.2, 0.4] and f.tpot_s.value == pytest.approx(0.3)
    record_sample(f, "tpot_s", 0.01, window=3, probe=True)  # a probe says how the replica is now
    assert f.tpot_s.value == 0.01 and f.tpot_s.samples == 5
    with pytest.raises(ValueError, match="window"):
        record_sample(f, "tpot_s", 0.01, window=0)


def test_one_stream_beside_a_long_prefill_does_not_make_a_replica_slow():
    """A healthy replica's short stream that decoded while the engine ran another request's long prefill in chunks
    shows many times the usual time per token (the twin gives 7x for an 88-token stream beside a 500K-token
    prefill): one such sample among fast ones is no verdict; a replica slow on most of its window is."""
    fleet = {rid: LatencyFacts.empty() for rid in "abcd"}
    for rid, f in fleet.items():
        for _ in range(5):
            record_sample(f, "tpot_s", 0.017, window=5)
    record_sample(fleet["a"], "tpot_s", 0.017 * 7, window=5)
    assert slow_replicas(fleet, factor=3.0, min_samples=5) == {}
    record_sample(fleet["a"], "tpot_s", 0.017 * 4, window=5)
    assert slow_replicas(fleet, factor=3.0, min_samples=5) == {}
    record_sample(fleet["a"], "tpot_s", 0.017 * 10, window=5)  # now 3 of its last 5 are slow
    assert list(slow_replicas(fleet, factor=3.0, min_samples=5)) == ["a"]


def test_slow_against_the_median_of_peers():
    fleet = {"a": facts(0.010), "b": facts(0.012), "c": facts(0.011), "d": facts(0.100)}
    slow = slow_replicas(fleet, factor=3.0, min_samples=5)
    assert list(slow) == ["d"] and "tpot_s" in slow["d"] and "3 x peers' median 11.0 ms" in slow["d"]
    assert slow_replicas(fleet, factor=10.0, min_samples=5) == {}  # 100 ms is 9.1x the median, not more than 10x
    # not enough samples on the slow one, or no peer with enough: no verdict
    assert slow_replicas({"a": facts(0.01), "d": facts(0.1, n=2)}, 3.0, 5) == {}
    assert slow_replicas({"d": facts(0.1)}, 3.0, 5) == {}
    # two replicas: the slower one only, never both
    assert list(slow_replicas({"a": facts(0.01), "d": facts(0.05)}, 3.0, 5)) == ["d"]
    # non-streamed requests are judged apart from streams (their time per token includes the prefill)
    mixed = {"a": facts(0.01, e2e=0.5, ne=9), "b": facts(e2e=0.05, ne=9), "c": facts(0.011, e2e=0.06, ne=9)}
    assert list(slow_replicas(mixed, 3.0, 5)) == ["a"] and "e2e_per_token_s" in slow_replicas(mixed, 3.0, 5)["a"]


def test_probe_is_due_once_per_period():
    f = facts(0.1)
    f.slow_since = 100.0
    assert not probe_due(f, 101.0, probe_s=2.0) and probe_due(f, 102.0, probe_s=2.0)
    f.last_probe_at = 102.0
    assert not probe_due(f, 103.9, 2.0) and probe_due(f, 104.0, 2.0)


@pytest.mark.parametrize(
    "now,since,last_byte,decoding,verdict",
    [
        (10.0, 9.0, 9.5, 3, "wait"),  # waited 1 s < stall 5 s
        (20.0, 14.0, 14.0, 3, "stalled"),  # waited 6 s, the replica silent 6 s with streams decoding
        (20.0, 14.0, 19.0, 3, "wait"),  # this one waits, but the replica's other streams flow: not hung
        (20.0, 14.0, 0.0, 0, "wait"),  # nothing decoding: a long prefill cannot be told from a hang
        (80.0, 14.0, 79.0, 3, "timeout"),  # waited the whole limit (60 s)
    ],
)
def test_stall_verdict(now, since, last_byte, decoding, verdict):
    assert stall_verdict(now, since, last_byte, decoding, stall_timeout_s=5.0, limit_s=60.0) == verdict


def test_a_replica_found_hung_releases_every_waiter():
    # nothing decodes any more (its streams ended on the stall), but another request found it hung
    assert stall_verdict(15.0, 14.0, 0.0, 0, 5.0, 60.0, replica_hung=True) == "stalled"
    assert stall_verdict(75.0, 14.0, 0.0, 0, 5.0, 60.0, replica_hung=True) == "timeout"


def test_next_stall_check_is_when_the_verdict_can_change():
    assert next_stall_check_s(10.0, 9.0, 9.5, 5.0, 60.0) == pytest.approx(4.5)  # replica silence reaches 5 s
    assert next_stall_check_s(10.0, 9.0, 0.0, 5.0, 60.0) == pytest.approx(4.0)  # own wait reaches 5 s
    assert next_stall_check_s(68.0, 9.0, 67.0, 5.0, 60.0) == pytest.approx(1.0)  # the limit comes first


def _stream(client):
    r = completion(client, stream=True)
    assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]", r.text[:300]
    return r.headers["x-zoe-replica"]


def test_a_10x_slow_replica_stops_receiving_requests_and_returns_when_it_recovers():
    c = Cluster(n=3, policy="round_robin", slow_min_samples=3, slow_probe_s=0.5)
    for b in c.backends:
        b.chunks, b.interval_s = 6, 0.01
    c.backends[2].interval_s = 0.1  # 10x slower per token
    try:
        with cf.ThreadPoolExecutor(6) as pool:
            first = list(pool.map(lambda _: _stream(c.client), range(18)))
            assert first.count("static/2/0") >= 3  # it was tried
            c.router.replicas.judge_slow()  # (judged at most every 0.2 s as samples come: the last may wait)
            st = c.router.replicas.by_id["static/2/0"]
            assert st.slow_reason is not None and "tpot_s" in st.slow_reason
            t0 = time.monotonic()
            later = list(pool.map(lambda _: (_stream(c.client), time.monotonic() - t0), range(90)))
        on_slow = [t for rid, t in later if rid == "static/2/0"]
        span = max(t for _, t in later)
        assert len(on_slow) <= span / 0.5 + 1, (len(on_slow), span)  # probes only: one per slow_probe_s
        assert len(on_slow) / len(later) <= 0.05 or len(on_slow) <= 2
        assert c.metric("zoe_router_ejections_total", replica="static/2/0", cause="slow") == 1
        c.backends[2].interval_s = 0.01  # recovered: the next probe shows it
        deadline = time.monotonic() + 10
        while c.router.replicas.by_id["static/2/0"].slow_reason is not None and time.monotonic() < deadline:
            _stream(c.client)
        assert c.router.replicas.by_id["static/2/0"].slow_reason is None
        assert "static/2/0" in [_stream(c.client) for _ in range(6)]
    finally:
        c.close()


def test_a_replica_that_goes_silent_mid_stream_is_found_hung_and_ejected():
    c = Cluster(n=2, modes={0: "stall"}, policy="round_robin", stall_timeout_s=0.5, read_timeout_s=60, eject_s=60,
                migration_limit=0)  # the stream ends with an error event (test_migration continues it)
    for b in c.backends:
        b.chunks = 5
    try:
        t0 = time.monotonic()
        results = [completion(c.client, stream=True) for _ in range(2)]
        hung = next(r for r in results if r.headers["x-zoe-replica"] == "static/0/0")
        ev = sse_events(hung.text)
        err = json.loads(ev[-2])["error"]
        assert ev[-1] == "[DONE]" and "stall" in err["message"] and set(err) == {"message", "type", "param", "code"}
        assert time.monotonic() - t0 < 5  # half a second of silence, not the 60 s read timeout
        assert c.metric("zoe_router_ejections_total", replica="static/0/0", cause="stall") == 1
        assert all(completion(c.client, stream=True).headers["x-zoe-replica"] == "static/1/0" for _ in range(3))
    finally:
        c.close()
