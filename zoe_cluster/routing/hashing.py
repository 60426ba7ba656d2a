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
- **Chain hash**: each full block's bytes (UTF-8 text, or the ids as 4-byte little-endian unsigned ints), zero-
  padded to a multiple of 8 and read as little-endian 64-bit words `w_0..w_{m-1}`, give the block value
  `b = fmix(L * K_LEN + sum_k mix(w_k ^ splitmix(k)))` (`L` the block's byte length); the chain is the running
  sum `S_i = S_{i-1} + b_i * (splitmix(i) | 1)` from `S_{-1} = SEED`, and `h_i = fmix(S_i)`. All arithmetic is
  modulo 2**64; `mix(x) = y ^ (y >> 32)` with `y = x * C1`, `fmix` is MurmurHash3's 64-bit finalizer and
  `splitmix` SplitMix64's output function (constants below). Every step is a bijection of one word and the
  position multipliers are odd, so blocks that differ in one word always hash differently, and a block's value
  counts differently at every position. It is computed for all blocks of a prompt at once (numpy), which is what
  makes long prompts cheap; it is not a cryptographic hash (the index only steers load: a chosen collision
  misroutes one request, and engines key their caches with their own hashes). Hashes are ints in [0, 2**64).
- **Traces** (Mooncake `hash_ids`, one id per 512-token block, equal ids = equal block content):
  `chain_hashes(hash_ids)` hashes each id as an 8-byte block (its big-endian value) in the same chain; the
  caller sets `block_tokens=MOONCAKE_BLOCK_TOKENS` (512) on the `RequestContext`.

Hashes from different block sizes never match each other; a router uses one block size for all requests.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CHARS_PER_TOKEN = 4
"""Characters per token assumed when the router estimates tokens from text."""

DEFAULT_BLOCK_TOKENS = 64
"""Block size, tokens, the live router hashes prompts with (a multiple of vLLM's and SGLang's page sizes is
not needed: the router's index is approximate and only compares requests with each other)."""

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per `hash_ids` entry in the Mooncake traces."""

SEED = 0x7A6F_652D_7066_7832
"""The chain's starting sum (the bytes "zoe-pfx2")."""
_C1, _C2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)  # MurmurHash3 fmix64's multipliers
_K_LEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (the golden ratio)
_S1, _S2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # SplitMix64 multipliers


def _fmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(33))
    x *= _C1
    x ^= x >> np.uint64(33)
    x *= _C2
    x ^= x >> np.uint64(33)
    return x


def _splitmix(i: np.ndarray) -> np.ndarray:
    z = (i + np.uint64(1)) * _K_LEN
    z = (z ^ (z >> np.uint64(30))) * _S1
    z = (z ^ (z >> np.uint64(27))) * _S2
    return z ^ (z >> np.uint64(31))


_CHUNK_BYTES = 256 * 1024
"""Rows hashed per numpy pass: small enough to stay in a core's L2 cache, which halves the time at 1M tokens."""


def _block_values(rows: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
    """Block values `b` of blocks given as rows of zero-padded bytes (uint8, width a multiple of 8) with their
    byte lengths (one int when every row is full)."""
    words = rows.view("<u8")
    n, m = words.shape
    keys = _splitmix(np.arange(m, dtype=np.uint64))
    if isinstance(lengths, int):
        own_words = None
        lengths = np.full(n, lengths, dtype=np.uint64)
    else:  # rows of different lengths: a row's own padding words only
        own_words = np.arange(m) < ((lengths + 7) // 8)[:, None]
        lengths = lengths.astype(np.uint64)
    sums = np.empty(n, dtype=np.uint64)
    chunk = max(1, _CHUNK_BYTES // max(1, rows.shape[1]))
    y_buf = np.empty((min(chunk, n), m), dtype=np.uint64)
    t_buf = np.empty_like(y_buf)
    for a in range(0, n, chunk):
        w = words[a : a + chunk]
        y, t = y_buf[: len(w)], t_buf[: len(w)]
        np.bitwise_xor(w, keys, out=y)
        np.multiply(y, _C1, out=y)
        np.right_shift(y, np.uint64(32), out=t)
        np.bitwise_xor(y, t, out=y)
        if own_words is not None:
            np.multiply(y, own_words[a : a + chunk], out=y)
        y.sum(axis=1, dtype=np.uint64, out=sums[a : a + len(w)])
    return _fmix(sums + lengths * _K_LEN)


def _extend_chain(values: np.ndarray, start: int, prev_sum: int) -> tuple[list[int], int]:
    """Chain hashes of blocks start, start+1, ... with block values `values`, continuing from the running sum
    `prev_sum`: (hashes, the running sum after the last block)."""
    if not len(values):
        return [], prev_sum
    sums = np.cumsum(values * (_splitmix(np.arange(start, start + len(values), dtype=np.uint64)) | np.uint64(1)),
                     dtype=np.uint64)
    sums += np.array([prev_sum], dtype=np.uint64)
    return _fmix(sums).tolist(), int(sums[-1])


def _rows(data: bytes, n: int, width: int) -> np.ndarray:
    """The first n blocks of `width` bytes of `data` as rows zero-padded to a multiple of 8 bytes."""
    rows = np.frombuffer(data, dtype=np.uint8, count=n * width).reshape(n, width)
    pad = -width % 8
    return np.pad(rows, ((0, 0), (0, pad))) if pad else rows


_SEGMENT_BLOCKS = 16
"""Blocks per segment a non-ASCII text is checked in: an ASCII segment's blocks are hashed as rows, the others
block by block."""


def _text_values(text: str, step: int) -> np.ndarray:
    """Block values of the full `step`-character blocks of `text`."""
    n = len(text) // step
    if not n:
        return np.zeros(0, dtype=np.uint64)
    if text.isascii():  # one byte per character: the blocks are rows of the encoded text, no copy
        return _block_values(_rows(text.encode("ascii"), n, step), step)
    seg = _SEGMENT_BLOCKS * step
    ascii_parts: list[str] = []
    blocks: list[bytes] = []
    seg_ascii = []
    for a in range(0, n * step, seg):
        part = text[a : min(a + seg, n * step)]
        seg_ascii.append(part.isascii())
        if seg_ascii[-1]:
            ascii_parts.append(part)
        else:
            blocks += [part[i : i + step].encode("utf-8", "surrogatepass") for i in range(0, len(part), step)]
    values = np.empty(n, dtype=np.uint64)
    in_ascii = np.repeat(np.array(seg_ascii), _SEGMENT_BLOCKS)[:n]
    if ascii_parts:
        values[in_ascii] = _block_values(_rows("".join(ascii_parts).encode("ascii"), int(in_ascii.sum()), step), step)
    if blocks:
        width = -(-max(map(len, blocks)) // 8) * 8
        rows = np.frombuffer(b"".join(b.ljust(width, b"\0") for b in blocks), dtype=np.uint8)
        lengths = np.fromiter(map(len, blocks), dtype=np.int64, count=len(blocks))
        values[~in_ascii] = _block_values(rows.reshape(len(blocks), width), lengths)
    return values


def estimate_tokens(text: str) -> int:
    """Estimated token count of `text` (ceil of characters / CHARS_PER_TOKEN); 0 for empty text."""
    return -(-len(text) // CHARS_PER_TOKEN)


def hash_text(text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[int]:
    """Chain hashes of every full block of `text` (block = block_tokens * CHARS_PER_TOKEN characters)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    return _extend_chain(_text_values(text, block_tokens * CHARS_PER_TOKEN), 0, SEED)[0]


@dataclass(frozen=True, slots=True)
class TextChain:
    """The chain hashes of a text that grows at its end, kept so that only the appended text is hashed.

    `TextChain(block_tokens).extend(pieces)` equals hashing `"".join(pieces)` with `hash_text`, and
    `chain.extend(a).extend(b) == chain.extend([*a, *b])`: the state is the full blocks' hashes, the chain's
    running sum, and the characters after the last full block (`tail`, shorter than one block)."""

    block_tokens: int = DEFAULT_BLOCK_TOKENS
    hashes: tuple[int, ...] = ()
    """Chain hashes of the full blocks so far, first block first."""
    tail: str = ""
    """The text after the last full block (fewer than block_tokens * CHARS_PER_TOKEN characters)."""
    chars: int = 0
    """Characters of the whole text so far."""
    chain_sum: int = SEED
    """The chain's running sum after the last full block (module docstring)."""

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
        hashes, chain_sum = self.hashes, self.chain_sum
        if full:
            new, chain_sum = _extend_chain(_text_values(text, step), len(hashes), chain_sum)
            hashes = hashes + tuple(new)
        return TextChain(self.block_tokens, hashes, text[full:], self.chars + len(text) - len(self.tail), chain_sum)


def hash_token_ids(token_ids: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS) -> list[int]:
    """Chain hashes of every full block of `block_tokens` token ids."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    n = len(token_ids) // block_tokens
    if not n:
        return []
    ids = token_ids[: n * block_tokens]
    try:
        words = np.array(ids, dtype=np.int64).astype("<u4")  # wraps modulo 2**32, as the bytes do
    except OverflowError:
        words = np.array([t & 0xFFFFFFFF for t in ids], dtype="<u4")
    return _extend_chain(_block_values(_rows(words.tobytes(), n, 4 * block_tokens), 4 * block_tokens), 0, SEED)[0]


def chain_hashes(block_ids: Iterable[int]) -> list[int]:
    """Chain hashes of a sequence of block ids (e.g. a Mooncake trace's `hash_ids`): equal id prefixes give
    equal chain prefixes, and an id seen after a different prefix gives a different hash."""
    ids = [b & 0xFFFFFFFFFFFFFFFF for b in block_ids]
    rows = np.array(ids, dtype=">u8").view(np.uint8).reshape(len(ids), 8)
    return _extend_chain(_block_values(rows, 8), 0, SEED)[0]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(obj: Any) -> str:
    """`json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` (one encoder, built once)."""
    return _CANONICAL.encode(obj)


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
