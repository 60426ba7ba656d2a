"""Prefill workload: single-request TTFT by input length at controlled prefix-cache hit rates (seed Fig. 13/14).

For each (input length L, hit rate h) cell: a fixed prefix of round(h * L) tokens is drawn once; every request
is that prefix followed by a fresh random suffix of the remaining tokens, sent alone with `max_tokens=1`.
The warmup request(s) put the prefix in the cache; the measured runs then hit it. /metrics is read before
and after the measured runs of each cell, so the report shows the hit rate the engine actually saw next to
the target (engines cache whole blocks, so the measured rate is the target rounded down to a block).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from zoe_cluster.bench.client import Api, RequestResult, RequestSpec, StreamingClient
from zoe_cluster.bench.engine_metrics import hit_rate_between, scrape_cache_counters
from zoe_cluster.bench.prompts import TokenCounter, text_of_tokens
from zoe_cluster.bench.stats import summarize


@dataclass(frozen=True)
class PrefillConfig:
    lengths: list[int]
    """Input lengths, tokens."""
    hit_rates: list[float]
    """Target prefix-cache hit rates in [0, 1)."""
    runs: int = 10
    warmup: int = 1
    seed: int = 0
    api: Api = "completions"

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError("runs must be at least 1")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")
        if self.warmup == 0 and any(h > 0 for h in self.hit_rates):
            raise ValueError("a hit rate above 0 needs at least one warmup request to put the prefix in the cache")

    @property
    def total_requests(self) -> int:
        return len(self.lengths) * len(self.hit_rates) * (self.runs + self.warmup)


def _cached_fraction(results: list[RequestResult]) -> float | None:
    pairs = [(r.cached_tokens, r.prompt_tokens) for r in results if r.ok and r.cached_tokens is not None]
    total = sum(p or 0 for _, p in pairs)
    return sum(c for c, _ in pairs) / total if pairs and total else None


async def run_prefill(
    client: StreamingClient,
    counter: TokenCounter,
    config: PrefillConfig,
    on_request: Callable[[str], None] | None = None,
) -> list[dict]:
    """Run every cell of the sweep; returns one row per (length, hit rate). `on_request(tag)` is called after
    each request (warmups included), for progress bars."""
    rows = []
    for length in config.lengths:
        for hit_rate in config.hit_rates:
            tag = f"L={length} h={hit_rate:g}"
            rng = random.Random(f"{config.seed}/{length}/{hit_rate}")
            prefix_tokens = round(hit_rate * length)
            prefix = await text_of_tokens(rng, prefix_tokens, counter) if prefix_tokens else ""

            async def one() -> RequestResult:
                suffix = await text_of_tokens(rng, length - prefix_tokens, counter)
                prompt = f"{prefix} {suffix}" if prefix else suffix
                spec = RequestSpec(prompt=prompt, max_tokens=1, api=config.api, ignore_eos=False, tag=tag)
                result = await client.send(spec)
                if on_request:
                    on_request(tag)
                return result

            for _ in range(config.warmup):
                await one()
            before = await scrape_cache_counters(client.session, client.base_url)
            results = [await one() for _ in range(config.runs)]
            after = await scrape_cache_counters(client.session, client.base_url)
            good = [r for r in results if r.ok]
            errors = [r.error for r in results if not r.ok]
            prompt_tokens = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
            rows.append(
                {
                    "input_len": length,
                    "hit_rate_target": hit_rate,
                    "prefix_tokens": prefix_tokens,
                    "runs": config.runs,
                    "completed": len(good),
                    "errors": len(errors),
                    "error_samples": errors[:3],
                    "ttft_s": summarize([r.ttft_s for r in good]),
                    "e2e_s": summarize([r.e2e_s for r in good]),
                    "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
                    "engine_hit_rate": hit_rate_between(before, after),
                    "client_cached_fraction": _cached_fraction(good),
                }
            )
    return rows
