"""Incremental chat parsing and hashing (`routing.chat_prefix`, `hashing.TextChain`): every result equals parsing
and hashing the body from scratch, and a body that does not really extend the remembered one reuses nothing."""

from __future__ import annotations

import json
import random

import pytest

from zoe_cluster.routing import context_from_openai, hash_text, render_chat
from zoe_cluster.routing.chat_prefix import ChatPrefixCache
from zoe_cluster.routing.hashing import CHARS_PER_TOKEN, TextChain

ALPHABET = "abcdefgh \n\"\\/é中😀{}[]:,0123456789"


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def _message(rng: random.Random, i: int) -> dict:
    kind = rng.randrange(4)
    if kind == 0:
        return {"role": "user", "content": _text(rng, rng.randrange(0, 700))}
    if kind == 1:
        return {"role": "assistant", "content": _text(rng, rng.randrange(0, 300)),
                "tool_calls": [{"id": f"c{i}", "type": "function",
                                "function": {"name": "read", "arguments": json.dumps({"path": _text(rng, 9)})}}]}
    if kind == 2:
        return {"role": "tool", "tool_call_id": f"c{i}", "name": "read", "content": _text(rng, rng.randrange(0, 900))}
    return {"role": "user", "content": [{"type": "text", "text": _text(rng, 50)},
                                        {"type": "image_url", "image_url": {"url": "u"}}]}


def _dump(body: dict, style: int) -> bytes:
    if style == 0:
        return json.dumps(body, indent=1).encode()
    return json.dumps(body, ensure_ascii=style == 1).encode()


def _expected(raw: bytes, block_tokens: int):
    return context_from_openai("chat", json.loads(raw), request_id="r", block_tokens=block_tokens)


def _check(cache: ChatPrefixCache, raw: bytes, session: str | None, block_tokens: int):
    parsed = cache.parse(raw, session)
    assert parsed is not None
    want = _expected(raw, block_tokens)
    got = context_from_openai("chat", parsed.fields, request_id="r", block_tokens=block_tokens,
                              chat_prompt=parsed.prompt)
    assert got == want
    assert {k: v for k, v in json.loads(raw).items() if k != "messages"} == parsed.fields
    return parsed


def test_text_chain_equals_hash_text_on_random_splits():
    rng = random.Random(7)
    for _ in range(200):
        bt = rng.choice([1, 3, 16, 64])
        text = _text(rng, rng.randrange(0, 4000))
        chain = TextChain(bt)
        i = 0
        while i < len(text):
            j = min(len(text), i + rng.randrange(0, 700))
            chain = chain.extend([text[i:j]])
            i = j
        assert list(chain.hashes) == hash_text(text, bt)
        assert chain.chars == len(text) and chain.tokens == -(-len(text) // CHARS_PER_TOKEN)
        step = bt * CHARS_PER_TOKEN
        assert chain.tail == text[len(text) // step * step :]


@pytest.mark.parametrize("seed", range(6))
def test_follow_ups_equal_from_scratch(seed):
    """A session's turns (appended messages, edits of earlier ones, changed tools or fields, reordered
    members) give exactly what parsing the body alone gives."""
    rng = random.Random(seed)
    bt = rng.choice([2, 16, 64])
    cache = ChatPrefixCache(bt, min_bytes=0)
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": [{"role": "system", "content": _text(rng, 500)}], "max_tokens": 5}
    if rng.random() < 0.5:
        body["tools"] = tools
    reused, style = 0, seed % 3
    for turn in range(40):
        action = rng.random()
        body = json.loads(json.dumps(body))
        if action < 0.6:
            body["messages"] += [_message(rng, turn) for _ in range(rng.randrange(0, 4))]
        elif action < 0.7 and len(body["messages"]) > 1:  # an earlier message changes
            k = rng.randrange(len(body["messages"]))
            body["messages"][k] = _message(rng, turn)
        elif action < 0.8:
            body["tools"] = tools if "tools" not in body else [*tools, {"type": "function",
                                                                         "function": {"name": f"t{turn}"}}]
        elif action < 0.9:
            body["temperature"] = rng.random()
            body = dict(reversed(list(body.items()))) if rng.random() < 0.5 else body
        else:
            body["messages"] = body["messages"][: max(1, len(body["messages"]) // 2)]  # compaction
        if rng.random() < 0.05:  # the client changes how it writes JSON
            style = (style + 1) % 3
        parsed = _check(cache, _dump(body, style), "s", bt)
        reused += parsed.reused_chars > 0
    assert reused > 5  # the incremental path ran


def test_changed_earlier_block_reuses_nothing():
    cache = ChatPrefixCache(16, min_bytes=0)
    first = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    cache.parse(json.dumps(first).encode(), "s")
    edited = {"model": "m", "messages": [{"role": "user", "content": "x" * 100 + "y" + "x" * 4899},
                                         {"role": "assistant", "content": "ok"}]}
    parsed = _check(cache, json.dumps(edited).encode(), "s", 16)
    assert parsed.reused_chars == 0
    # the chain differs from the block holding the edit on, not before it
    old = hash_text(render_chat(first["messages"]), 16)
    assert parsed.prompt.hashes[:1] == tuple(old[:1]) and parsed.prompt.hashes[1] != old[1]


def test_equal_prefixes_give_equal_chains_and_sessions_do_not_mix():
    cache = ChatPrefixCache(16, min_bytes=0)
    base = [{"role": "system", "content": "s" * 3000}, {"role": "user", "content": "q" * 700}]
    a = cache.parse(json.dumps({"model": "m", "messages": base}).encode(), "a")
    b = cache.parse(json.dumps({"model": "m", "messages": base + [{"role": "user", "content": "z"}]}).encode(), "b")
    assert b.reused_chars == 0  # another session's body is never used
    assert b.prompt.hashes[: len(a.prompt.hashes)] == a.prompt.hashes
    # a body of session "a" that does not start with a's bytes (another model) is parsed whole
    c = _check(cache, json.dumps({"model": "n", "messages": base + [{"role": "user", "content": "z"}]}).encode(),
               "a", 16)
    assert c.reused_chars == 0 and c.prompt.hashes == b.prompt.hashes


def test_follow_up_reuses_and_tools_after_messages_must_match():
    cache = ChatPrefixCache(16, min_bytes=0)
    msgs = [{"role": "user", "content": "u" * 4000}]
    tools = [{"type": "function", "function": {"name": "a"}}]
    cache.parse(json.dumps({"model": "m", "messages": msgs, "tools": tools}).encode(), "s")
    more = msgs + [{"role": "assistant", "content": "v" * 300}]
    same = _check(cache, json.dumps({"model": "m", "messages": more, "tools": tools}).encode(), "s", 16)
    assert same.reused_chars > 4000
    other = _check(cache, json.dumps({"model": "m", "messages": more + more, "tools": tools[:0] + [
        {"type": "function", "function": {"name": "b"}}]}).encode(), "s", 16)
    assert other.reused_chars == 0


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1' + b"0" * 200 + b"}",
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}]} trailing',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "messages": []}',
    b'{"model": "m", "messages": [{"content": "no role"}]}',
    b'{"model": "m", "messages": []}',
    b'{"model": "m", "messages": "x"}',
    b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * 200 + b"]" * 200 + b"}]}",
    b"\xef\xbb\xbf" + b'{"model": "m", "messages": [{"role": "user", "content": "x"}]}',
    b'[1, 2]',
    b'{"model": "m"',
])
def test_what_the_edge_checks_refuse_is_left_to_the_caller(raw):
    cache = ChatPrefixCache(16, max_depth=128, max_number_chars=100, min_bytes=0)
    assert cache.parse(raw, "s") is None
    assert len(cache) == 0


def test_refused_follow_up_is_left_to_the_caller_and_cache_is_bounded():
    cache = ChatPrefixCache(16, max_sessions=2, min_bytes=0)
    msgs = [{"role": "user", "content": "u" * 100}]
    raw = json.dumps({"model": "m", "messages": msgs}).encode()
    cache.parse(raw, "s")
    assert cache.parse(raw[:-2] + b', {"role": "user", "content": 1' + b"0" * 100 + b"}]}", "s") is None
    assert cache.parse(raw[:-2] + b', {"role": "user"}], "messages": []}', "s") is None
    for s in ("a", "b", "c"):
        cache.parse(raw, s)
    assert len(cache) == 2 and cache.remembered_bytes == 2 * len(raw)
    cache.forget("c")
    assert len(cache) == 1


def test_bodies_without_a_session_key_are_matched_by_their_bytes():
    """Interleaved sessions of one agent (same system prompt, no session key) each extend their own last body."""
    rng = random.Random(3)
    cache = ChatPrefixCache(16, min_bytes=0)
    system = {"role": "system", "content": "s" * 3000}
    convs = [[system, {"role": "user", "content": f"task {i}"}] for i in range(5)]
    reused = []
    for turn in range(4):
        for conv in convs:
            conv.append(_message(rng, turn))
            parsed = _check(cache, json.dumps({"model": "m", "messages": conv}).encode(), None, 16)
            reused.append(parsed.reused_chars > 0)
    assert reused == [False] * 5 + [True] * 15
    assert len(cache) == 1  # one key: the bodies' common first bytes


def test_refuses_exactly_what_the_edge_checks_refuse():
    """Nesting and number-length limits agree with `router.request_checks.parse_json_body` at their boundaries."""
    from zoe_cluster.router.request_checks import RequestError, parse_json_body

    cache = ChatPrefixCache(16, max_depth=128, max_number_chars=100, min_bytes=0)
    bodies = []
    for k in (124, 125, 126):  # content nested k deep: the body is k + 3 deep
        bodies.append(b'{"model":"m","messages":[{"role":"user","content":' + b"[" * k + b"]" * k + b"}]}")
        bodies.append(b'{"model":"m","messages":[{"role":"user","content":"x"}],"x":' + b"[" * (k + 2)
                      + b"]" * (k + 2) + b"}")
    for n in (99, 100, 101):
        bodies.append(b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-' + b"1" * n + b".5e3}")
        bodies.append(b'{"model":"m","messages":[{"role":"user","content":"' + b"1" * n * 2 + b'"}]}')
    for raw in bodies:
        try:
            parse_json_body(raw, 128, 100)
            accepted = True
        except RequestError:
            accepted = False
        assert (cache.parse(raw, None) is not None) == accepted, raw[:80]


def test_short_bodies_are_not_remembered():
    cache = ChatPrefixCache(16, min_bytes=2000)
    short = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100}]}).encode()
    long = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 3000}]}).encode()
    assert cache.parse(short, "a") is not None and cache.parse(short, None) is not None
    assert len(cache) == 0
    cache.parse(long, "a")
    assert len(cache) == 1 and cache.remembered_bytes == len(long)
