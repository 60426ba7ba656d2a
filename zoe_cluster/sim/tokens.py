"""The simulated engine's tokenization: documented, deterministic, and the same arithmetic the router uses.

- **Text -> tokens**: a token is 4 characters of the text (`routing.hashing.CHARS_PER_TOKEN`); a prompt of n
  characters has ceil(n / 4) tokens. So the router's token estimate is exact on the simulated engine.
- **Token-id prompts** (`/v1/completions` with a list of ints) have exactly that many tokens.
- **Chat messages** are rendered with `routing.hashing.render_chat` before counting (the router's rendering).
- **Prefix blocks**: the engine hashes full blocks of its KV block size with `routing.hashing.hash_text` /
  `hash_token_ids` (chain hashes), so equal leading blocks of text give equal cache keys.
- **Mooncake traces** (`hash_ids`, one id per 512-token block): `hash_ids_to_text` writes each id as a
  2,048-character block (512 tokens) of text derived only from the id, cut to `input_length` tokens, so two
  requests share exactly as many leading blocks of text as of hash ids.
- **Generated text**: each output token is one of 64 four-character pieces, picked by a generator seeded with
  (server seed, request number), so a seed reproduces every response.
"""

from __future__ import annotations

import random

from zoe_cluster.routing.hashing import (
    CHARS_PER_TOKEN,
    MOONCAKE_BLOCK_TOKENS,
    estimate_tokens,
    hash_text,
    hash_token_ids,
    render_chat,
)

__all__ = [
    "CHARS_PER_TOKEN", "OutputText", "count_text_tokens", "hash_ids_to_text", "prompt_blocks", "render_chat",
]

_PIECES = tuple(
    f" {w}"[:4].ljust(4, "s")
    for w in (
        "the and for you not but can all new one way use may any how our out day get has him his old see two "
        "who its did let put say she too own set yes yet run far few big low end top job law art war air sun "
        "sea arm map box cup dog egg fan gas hat ice key leg ant"
    ).split()
)


def count_text_tokens(text: str) -> int:
    """Tokens of `text` on the simulated engine: ceil(characters / 4)."""
    return estimate_tokens(text)


def prompt_blocks(prompt: str | list[int], block_tokens: int) -> tuple[int, tuple[int, ...]]:
    """(token count, chain hashes of the full blocks) of a text or token-id prompt."""
    if isinstance(prompt, str):
        return count_text_tokens(prompt), tuple(hash_text(prompt, block_tokens))
    return len(prompt), tuple(hash_token_ids(prompt, block_tokens))


def _block_text(block_id: int) -> str:
    unit = f" b{block_id:x}"
    chars = MOONCAKE_BLOCK_TOKENS * CHARS_PER_TOKEN
    return (unit * (chars // len(unit) + 1))[:chars]


def hash_ids_to_text(hash_ids: tuple[int, ...] | list[int], input_len: int) -> str:
    """Prompt text of a Mooncake request: one 512-token block of text per hash id, `input_len` tokens in all
    (the last block cut short; blocks past the ids, if input_len asks for more, derive from the last id)."""
    if input_len <= 0:
        raise ValueError(f"input_len must be positive, got {input_len}")
    ids = list(hash_ids) or [0]
    need_blocks = -(-input_len // MOONCAKE_BLOCK_TOKENS)
    while len(ids) < need_blocks:
        ids.append(ids[-1] * 1_000_003 + len(ids))
    text = "".join(_block_text(b) for b in ids[:need_blocks])
    return text[: input_len * CHARS_PER_TOKEN]


class OutputText:
    """The output tokens of one request: `next(n)` returns the next n tokens as text (4 characters each)."""

    __slots__ = ("_rng",)

    def __init__(self, seed: int, request_number: int) -> None:
        self._rng = random.Random((seed << 32) ^ request_number)

    def next(self, n_tokens: int) -> str:
        bits = self._rng.getrandbits
        return "".join(_PIECES[bits(6)] for _ in range(n_tokens))
