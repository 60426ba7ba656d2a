"""Reading a variant's measured profile at points the seed did not measure.

One implementation of profile interpolation, used by the planner and the recipe switcher (the simulated engine
fits a step-time model instead and is checked against these same tables). Interpolation is piecewise linear in
log-log space between measured points; outside the measured range the value is held at the nearest end (per
user for low concurrency), and the result says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoe_cluster.recipes.schema import Recipe


@dataclass(frozen=True)
class Predicted:
    value: float
    source: str
    """Where the number comes from: the table(s) of the points used, with 'interpolated'/'extrapolated'."""
    extrapolated: bool = False
    estimate: bool = False
    """True when any point used is itself an estimate (not measured)."""


def _loglog(xs: list[float], ys: list[float], x: float) -> tuple[float, bool]:
    """Piecewise-linear interpolation of log y over log x; held flat outside [xs[0], xs[-1]]."""
    if x <= xs[0]:
        return ys[0], x < xs[0]
    if x >= xs[-1]:
        return ys[-1], x > xs[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0))), False
    raise AssertionError("unreachable")


def decode_tok_s_per_node(recipe: Recipe, variant: str, concurrency: float, prompt: str = "apex") -> Predicted | None:
    """Node decode throughput at `concurrency`, from profile.decode; None when the variant has no such table.

    Below the lowest measured concurrency the per-user rate is held (throughput scales with concurrency);
    above the highest, the node throughput is held (a conservative plateau).
    """
    pts = sorted((p for p in recipe.variant(variant).profile.decode if p.prompt == prompt), key=lambda p: p.concurrency)
    if not pts:
        return None
    xs = [float(p.concurrency) for p in pts]
    ys = [p.tok_s_per_node.value for p in pts]
    sources = sorted({p.tok_s_per_node.source for p in pts})
    estimate = any(p.tok_s_per_node.estimate for p in pts)
    if concurrency < xs[0]:
        value = ys[0] / xs[0] * concurrency
        return Predicted(value, f"{'; '.join(sources)}, per-user rate held below c={xs[0]:g}", True, estimate)
    value, extrapolated = _loglog(xs, ys, concurrency)
    exact = concurrency in xs
    how = "" if exact else (", held above the highest measured concurrency" if extrapolated else ", interpolated")
    return Predicted(value, "; ".join(sources) + how, extrapolated, estimate)


def tok_s_per_user_at_context(recipe: Recipe, variant: str, context_tokens: float) -> Predicted | None:
    """Single-user decode tok/s at a context length, from profile.context_decode (DeepSeek-V4-Pro: seed table A3)."""
    pts = sorted(recipe.variant(variant).profile.context_decode, key=lambda p: p.context_tokens)
    if not pts:
        return None
    value, extrapolated = _loglog([float(p.context_tokens) for p in pts], [p.tok_s_per_user.value for p in pts],
                                  max(context_tokens, 1.0))
    sources = sorted({p.tok_s_per_user.source for p in pts})
    return Predicted(value, "; ".join(sources), extrapolated, any(p.tok_s_per_user.estimate for p in pts))


def ttft_s(recipe: Recipe, variant: str, input_tokens: float, hit_rate: float = 0.0) -> Predicted | None:
    """Single-request TTFT at (input length, hit rate): log-log in length, then linear between hit-rate rows."""
    pts = recipe.ttft_points(variant)
    if not pts:
        return None
    rates = sorted({p.hit_rate for p in pts})
    def at_rate(h: float) -> tuple[float, bool]:
        row = sorted((p for p in pts if p.hit_rate == h), key=lambda p: p.input_tokens)
        return _loglog([float(p.input_tokens) for p in row], [p.ttft_s.value for p in row], max(input_tokens, 1.0))
    h = min(max(hit_rate, rates[0]), rates[-1])
    lo = max(r for r in rates if r <= h)
    hi = min(r for r in rates if r >= h)
    (v_lo, e_lo), (v_hi, e_hi) = at_rate(lo), at_rate(hi)
    value = v_lo if hi == lo else v_lo + (v_hi - v_lo) * (h - lo) / (hi - lo)
    prof = recipe.variant(variant).profile
    src = sorted({p.ttft_s.source for p in pts})
    source = "; ".join(src) + (f" (table of variant {prof.ttft_from})" if prof.ttft_from else "")
    return Predicted(value, source, e_lo or e_hi or h != hit_rate, any(p.ttft_s.estimate for p in pts))


def kv_capacity_tokens(recipe: Recipe, variant: str) -> int:
    """Tokens of KV cache one replica holds: (HBM x utilization - weights) / KV bytes per token.

    Each data-parallel rank holds its own copy of the weights (TP4 x DP2 holds two).
    """
    v = recipe.variant(variant)
    weights_gb = v.weights.size_gb.value * v.parallelism.dp
    free_gb = v.gpu_memory_gb * v.parallelism.gpus * v.gpu_memory_utilization - weights_gb
    return max(0, int(free_gb * 1e9 / recipe.architecture.kv_bytes_per_token.value))
