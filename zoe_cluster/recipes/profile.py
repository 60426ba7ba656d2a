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


RESERVE_GB_PER_GPU = 12.0
"""HBM per GPU kept for activations, graphs and the sampler (an estimate; vLLM profiles it at start-up)."""

LATENT_KV_ATTENTION = ("dsa", "mla", "csa", "hybrid_linear_mla")
"""Attention kinds whose KV is one latent vector per token: every tensor-parallel rank keeps a full copy."""


@dataclass(frozen=True)
class KvCapacity:
    tokens: int
    free_hbm_gb: float
    kv_copies: int
    reserve_gb: float

    def explain(self) -> str:
        return (
            f"{self.tokens:,} tokens = {self.free_hbm_gb:.1f} GB free HBM / (kv bytes per token x {self.kv_copies} "
            f"copies); reserve {self.reserve_gb:.0f} GB"
        )


def kv_capacity(recipe: Recipe, variant: str, reserve_gb_per_gpu: float = RESERVE_GB_PER_GPU) -> KvCapacity:
    """KV-cache capacity of one replica of `variant`, tokens: the one formula the planner and the sim use.

    Per data-parallel rank (tp x pp GPUs, its own copy of the weights):
    free = gpu_memory_gb x gpus x gpu_memory_utilization - weights.size_gb - reserve x gpus; a latent-KV model
    (MLA, DSA, CSA) keeps the full per-token KV on every tensor-parallel rank, so it divides by tp as well.
    The replica holds dp times that.
    """
    v = recipe.variant(variant)
    par = v.parallelism
    gpus = par.tp * par.pp
    reserve = reserve_gb_per_gpu * gpus
    free_gb = v.gpu_memory_gb * gpus * v.gpu_memory_utilization - v.weights.size_gb.value - reserve
    copies = par.tp if recipe.architecture.attention in LATENT_KV_ATTENTION else 1
    if free_gb <= 0:
        raise ValueError(
            f"{recipe.name}/{variant}: no HBM left for KV ({v.gpu_memory_gb} GB x {gpus} GPUs x "
            f"{v.gpu_memory_utilization} - {v.weights.size_gb.value} GB weights - {reserve:.0f} GB reserve)"
        )
    tokens = par.dp * int(free_gb * 1e9 / (recipe.architecture.kv_bytes_per_token.value * copies))
    return KvCapacity(tokens=tokens, free_hbm_gb=free_gb * par.dp, kv_copies=copies, reserve_gb=reserve * par.dp)


def host_kv_tokens(recipe: Recipe, variant: str, host_kv_gb: float) -> int:
    """Tokens a host-memory KV tier of `host_kv_gb` GB per replica holds (vLLM's `--kv-offloading-size`,
    SGLang's HiCache): every rank offloads its own KV, so a latent-KV model stores tp copies per token, as in HBM.
    The router sizes its prefix index to it and the simulated engine models it (`sim.kv_cache.host_kv_tier`)."""
    if host_kv_gb <= 0:
        return 0
    copies = recipe.variant(variant).parallelism.tp if recipe.architecture.attention in LATENT_KV_ATTENTION else 1
    return int(host_kv_gb * 1e9 / (recipe.architecture.kv_bytes_per_token.value * copies))


def kv_capacity_tokens(recipe: Recipe, variant: str) -> int:
    """`kv_capacity(...).tokens`, or 0 when the weights leave no room."""
    try:
        return kv_capacity(recipe, variant).tokens
    except ValueError:
        return 0
