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


def _reference_chain(blocks: list[bytes]) -> list[int]:
    """The documented chain hash, written out one block at a time with Python ints."""
    m64 = (1 << 64) - 1

    def fmix(x):
        for mult in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
            x = ((x ^ (x >> 33)) * mult) & m64
        return x ^ (x >> 33)

    def splitmix(i):
        z = ((i + 1) * 0x9E3779B97F4A7C15) & m64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    out, s = [], 0x7A6F652D70667832
    for i, block in enumerate(blocks):
        padded = block + b"\0" * (-len(block) % 8)
        v = len(block) * 0x9E3779B97F4A7C15
        for k in range(len(padded) // 8):
            y = ((int.from_bytes(padded[8 * k : 8 * k + 8], "little") ^ splitmix(k)) * 0xFF51AFD7ED558CCD) & m64
            v += y ^ (y >> 32)
        s = (s + fmix(v & m64) * (splitmix(i) | 1)) & m64
        out.append(fmix(s))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_chain_hash_is_the_documented_definition(seed):
    """The vectorised hash equals the module docstring's definition computed block by block, on ASCII and
    non-ASCII text (lone surrogates too), token ids (out-of-range ones wrap) and trace ids."""
    import random

    rng = random.Random(seed)
    for _ in range(20):
        bt = rng.choice([1, 3, 16, 64])
        step = bt * CHARS_PER_TOKEN
        pieces = ["abc ", "x" * 90, "é", "中文", "\ud800", "😀", "\n"]
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(300)))
        blocks = [text[i : i + step].encode("utf-8", "surrogatepass") for i in range(0, len(text) // step * step, step)]
        assert hash_text(text, bt) == _reference_chain(blocks)
        ids = [rng.randrange(-5, 2**33) for _ in range(rng.randrange(200))]
        id_blocks = [b"".join((t & 0xFFFFFFFF).to_bytes(4, "little") for t in ids[i : i + bt])
                     for i in range(0, len(ids) // bt * bt, bt)]
        assert hash_token_ids(ids, bt) == _reference_chain(id_blocks)
        trace = [rng.randrange(2**70) for _ in range(rng.randrange(50))]
        assert chain_hashes(trace) == _reference_chain([(t % 2**64).to_bytes(8, "big") for t in trace])


def test_one_changed_byte_changes_its_block_and_every_later_hash():
    import random

    rng = random.Random(5)
    text = "".join(rng.choice("abcdefgh \n") for _ in range(64 * 4 * 40))
    base = hash_text(text, 64)
    for pos in rng.sample(range(len(text)), 40):
        edited = text[:pos] + ("z" if text[pos] != "z" else "y") + text[pos + 1 :]
        h = hash_text(edited, 64)
        k = pos // (64 * CHARS_PER_TOKEN)
        assert h[:k] == base[:k] and all(a != b for a, b in zip(h[k:], base[k:]))
