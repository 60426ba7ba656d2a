"""What the recipe's measured profiles predict for one replica: decode throughput, per-user ITL, prefill cost,
weights load time, and which variants a replica may switch among.

Pure functions of (recipe, variant, load); `decide`, `mix` and `classes` all predict through them.
"""

from __future__ import annotations

from collections.abc import Collection

from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.profile import decode_tok_s_per_node
from zoe_cluster.switching.vocabulary import SwitchConfig

__all__ = ["candidate_variants", "load_s", "predicted_itl_s", "prefill_s_per_token", "replica_tok_s"]


def candidate_variants(recipe: Recipe, current: str, config: SwitchConfig,
                       blocked: Collection[str] = ()) -> list[str]:
    """The variants a replica running `current` may switch among: `config.candidates` as named, else every
    non-speculative variant of its engine with a decode-by-concurrency profile, less those in `blocked` (the
    caller's list of variants whose kernels cannot activate on their image: `KernelSupport.blocked_variants`)."""
    engine = recipe.variant(current).engine
    names = config.candidates or [
        n for n, v in recipe.variants.items()
        if v.engine == engine and not v.speculative and v.profile.decode and n not in blocked
    ]
    for n in names:
        recipe.variant(n)  # unknown names raise with the list of known ones
    return names


def replica_tok_s(recipe: Recipe, variant: str, concurrency: float) -> float:
    """Decode tok/s of one replica of `variant` at `concurrency` (tables are per node; a replica spans nodes)."""
    pred = decode_tok_s_per_node(recipe, variant, max(concurrency, 1e-6))
    if pred is None:
        return 0.0
    return pred.value * recipe.variant(variant).parallelism.nodes


def load_s(recipe: Recipe, variant: str, config: SwitchConfig) -> float:
    """Seconds a replica of `variant` takes to load its weights (the profile's, else 600 s), times the sim's time
    scale."""
    load = recipe.variant(variant).profile.weights_load_s
    return (load.value if load else 600.0) * config.load_time_scale


def predicted_itl_s(recipe: Recipe, variant: str, concurrency: float) -> float:
    """Per-user time per output token on one replica of `variant` holding `concurrency` requests (profile)."""
    tok_s = replica_tok_s(recipe, variant, concurrency)
    return concurrency / tok_s if tok_s > 0 else float("inf")


def prefill_s_per_token(recipe: Recipe, variant: str) -> float:
    """Marginal seconds per uncached prompt token on one replica: the slope of the variant's TTFT table (hit rate
    0) between its two shortest inputs (seed table A5 for GLM-5.3: 8K -> 16K, about 48 us/token), the part where
    attention's quadratic cost is still small, as for chat prompts; 0 without a table.

    Chunked prefill shares the replica's steps with decode, so a replica that spends a fraction f of its time on
    prefill stretches every decoding request's ITL by 1 / (1 - f) (`switching.mix.predict`)."""
    pts = sorted((p for p in recipe.ttft_points(variant) if p.hit_rate == 0), key=lambda p: p.input_tokens)
    if len(pts) < 2:
        return 0.0
    lo, hi = pts[0], pts[1]
    return max(0.0, (hi.ttft_s.value - lo.ttft_s.value) / (hi.input_tokens - lo.input_tokens))
