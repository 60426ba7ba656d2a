"""Prompt text synthesized from a session's `hash_ids`.

Each hash id becomes one block of `block_tokens` tokens of text derived only from its *block key* (the id within
its scope, `block_key`), so equal ids give equal text and a request whose ids extend another's has that
request's block text as a true prefix. The trailing partial block (the format gives ids to full blocks only) is
text unique to the request. Text is sized for the simulated engine's tokenization (`zoe_cluster.sim.tokens`:
4 characters per token), where token counts come out exact; a real tokenizer counts differently, which
`block_tokens` and the length caps (`Scaling`) absorb for small models.

Scopes: a "local" session's ids are private to its file, so its keys carry the session instance; a "global"
session's ids are shared by every file. Every key also carries a run salt: a non-zero salt gives text no earlier
run put in an engine's cache (the first-turn cache bust).
"""

from __future__ import annotations

from dataclasses import dataclass

from zoe_cluster.routing.hashing import CHARS_PER_TOKEN

_ID_BITS = 40
_INSTANCE_BITS = 16
_SALT_BITS = 8


@dataclass(frozen=True, slots=True)
class Scaling:
    """How trace token counts map to the prompts sent.

    `block_tokens` tokens per hash id (default: the trace's `block_size`); the partial tail scales by the same
    ratio. `max_input_tokens` cuts a prompt to its first tokens (whole blocks kept first, so prefixes stay
    prefixes), `max_output_tokens` caps outputs; every request asks for at least one output token."""

    block_tokens: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_tokens", "max_input_tokens", "max_output_tokens"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be positive, got {v}")


def scope_number(salt: int, instance: int) -> int:
    """The scope part of a block key: the run salt and the session instance (for "global" ids, the copy number,
    so that repeated files stay distinct users while the files of one pass share their ids)."""
    if not 0 <= salt < 1 << _SALT_BITS:
        raise ValueError(f"salt must be in [0, {1 << _SALT_BITS}), got {salt}")
    if not 0 <= instance < 1 << _INSTANCE_BITS:
        raise ValueError(f"session instance must be in [0, {1 << _INSTANCE_BITS}), got {instance}")
    return (salt << _INSTANCE_BITS) | instance


def block_key(scope: int, hash_id: int) -> int:
    """One block's key: equal keys are equal blocks (and equal text)."""
    if not 0 <= hash_id < 1 << _ID_BITS:
        raise ValueError(f"hash id {hash_id} is outside [0, 2**{_ID_BITS})")
    return (scope << _ID_BITS) | hash_id


def scale_request(input_tokens: int, output_tokens: int, n_ids: int, block_size: int,
                   scaling: Scaling) -> tuple[int, int, int]:
    """(blocks kept, prompt tokens, output tokens) of a request after `scaling`."""
    bt = scaling.block_tokens or block_size
    tail = round((input_tokens - n_ids * block_size) * bt / block_size)
    n_in = n_ids * bt + tail
    blocks = n_ids
    if scaling.max_input_tokens is not None and n_in > scaling.max_input_tokens:
        n_in = scaling.max_input_tokens
        blocks = min(n_ids, n_in // bt)
    n_out = max(1, output_tokens if scaling.max_output_tokens is None else min(output_tokens, scaling.max_output_tokens))
    return blocks, max(1, n_in), n_out


def _fill(unit: str, chars: int) -> str:
    return (unit * (chars // len(unit) + 1))[:chars]


_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def _word(key: int) -> str:
    """" " + the base-36 digits of a 64-bit mix of `key`: its leading characters already differ between keys,
    so even blocks shorter than the word (a few tokens, for small models) differ (2 keys share the first c
    characters with probability 36**-c)."""
    x = (key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 29
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 32
    out = []
    while x:
        x, d = divmod(x, 36)
        out.append(_DIGITS[d])
    return " " + "".join(out)


def prompt_text(keys: tuple[int, ...], block_tokens: int, input_tokens: int, tail_key: str) -> str:
    """`input_tokens` tokens of text: one block of `block_tokens` tokens per key, then a tail unique to
    `tail_key` (the request) up to the length."""
    chars = block_tokens * CHARS_PER_TOKEN
    body = "".join(_fill(_word(k), chars) for k in keys)
    total = input_tokens * CHARS_PER_TOKEN
    if len(body) >= total:
        return body[:total]
    return body + _fill(f" q{tail_key}", total - len(body))
