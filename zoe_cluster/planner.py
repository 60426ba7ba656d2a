"""The planner: model + expected demand + nodes available -> the variant and replica count to serve with.

A pure function of the recipe, the demand and the kernel support table. It drops variants whose zoe kernels
cannot activate on their engine image (`zoe_cluster.kernel_support`: the release the image tag names against the
releases the plugin was verified on), predicts each variant's decode throughput at the per-replica
concurrency by interpolating the measured profile (zoe_cluster.recipes.profile), checks that weights plus the
KV cache for the demanded contexts fit in the replica's HBM, drops variants not meant for the context length,
and picks the highest predicted node throughput. The explanation shows the numbers and their sources.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from zoe_cluster.kernel_support import KernelSupport
from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.profile import (
    decode_tok_s_per_node,
    kv_capacity_tokens,
    tok_s_per_user_at_context,
    ttft_s,
)


@dataclass(frozen=True)
class Demand:
    concurrency: int
    """Concurrent requests expected across the deployment."""
    context_tokens: int = 8192
    """Typical context length (prompt + output) of a request, tokens."""
    nodes: int = 1
    """Nodes available to the deployment."""
    speculative: bool = False
    """Consider speculative-decoding variants; their throughput depends on the prompt's acceptance rate."""
    prompt: str = "apex"
    """Which measured prompt's decode table to read where a profile has several (seed table A6)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.context_tokens < 1:
            raise ValueError(f"context_tokens must be >= 1, got {self.context_tokens}")
        if self.nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {self.nodes}")


@dataclass(frozen=True)
class Candidate:
    variant: str
    eligible: bool
    why: str
    replicas: int = 0
    concurrency_per_replica: float = 0.0
    decode_tok_s_per_node: float | None = None
    decode_tok_s_per_user: float | None = None
    ttft_s: float | None = None
    kv_capacity_tokens: int = 0
    source: str = ""
    kernels_blocked: bool = False
    """Not ranked because its zoe kernels cannot activate on its engine image (`why` says which and why)."""


@dataclass(frozen=True)
class Plan:
    model: str
    variant: str
    engine: str
    quantization: str
    tp: int
    dp: int
    pp: int
    ep: int
    nodes_per_replica: int
    replicas: int
    kernels: list[str]
    speculative: str | None
    concurrency_per_replica: float
    predicted_decode_tok_s_per_node: float | None
    predicted_decode_tok_s_per_user: float | None
    predicted_ttft_s: float | None
    kv_capacity_tokens: int
    reason: str
    alternatives: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class NoFeasibleVariant(ValueError):
    def __init__(self, model: str, candidates: list[Candidate]):
        self.candidates = candidates
        lines = [f"no variant of {model} fits the demand:"] + [f"  {c.variant}: {c.why}" for c in candidates]
        super().__init__("\n".join(lines))


def _evaluate(
    recipe: Recipe, name: str, demand: Demand, allow_speculative: bool, support: KernelSupport
) -> Candidate:
    v = recipe.variant(name)
    if v.speculative and not allow_speculative:
        return Candidate(name, False, f"speculative ({v.speculative.method}): its rate depends on the prompt's "
                                      "acceptance; --speculative includes it")
    blocked = support.blockers(list(v.kernels), v.engine, v.image)
    if blocked:  # its profile measured zoe's kernels, which this image would not run
        return Candidate(name, False, blocked, kernels_blocked=True)
    if v.parallelism.nodes > demand.nodes:
        return Candidate(name, False, f"needs {v.parallelism.nodes} nodes per replica, {demand.nodes} available")
    lo, hi = v.intended.context_tokens
    if not lo <= demand.context_tokens <= hi:
        return Candidate(name, False, f"meant for contexts of {lo:,}-{hi:,} tokens, not {demand.context_tokens:,}")
    if demand.context_tokens > recipe.architecture.max_context_tokens:
        return Candidate(name, False, f"the model serves at most {recipe.architecture.max_context_tokens:,} tokens")
    replicas = demand.nodes // v.parallelism.nodes
    per_replica = demand.concurrency / replicas
    capacity = kv_capacity_tokens(recipe, name)
    need = int(per_replica * demand.context_tokens)
    if need > capacity:
        return Candidate(name, False, f"KV for {per_replica:g} x {demand.context_tokens:,} tokens = {need:,} tokens "
                                      f"exceeds the replica's KV capacity of {capacity:,} tokens", replicas, per_replica,
                         kv_capacity_tokens=capacity)
    ttft = ttft_s(recipe, name, demand.context_tokens, 0.0)
    dec = decode_tok_s_per_node(recipe, name, per_replica, demand.prompt)
    if dec is not None:
        # One replica spans `nodes` nodes; a node's share of its throughput is what the tables report per node.
        per_node = dec.value
        per_user = dec.value / per_replica * v.parallelism.nodes
        source = dec.source + (" (not measured: estimate)" if dec.estimate and dec.source != "estimate" else "")
    else:
        ctx_dec = tok_s_per_user_at_context(recipe, name, demand.context_tokens)
        if ctx_dec is None:
            return Candidate(name, False, "its profile has no decode measurements")
        per_user = ctx_dec.value
        per_node = ctx_dec.value * min(per_replica, 1.0)
        source = ctx_dec.source + " (single-user decode by context)"
    return Candidate(name, True, "eligible", replicas, per_replica, per_node, per_user,
                     ttft.value if ttft else None, capacity, source)


def plan(recipe: Recipe, demand: Demand, support: KernelSupport | None = None) -> Plan:
    """Choose the variant with the highest predicted decode tok/s per node among those that fit the demand and
    whose kernels can activate on their image (`support`: the packaged table when None)."""
    support = support if support is not None else KernelSupport.load()
    # Speculative variants are compared only when asked for, or when the model has no other kind (Kimi-K3).
    allow_spec = demand.speculative or all(v.speculative for v in recipe.variants.values())
    candidates = [_evaluate(recipe, name, demand, allow_spec, support) for name in recipe.variants]
    eligible = sorted((c for c in candidates if c.eligible), key=lambda c: -(c.decode_tok_s_per_node or 0.0))
    if not eligible:
        raise NoFeasibleVariant(recipe.name, candidates)
    best = eligible[0]
    v = recipe.variant(best.variant)
    lines = [f"{best.variant} predicts {best.decode_tok_s_per_node:.1f} tok/s per node "
             f"({best.decode_tok_s_per_user:.1f} per user) at {best.concurrency_per_replica:g} concurrent requests per "
             f"replica ({best.source})"]
    if len(eligible) > 1:
        runner = eligible[1]
        gain = best.decode_tok_s_per_node / runner.decode_tok_s_per_node - 1.0
        lines.append(f"next best: {runner.variant} at {runner.decode_tok_s_per_node:.1f} tok/s per node "
                     f"({runner.source}); {best.variant} is {gain:+.1%} faster")
    lines.append(f"{best.replicas} replica(s) of {v.parallelism.gpus} GPUs ({v.parallelism.nodes} node(s) each); "
                 f"KV capacity {best.kv_capacity_tokens:,} tokens per replica")
    if best.ttft_s is not None:
        lines.append(f"predicted single-request TTFT at {demand.context_tokens:,} tokens, no prefix hit: {best.ttft_s:.2f} s")
    lines += [f"not ranked: {c.variant}: {c.why}" for c in candidates if c.kernels_blocked]
    return Plan(
        model=recipe.name, variant=best.variant, engine=v.engine, quantization=v.weights.quantization,
        tp=v.parallelism.tp, dp=v.parallelism.dp, pp=v.parallelism.pp, ep=v.parallelism.ep,
        nodes_per_replica=v.parallelism.nodes, replicas=best.replicas, kernels=list(v.kernels),
        speculative=v.speculative.method if v.speculative else None,
        concurrency_per_replica=best.concurrency_per_replica,
        predicted_decode_tok_s_per_node=best.decode_tok_s_per_node,
        predicted_decode_tok_s_per_user=best.decode_tok_s_per_user,
        predicted_ttft_s=best.ttft_s, kv_capacity_tokens=best.kv_capacity_tokens,
        reason="; ".join(lines), alternatives=[c for c in candidates if c.variant != best.variant],
    )
