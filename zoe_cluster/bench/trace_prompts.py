"""Prompt text for trace requests.

- Mooncake requests (with `hash_ids`): the simulated engine's documented tokenization turns the block ids
  into text (`zoe_cluster.sim.tokens`), so equal hash_ids give equal prefix blocks of text on any engine, and
  exactly the trace's token counts on the simulated engine. On a real engine the same text tokenizes to a
  different count; the report states the calibrated ratio and the measured `usage.prompt_tokens` total next to
  the trace's own total.
- Requests without prefix information (Azure): fresh random words, as many as the calibrated tokens-per-word
  ratio says make `input_len` tokens on the server.
"""

from __future__ import annotations

import random

from zoe_cluster.bench.prompts import WORDS, TokenCounter, synthetic_text
from zoe_cluster.bench.traces import TraceRequest


class TracePrompts:
    def __init__(self, tokens_per_word: float = 1.0, seed: int = 0):
        self.tokens_per_word = tokens_per_word
        self.seed = seed

    @classmethod
    async def calibrated(cls, counter: TokenCounter, seed: int = 0) -> TracePrompts:
        sample = synthetic_text(random.Random(seed), 2000)
        return cls(max(await counter.count(sample), 1) / 2000, seed)

    def describe(self) -> str:
        return f"{self.tokens_per_word:.3f} server tokens per synthetic word; prompt seed {self.seed}"

    def prompt_for(self, req: TraceRequest) -> str:
        if req.hash_ids:
            # A non-zero seed shifts every block id by the same amount: the same sharing structure, but text no
            # earlier replay against this server has put in its cache.
            salt = self.seed * 2**32
            return _mooncake_text(tuple(h + salt for h in req.hash_ids), req.input_len)
        rng = random.Random(f"{self.seed}/{req.index}")
        n_words = max(1, round(req.input_len / self.tokens_per_word))
        return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _mooncake_text(hash_ids: tuple[int, ...], input_len: int) -> str:
    from zoe_cluster.sim.tokens import hash_ids_to_text

    return hash_ids_to_text(hash_ids, input_len)
