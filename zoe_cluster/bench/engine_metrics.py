"""The server's own view of a benchmark: prefix-cache counters from /metrics, read before and after.

The hit rate the engine saw over a window is (hits after - hits before) / (queries after - queries before),
in tokens, summed over every series of the counters. Names are the engine adapters' business
(`zoe_cluster.engines`, `parse_metrics`): vLLM V1 and zoe's simulated engine expose
`vllm:prefix_cache_hits_total` / `vllm:prefix_cache_queries_total`; SGLang `sglang:cached_tokens_total` /
`sglang:prompt_tokens_total`. The engine is recognised by the prefix of its metric names.

A router in front of several replicas exposes neither; then the hit rate is reported as unknown (None),
and the client-side `usage.prompt_tokens_details.cached_tokens` is what the workloads fall back on.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import aiohttp

from zoe_cluster.engines import get_adapter

_FAMILY = re.compile(r"^(?:# (?:HELP|TYPE) )?(vllm|sglang):", re.MULTILINE)


@dataclass(frozen=True)
class CacheCounters:
    """Cumulative prefix-cache counters (tokens) of one scrape; `engine` is None when none were found."""

    engine: str | None
    hits: float = 0.0
    queries: float = 0.0


def engine_of(text: str) -> str | None:
    """`vllm` or `sglang` by the names in a /metrics page, or None."""
    m = _FAMILY.search(text)
    return m.group(1) if m else None


def parse_cache_counters(text: str) -> CacheCounters:
    """The prefix-cache counters of whichever engine wrote `text` (see the module docstring)."""
    engine = engine_of(text)
    if engine is None:
        return CacheCounters(None)
    stats = get_adapter(engine).parse_metrics(text, time.time())
    return CacheCounters(engine, stats.prefix_cache_hits, stats.prefix_cache_queries)


def hit_rate_between(before: CacheCounters, after: CacheCounters) -> float | None:
    """Token hit rate over the window between two scrapes, or None if unknown (no counters, no queries)."""
    if before.engine is None or after.engine is None:
        return None
    queries = after.queries - before.queries
    if queries <= 0:
        return None
    return (after.hits - before.hits) / queries


async def scrape_cache_counters(session: aiohttp.ClientSession, base_url: str) -> CacheCounters:
    """GET {base_url}/metrics and parse it; a server without /metrics gives `CacheCounters(None)`."""
    try:
        async with session.get(base_url.rstrip("/") + "/metrics") as resp:
            if resp.status != 200:
                return CacheCounters(None)
            return parse_cache_counters(await resp.text())
    except (aiohttp.ClientError, ValueError):
        return CacheCounters(None)
