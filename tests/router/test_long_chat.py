"""Long chat sessions through the router: a follow-up turn is parsed only past the session's last body, and routes
and fails exactly as a body parsed whole does."""

from __future__ import annotations

import json

import pytest

from tests.router.test_proxy import Cluster
from zoe_cluster.routing import context_from_openai


@pytest.fixture
def cluster():
    c = Cluster(n=2)
    yield c
    c.close()


def _post(cluster, body, session="s1"):
    return cluster.client.post("/v1/chat/completions", content=json.dumps(body),
                               headers={"content-type": "application/json", "x-session-id": session})


def test_follow_up_turn_reuses_the_known_prefix_and_routes_to_its_replica(cluster):
    msgs = [{"role": "system", "content": "rules " * 8000}, {"role": "user", "content": "read main.py"}]
    first = _post(cluster, {"model": "m", "messages": msgs, "max_tokens": 5})
    assert first.status_code == 200
    tokens = context_from_openai("chat", {"model": "m", "messages": msgs}, request_id="r").prompt_tokens
    msgs = msgs + [{"role": "assistant", "content": "ok " * 300}, {"role": "user", "content": "and now?"}]
    second = _post(cluster, {"model": "m", "messages": msgs, "max_tokens": 5})
    assert second.status_code == 200
    assert cluster.router.chat_prefixes.extended == 1
    assert second.headers["x-zoe-replica"] == first.headers["x-zoe-replica"]
    # the prefix policy keeps a live session on its replica ("session"), which is the replica holding its prefix
    assert second.headers["x-zoe-route-reason"] in ("prefix", "session")
    # the router's token counts are the ones a whole parse gives
    tokens += context_from_openai("chat", {"model": "m", "messages": msgs}, request_id="r").prompt_tokens
    assert cluster.metric("zoe_router_prompt_tokens_total") == tokens


def test_bad_follow_ups_get_the_usual_errors(cluster):
    msgs = [{"role": "user", "content": "x " * 20000}]
    assert _post(cluster, {"model": "m", "messages": msgs}).status_code == 200
    assert len(cluster.router.chat_prefixes) == 1  # the follow-ups below start with its bytes
    raw = json.dumps({"model": "m", "messages": msgs}).encode()
    for tail, words in [(b', {"role": "user"]}', "malformed JSON"),
                        (b', {"content": "no role"}]}', "messages[1]"),
                        (b'], "temperature": 9}', "temperature")]:
        bad = cluster.client.post("/v1/chat/completions", content=raw[:-2] + tail,
                                  headers={"content-type": "application/json", "x-session-id": "s1"})
        assert bad.status_code == 400, tail
        assert words in bad.json()["error"]["message"], bad.json()
