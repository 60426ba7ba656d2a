"""Block hashing: the one definition of prefix locality."""

from __future__ import annotations

import pytest

from zoe_cluster.routing import (
    BadRequest,
    CHARS_PER_TOKEN,
    chain_hashes,
    context_from_openai,
    estimate_tokens,
    hash_text,
    hash_token_ids,
    render_chat,
)


def test_shared_prefix_shares_exactly_the_leading_blocks():
    block = 16 * CHARS_PER_TOKEN
    a = "x" * block + "y" * block + "z" * block
    b = "x" * block + "y" * block + "w" * block
    ha, hb = hash_text(a, 16), hash_text(b, 16)
    assert len(ha) == 3 and ha[:2] == hb[:2] and ha[2] != hb[2]
    # the same block content after a different prefix hashes differently (chained)
    c = "q" * block + "y" * block
    assert hash_text(c, 16)[1] != ha[1]


def test_partial_block_is_not_hashed_and_tokens_are_estimated():
    text = "a" * (16 * CHARS_PER_TOKEN * 2 + 5)
    assert len(hash_text(text, 16)) == 2
    assert estimate_tokens(text) == -(-len(text) // CHARS_PER_TOKEN)
    assert estimate_tokens("") == 0


def test_token_ids_and_trace_ids_chain():
    ids = list(range(100))
    assert len(hash_token_ids(ids, 32)) == 3
    assert hash_token_ids(ids, 32)[:2] == hash_token_ids(ids[:64] + [7] * 40, 32)[:2]
    assert chain_hashes([0, 1, 2])[:2] == chain_hashes([0, 1, 9])[:2]
    assert chain_hashes([0, 1, 2])[2] != chain_hashes([5, 1, 2])[2]
    assert all(0 <= h < 2**64 for h in chain_hashes([0, 2**70]))


def test_chat_rendering_is_prefix_preserving():
    m1 = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "hi"}]
    m2 = m1 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert render_chat(m2).startswith(render_chat(m1))
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    assert "a" in render_chat(parts) and '"image_url"' in render_chat(parts)
    assert render_chat(m1, tools=[{"type": "function"}]).startswith("<|tools|>")
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        render_chat([{"content": "no role"}])


def test_context_from_openai_fields_and_errors():
    ctx = context_from_openai(
        "chat",
        {"model": "m", "messages": [{"role": "user", "content": "x" * 1000}], "max_tokens": 7, "user": "u1"},
        request_id="r",
        block_tokens=16,
    )
    assert ctx.model == "m" and ctx.max_tokens == 7 and ctx.session == "u1" and ctx.prefix_blocks > 10
    hdr = context_from_openai("completions", {"model": "m", "prompt": [1, 2, 3]}, request_id="r", session_header="s")
    assert hdr.prompt_tokens == 3 and hdr.session == "s"
    for body, field in [
        ({"prompt": "x"}, "model"),
        ({"model": "m", "prompt": 5}, "prompt"),
        ({"model": "m", "prompt": "x", "max_tokens": -1}, "max_tokens"),
    ]:
        with pytest.raises(BadRequest, match=field):
            context_from_openai("completions", body, request_id="r")
    with pytest.raises(BadRequest, match="messages"):
        context_from_openai("chat", {"model": "m", "messages": []}, request_id="r")
