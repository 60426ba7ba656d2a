"""Block hashing for prefix locality, defined once for the router, `zoe sim replay` and `zoe bench trace`.

A prompt is cut into fixed-size blocks of tokens; each *full* block gets a hash that also covers every block
before it (a chain), so two prompts share their first k chain hashes exactly when they share their first k
blocks. A trailing partial block is never hashed: engines cache only full blocks too.

The router has no tokenizer, so it works on an estimate:

- **Tokens from text**: `estimate_tokens(text) = ceil(len(text) / CHARS_PER_TOKEN)` with `CHARS_PER_TOKEN = 4`
  (characters, not bytes; English BPE vocabularies average about 4 characters per token).
- **Blocks of text**: a block is `block_tokens * CHARS_PER_TOKEN` characters, so a block of the default
  `DEFAULT_BLOCK_TOKENS = 64` tokens is 256 characters of the rendered prompt.
- **Prompts given as token ids** (`/v1/completions` with a list of ints) are cut into blocks of exactly
  `block_tokens` ids and counted exactly.
- **Chat messages** are rendered before hashing by `render_chat(messages, tools)`: for each message
  `"<|{role}|>" + ("name=" + name + "\\n" if name) + content + "<|end|>\\n"`, where a list content keeps the
  text of its text parts and a canonical JSON of every other part (images, audio), and tool calls are appended
  as canonical JSON; a `tools` list, when present, comes first as `"<|tools|>" + canonical JSON + "<|end|>\\n"`.
  Canonical JSON is `json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)`. The rendering
  is not the model's chat template; it only has to be deterministic and prefix-preserving (appending a message
  never changes the rendering of the messages before it), which is what prefix locality needs.
- **Chain hash**: `h_0 = H(SEED, block_0)`, `h_i = H(h_{i-1}, block_i)` where `H` is BLAKE2b with an 8-byte
  digest over the parent hash (8 bytes, big-endian) followed by the block's bytes (UTF-8 text, or the ids as
  4-byte little-endian unsigned ints). Hashes are Python ints in [0, 2**64).
- **Traces** (Mooncake `hash_ids`, one id per 512-token block, equal ids = equal block content):
  `chain_hashes(hash_ids)` hashes each id as its 8-byte big-endian value in the same chain, and the caller sets
  `block_tokens=MOONCAKE_BLOCK_TOKENS` (512) on the `RequestContext`.

Hashes from different block sizes never match each other; a router uses one block size for all requests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

CHARS_PER_TOKEN = 4
"""Characters per token assumed when the router estimates tokens from text."""

DEFAULT_BLOCK_TOKENS = 64
"""Block size, tokens, the live router hashes prompts with (a multiple of vLLM's and SGLang's page sizes is
not needed: the router's index is approximate and only compares requests with each other)."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry in the Mooncake traces."""

_SEED = b"zoe-prefix-v1\x00\x00\x00"[:8]


def estimate_tokens(text: str) -> int:
    """Estimated token count of `text` (ceil of characters / CHARS_PER_TOKEN); 0 for empty text."""
    return -(-len(text) // CHARS_PER_TOKEN)


def _chain(blocks: Iterable[bytes], parent: bytes = _SEED) -> list[int]:
    out: list[int] = []
    append, from_bytes = out.append, int.from_bytes
    for data in blocks:
        parent = blake2b(parent + data, digest_size=8).digest()
        append(from_bytes(parent, "big"))
    return out


def _chain_text(text: str, step: int, parent: bytes = _SEED) -> list[int]:
    """Chain hashes of the full `step`-character blocks of `text`, continuing the chain from `parent`."""
    end = len(text) // step * step
    if text.isascii():  # one character is one byte: slice the encoded text instead of encoding every block
        data = text.encode("ascii")
        return _chain((data[i : i + step] for i in range(0, end, step)), parent)
    return _chain((text[i : i + step].encode("utf-8", "surrogatepass") for i in range(0, end, step)), parent)


def hash_text(text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[int]:
    """Chain hashes of every full block of `text` (block = block_tokens * CHARS_PER_TOKEN characters)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    return _chain_text(text, block_tokens * CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class TextChain:
    """The chain hashes of a text that grows at its end, kept so that only the appended text is hashed.

    `TextChain(block_tokens).extend(pieces)` equals hashing `"".join(pieces)` with `hash_text`, and
    `chain.extend(a).extend(b) == chain.extend([*a, *b])`: the state is the full blocks' hashes plus the characters
    after the last full block (`tail`, shorter than one block)."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    hashes: tuple[int, ...] = ()
    """Chain hashes of the full blocks so far, first block first."""
    tail: str = ""
    """The text after the last full block (fewer than block_tokens * CHARS_PER_TOKEN characters)."""
    chars: int = 0
    """Characters of the whole text so far."""

    def __post_init__(self) -> None:
        if self.block_tokens <= 0:
            raise ValueError(f"block_tokens must be positive, got {self.block_tokens}")

    @property
    def tokens(self) -> int:
        """Estimated tokens of the whole text (`estimate_tokens`)."""
        return -(-self.chars // CHARS_PER_TOKEN)

    def extend(self, pieces: Sequence[str]) -> TextChain:
        """The chain of this text followed by `pieces`; hashes only the blocks the pieces complete."""
        text = "".join([self.tail, *pieces]) if self.tail else "".join(pieces)
        if not text:
            return self
        step = self.block_tokens * CHARS_PER_TOKEN
        full = len(text) // step * step
        hashes = self.hashes
        if full:
            parent = hashes[-1].to_bytes(8, "big") if hashes else _SEED
            hashes = hashes + tuple(_chain_text(text, step, parent))
        return TextChain(self.block_tokens, hashes, text[full:], self.chars + len(text) - len(self.tail))


def hash_token_ids(token_ids: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[int]:
    """Chain hashes of every full block of `block_tokens` token ids."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    full = len(token_ids) // block_tokens
    return _chain(
        b"".join((t & 0xFFFFFFFF).to_bytes(4, "little") for t in token_ids[i * block_tokens : (i + 1) * block_tokens])
        for i in range(full)
    )


def chain_hashes(block_ids: Iterable[int]) -> list[int]:
    """Chain hashes of a sequence of block ids (e.g. a Mooncake trace's `hash_ids`): equal id prefixes give
    equal chain prefixes, and an id seen after a different prefix gives a different hash."""
    return _chain((b & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") for b in block_ids)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                parts.append(canonical_json(part))
        return "".join(parts)
    return canonical_json(content)


def render_tools(tools: Sequence[Any] | None) -> str:
    """The rendering of a request's `tools` list (empty when there is none); it comes before the messages."""
    return f"<|tools|>{canonical_json(list(tools))}<|end|>\n" if tools else ""


def render_message(index: int, msg: Any) -> str:
    """The rendering of one chat message (`index` names it in the error).

    Raises ValueError when the message is not an object with a string `role`."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise ValueError(f"messages[{index}] must be an object with a string 'role'")
    name = msg.get("name")
    head = f"<|{msg['role']}|>name={name}\n" if isinstance(name, str) and name else f"<|{msg['role']}|>"
    calls = msg.get("tool_calls")
    return "".join((head, _content_text(msg.get("content")), canonical_json(calls) if calls else "", "<|end|>\n"))


def render_chat(messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None) -> str:
    """The text a chat request is hashed and counted as (see the module docstring for the exact format): the
    tools (`render_tools`), then each message (`render_message`).

    Raises ValueError when a message is not an object with a string `role`."""
    return "".join([render_tools(tools), *(render_message(i, m) for i, m in enumerate(messages))])


def blocks_for_tokens(tokens: int, block_tokens: int) -> int:
    """Full blocks in a prompt of `tokens` tokens."""
    return tokens // block_tokens if block_tokens > 0 else 0


def ceil_blocks(tokens: int, block_tokens: int) -> int:
    """Blocks (the last one partial) that hold `tokens` tokens."""
    return math.ceil(tokens / block_tokens) if block_tokens > 0 else 0
