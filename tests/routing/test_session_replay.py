"""Session routing through the closed-loop replay (`zoe sim replay PATH --sessions N`): the real sample sessions
on simulated GLM-5.3 replicas behind each policy."""

from __future__ import annotations

import pytest

from tests.agentic.sessions import DATA
from zoe_cluster.agentic.options import SessionOptions
from zoe_cluster.agentic.replay import run_closed_loop


@pytest.fixture(scope="module")
def runs():
    # 6 instances of the two samples (each a new user), 4 live, on 3 replicas with a small KV cache each
    opts = SessionOptions(live_sessions=4, total_sessions=6)
    return {p: run_closed_loop(DATA, 4, 3, p, kv_tokens=1_000_000, options=opts)
            for p in ("prefix", "session_hash", "round_robin")}


def test_prefix_captures_the_reuse_a_session_offers(runs):
    pre = runs["prefix"]
    assert pre["dropped"] == 0 and pre["completed"] == pre["requests"]
    assert pre["prefix_hit_rate"] >= 0.97 * pre["reuse_ceiling"]
    assert pre["routing_reasons"].get("session", 0) >= 0.8 * pre["requests"]  # later turns stay home
    assert runs["round_robin"]["prefix_hit_rate"] < pre["prefix_hit_rate"] - 0.1
    assert pre["ttft_p90_s"] < runs["round_robin"]["ttft_p90_s"]


def test_session_hash_keeps_every_session_on_one_replica(runs):
    sh = runs["session_hash"]
    assert sh["routing_reasons"] == {"session_hash": sh["requests"]}
    assert sh["prefix_hit_rate"] >= 0.97 * sh["reuse_ceiling"]
