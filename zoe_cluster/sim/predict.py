"""Predictions from the simulated engine on the virtual clock: the benchmarks of the seed, re-run in simulation.

`predict_ttft` is the seed's prefill benchmark (one request alone, OSL 1, a fixed prefix already cached to set
the hit rate; seed table A5); `predict_decode` its decode benchmark (C requests at once, short prompt, OSL
tokens, TTFT excluded; seed tables A7/A8). Both drive the same `EngineCore` the server and replay use.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoe_cluster.recipes import Recipe
from zoe_cluster.sim.calibrate import Calibration, cached_tokens_for, calibrate
from zoe_cluster.sim.core import EngineCore, SimRequest
from zoe_cluster.sim.kv_cache import PrefixCache, kv_capacity

DEFAULT_BLOCK_TOKENS = 16
"""KV block size of the simulated engine, tokens (vLLM's default on GPUs)."""

APEX_PROMPT_TOKENS = 90
"""Prompt length of the seed's decode benchmark (the Apex prompt is about 90 tokens)."""


def build_engine(
    recipe: Recipe,
    variant: str,
    calibration: Calibration | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    kv_tokens: int | None = None,
) -> EngineCore:
    """An engine core for one replica of `variant`: fitted step model, KV cache sized from the recipe."""
    v = recipe.variant(variant)
    cal = calibration or calibrate(recipe, variant, block_tokens=block_tokens)
    tokens = kv_tokens if kv_tokens is not None else kv_capacity(recipe, variant).tokens
    cache = PrefixCache(max(1, tokens // block_tokens), block_tokens)
    return EngineCore.for_variant(cal.model, cache, v)


def _run(core: EngineCore, now: float = 0.0) -> float:
    while True:
        step = core.schedule(now)
        if step is None:
            return now
        now += step.duration_s
        core.complete(step, now)


def _hashes(tag: int, n: int) -> tuple[int, ...]:
    return tuple((tag << 32) | i for i in range(n))


@dataclass(frozen=True)
class TtftPrediction:
    ttft_s: float
    input_tokens: int
    hit_rate: float
    cached_tokens: int


def predict_ttft(
    recipe: Recipe, variant: str, input_tokens: int, hit_rate: float, calibration: Calibration | None = None
) -> TtftPrediction:
    """TTFT of one request alone whose first `hit_rate` share of the prompt is already cached."""
    if input_tokens <= 0:
        raise ValueError(f"input_tokens must be positive, got {input_tokens}")
    if not 0.0 <= hit_rate < 1.0:
        raise ValueError(f"hit_rate must be in [0, 1), got {hit_rate}")
    core = build_engine(recipe, variant, calibration)
    bs = core.cache.block_tokens
    cached = cached_tokens_for(input_tokens, hit_rate, bs)
    prefix = _hashes(1, cached // bs)
    if cached:  # warm-up request that leaves the shared prefix in the cache
        warm = SimRequest("warm", cached + bs, 1, prefix + _hashes(2, 1))
        core.add(warm)
        _run(core)
    req = SimRequest("probe", input_tokens, 1, prefix + _hashes(3, input_tokens // bs), arrival_s=0.0)
    core.add(req)
    _run(core, 0.0)
    assert req.first_token_s is not None
    return TtftPrediction(req.first_token_s + core.model.frontend_s, input_tokens, hit_rate, req.cached_tokens)


@dataclass(frozen=True)
class DecodePrediction:
    concurrency: int
    output_tokens: int
    decode_tok_s_per_node: float
    decode_tok_s_per_user: float
    ttft_s_mean: float
    preemptions: int


def predict_decode(
    recipe: Recipe,
    variant: str,
    concurrency: int,
    output_tokens: int,
    input_tokens: int = APEX_PROMPT_TOKENS,
    calibration: Calibration | None = None,
) -> DecodePrediction:
    """Decode throughput of `concurrency` requests started together (TTFT excluded, as the seed reports)."""
    if concurrency <= 0 or output_tokens <= 1 or input_tokens <= 0:
        raise ValueError("concurrency must be > 0, output_tokens > 1 and input_tokens > 0")
    core = build_engine(recipe, variant, calibration)
    bs = core.cache.block_tokens
    reqs = [SimRequest(f"r{i}", input_tokens, output_tokens, _hashes(10 + i, input_tokens // bs)) for i in range(concurrency)]
    for r in reqs:
        core.add(r)
    _run(core)
    per_user = [(output_tokens - 1) / (r.finish_s - r.first_token_s) for r in reqs]  # type: ignore[operator]
    ttft = [r.first_token_s + core.model.frontend_s for r in reqs]  # type: ignore[operator]
    return DecodePrediction(
        concurrency=concurrency,
        output_tokens=output_tokens,
        decode_tok_s_per_node=sum(per_user),
        decode_tok_s_per_user=sum(per_user) / len(per_user),
        ttft_s_mean=sum(ttft) / len(ttft),
        preemptions=core.counters.preemptions,
    )
