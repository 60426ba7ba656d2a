"""Prompts of the workloads: the seed's two decode prompts, prompt files, and synthetic text of a set length.

Lengths are set in the server's tokens. A `TokenCounter` says how many tokens a text is:
- `SimTokenCounter` applies zoe's simulated engine's documented tokenization locally: exact;
- `EndpointTokenCounter` asks the server's `/tokenize` (vLLM): exact;
- `RatioTokenCounter` uses tokens per character calibrated once from `usage.prompt_tokens` of a one-token
  request (any OpenAI-compatible server), or the router's 4-characters-per-token estimate as a last resort.
Synthetic text is random common English words (most tokenizers give about one token per word), so an exact
counter converges in a few calls and a ratio counter lands within a few percent.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

import aiohttp

from zoe_cluster.routing.hashing import CHARS_PER_TOKEN

# The seed's decode prompts (seed 003, "Decode": Apex-Shortlist, heavy reasoning; GSM8K, simple math).
APEX_PROMPT = (
    "Determine the sum of the smallest 50 possible values of \\(gcd(a2+b2+c2,abc)\\) across all triples of "
    "positive integers \\((a,b,c)\\). Let's think step by step and output the final answer within \\boxed{}."
)
GSM8K_PROMPT = (
    "Tobias is buying a new pair of shoes that costs $95. He has been saving up his money each month for the "
    "past three months. He gets a $5 allowance a month. He also mows lawns and shovels driveways. He charges $15 "
    "to mow a lawn and $7 to shovel. After buying the shoes, he has $15 in change. If he mows 4 lawns, how many "
    "driveways did he shovel?"
)
BUILTIN_PROMPTS = {"apex": APEX_PROMPT, "gsm8k": GSM8K_PROMPT}

WORDS = (
    "the of and to in is was for on that with as by at from his her they which this be are an or had not but "
    "what all were when we there can more if no man out other so time up about into only new some could these "
    "two may then first any like now my such make over our even most me state after also made many did must "
    "before back see through way where get much go well your know should down work year because come people "
    "just say each those take day good how long little own very great old here world thing life hand part "
    "model token expert router cache prefix replica decode prefill latency throughput node kernel attention "
    "sparse index batch request user system number zero one three four five six seven eight nine ten"
).split()


def load_prompt(name_or_file: str) -> tuple[str, str]:
    """(label, text) of a built-in prompt (`apex`, `gsm8k`) or a UTF-8 text file. Raises ValueError."""
    key = name_or_file.lower()
    if key in BUILTIN_PROMPTS:
        return key, BUILTIN_PROMPTS[key]
    path = Path(name_or_file)
    if not path.is_file():
        known = ", ".join(BUILTIN_PROMPTS)
        raise ValueError(f"unknown prompt {name_or_file!r}: not one of {known} nor a readable file")
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise ValueError(f"prompt file {path} is empty")
    return path.name, text


class TokenCounter(Protocol):
    """Counts a text's tokens the way the server will."""

    name: str
    exact: bool

    async def count(self, text: str) -> int: ...


class RatioTokenCounter:
    """An estimate: `ceil(len(text) * tokens_per_char)`."""

    exact = False

    def __init__(self, tokens_per_char: float = 1.0 / CHARS_PER_TOKEN, name: str = "estimate"):
        if tokens_per_char <= 0:
            raise ValueError("tokens_per_char must be positive")
        self.tokens_per_char = tokens_per_char
        self.name = name

    async def count(self, text: str) -> int:
        return -(-int(len(text) * self.tokens_per_char * 1_000_000) // 1_000_000)


class EndpointTokenCounter:
    """The server's `/tokenize` (`{"model", "prompt", "add_special_tokens": false}` -> `{"count"}`)."""

    exact = True

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str, path: str = "/tokenize"):
        self.session, self.url, self.model = session, base_url.rstrip("/") + path, model
        self.name = f"server {path}"

    async def count(self, text: str) -> int:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        async with self.session.post(self.url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.url} answered HTTP {resp.status}: {(await resp.text())[:200]}")
            data = await resp.json()
        if "count" in data:
            return int(data["count"])
        return len(data["tokens"])


class SimTokenCounter:
    """zoe's simulated engine's documented tokenization (`zoe_cluster.sim.tokens`): exact, no round trip."""

    exact = True
    name = "simulated engine's tokenization (zoe_cluster.sim.tokens)"

    async def count(self, text: str) -> int:
        from zoe_cluster.sim.tokens import count_text_tokens

        return count_text_tokens(text)


async def probe_token_counter(session: aiohttp.ClientSession, base_url: str, model: str) -> TokenCounter:
    """The best counter the server offers: its /tokenize if it answers, else a ratio calibrated from the
    `usage.prompt_tokens` of one `max_tokens=1` request, else the 4-characters-per-token estimate."""
    sample = synthetic_text(random.Random(0), 2000)
    for path in ("/tokenize", "/v1/tokenize"):
        counter = EndpointTokenCounter(session, base_url, model, path)
        try:
            if await counter.count(sample) > 0:
                return counter
        except (aiohttp.ClientError, RuntimeError, KeyError, ValueError):
            continue
    try:
        body = {"model": model, "prompt": sample, "max_tokens": 1, "temperature": 0.0}
        async with session.post(base_url.rstrip("/") + "/v1/completions", json=body) as resp:
            if resp.status == 200:
                usage = (await resp.json()).get("usage") or {}
                if usage.get("prompt_tokens"):
                    return RatioTokenCounter(usage["prompt_tokens"] / len(sample), name="usage-calibrated ratio")
    except (aiohttp.ClientError, ValueError):
        pass
    return RatioTokenCounter()


def synthetic_text(rng: random.Random, n_words: int) -> str:
    """`n_words` random common English words separated by spaces."""
    return " ".join(rng.choice(WORDS) for _ in range(max(0, n_words)))


async def text_of_tokens(rng: random.Random, target_tokens: int, counter: TokenCounter, max_rounds: int = 6) -> str:
    """Random text of `target_tokens` tokens as `counter` counts them (exactly, or within a word or two, for
    an exact counter; within the ratio's accuracy otherwise). Every call draws fresh words from `rng`."""
    if target_tokens <= 0:
        return ""
    words = [rng.choice(WORDS) for _ in range(target_tokens)]
    tokens = await counter.count(" ".join(words))
    for _ in range(max_rounds):
        if tokens == target_tokens:
            break
        per_word = max(tokens / max(len(words), 1), 1e-3)
        delta = round((target_tokens - tokens) / per_word)
        if delta == 0:
            delta = 1 if tokens < target_tokens else -1
        if delta > 0:
            words.extend(rng.choice(WORDS) for _ in range(delta))
        else:
            del words[max(1, len(words) + delta) :]
        tokens = await counter.count(" ".join(words))
        if not counter.exact:
            break
    return " ".join(words)
