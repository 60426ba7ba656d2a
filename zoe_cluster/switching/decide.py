"""Recipe switching by concurrency: a pure decision function.

Inputs: what each replica runs and the concurrency it saw over a sliding window (the router's counts), the
recipe's measured profiles, the switching config, and the time. Output: one `SwitchDecision` per replica, swap
(to a named variant) or hold, each with its reason. The live controller's actuator and the virtual-clock replay
both call `decide`; neither has a second copy of this logic.

The rule, per replica i with observed concurrency c_i:
  best_i   = argmax_v  T_v(c_i)              T = predicted decode tok/s of one replica (seed-table interpolation)
  gain_i   = (T_best(c_i) - T_cur(c_i)) * horizon_s
  cost_i   = T_cur(c_i) * (drain_s + load_s(best_i))     tokens not served while the replica is away
  swap iff gain_i > cost_i, T_best / T_cur - 1 >= hysteresis, the replica's last swap is older than dwell_s,
           fewer than max_concurrent_swaps swaps are in flight, and the replicas still ready stay >= min_ready.
Replicas whose own load differs (e.g. a long-context pool, or session-sticky traffic) get different variants:
that is how mixed fleets arise, and the router knows each replica's variant from membership.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.profile import decode_tok_s_per_node

ReplicaState = Literal["pending", "starting", "loading", "ready", "draining", "stopped", "failed"]
IN_FLIGHT_STATES = frozenset({"pending", "starting", "loading", "draining"})


class ServiceClass(BaseModel):
    """One service class and its objective (a request meets it when TTFT <= ttft_s and ITL <= itl_s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Class name, as requests send it (`x-zoe-slo` header).")
    ttft_s: float = Field(gt=0, description="Time-to-first-token objective, seconds.")
    itl_s: float = Field(gt=0, description="Inter-token latency objective (time per output token), seconds.")


class SwitchConfig(BaseModel):
    """Switching settings of a deployment (validated; part of the deployment spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Let the controller swap variants by itself.")
    candidates: list[str] = Field(
        default_factory=list,
        description="Variants the switcher may choose among; empty = every non-speculative variant of the "
        "replica's engine with a decode-by-concurrency profile.",
    )
    window_s: float = Field(default=300.0, gt=0, description="Sliding window of the concurrency estimate, seconds.")
    interval_s: float = Field(default=30.0, gt=0, description="How often the actuator evaluates, seconds.")
    dwell_s: float = Field(default=1800.0, ge=0, description="Least time between two swaps of one replica, s.")
    horizon_s: float = Field(default=7200.0, gt=0, description="Time over which a swap's gain is counted, s.")
    hysteresis: float = Field(default=0.02, ge=0, description="Least relative throughput gain that justifies a swap.")
    drain_s: float = Field(default=60.0, ge=0, description="Expected drain time of a replica before it stops, s.")
    min_ready_fraction: float = Field(default=0.5, ge=0, le=1, description="Never fewer replicas ready than this.")
    max_concurrent_swaps: int = Field(default=1, ge=1, description="Swaps in flight at once (rolling budget).")
    load_time_scale: float = Field(
        default=1.0, gt=0, description="Multiplier on the profile's weights load time (the sim's time scale)."
    )

    classes: list[ServiceClass] = Field(
        default_factory=list,
        description="Service classes with their objectives, tightest first; when set and the driver reports "
        "in-flight requests per class, the switcher targets a mix of variants (`switching.mix`).",
    )
    slo_headroom: float = Field(
        default=0.95, gt=0, le=1,
        description="The router's per-class limits keep a replica's predicted ITL at most this share of the "
        "class's objective (margin for prefill interference and load swings).",
    )

    @model_validator(mode="after")
    def _horizon_covers_dwell(self) -> "SwitchConfig":
        if self.horizon_s < self.interval_s:
            raise ValueError("horizon_s must be at least interval_s")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: duplicate names in {names}")
        if self.classes and not 2 <= len(self.candidates) <= 4:
            raise ValueError("classes: name 2 to 4 candidates (the mix search covers every split of the replicas "
                             "over them)")
        return self


@dataclass(frozen=True)
class ReplicaObservation:
    index: int
    variant: str
    state: ReplicaState
    concurrency: float
    """Mean concurrent requests on this replica over the window (router's counts)."""
    last_swap_at: float | None = None
    """When this replica last finished a swap (None: never swapped)."""


@dataclass(frozen=True)
class SwitchDecision:
    replica: int
    action: Literal["swap", "hold"]
    variant: str
    """Target variant for a swap; the current variant for a hold."""
    reason: str
    predicted_tok_s_current: float = 0.0
    predicted_tok_s_target: float = 0.0
    gain_tokens: float = 0.0
    cost_tokens: float = 0.0


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


def _load_s(recipe: Recipe, variant: str, config: SwitchConfig) -> float:
    load = recipe.variant(variant).profile.weights_load_s
    return (load.value if load else 600.0) * config.load_time_scale


def decide(recipe: Recipe, replicas: list[ReplicaObservation], config: SwitchConfig, now: float,
           demand: dict[str, float] | None = None,
           prefill_tok_s: dict[str, float] | None = None) -> list[SwitchDecision]:
    """One decision per replica, in replica order. Pure: same inputs, same decisions.

    `demand` is the fleet's mean in-flight requests per service class over the window (and `prefill_tok_s` its
    uncached prompt tokens/s per class); with it and `config.classes`, the fleet is steered toward the best mix
    of variants (`switching.mix.decide_mix`), else each replica is decided on its own concurrency (the rule in
    the module docstring)."""
    if not config.enabled:
        return [SwitchDecision(r.index, "hold", r.variant, "switching disabled") for r in replicas]
    if config.classes and demand is not None:
        from zoe_cluster.switching.mix import decide_mix  # mix builds on this module's helpers

        return decide_mix(recipe, replicas, config, now, demand, prefill_tok_s)
    in_flight = sum(1 for r in replicas if r.state in IN_FLIGHT_STATES)
    ready = sum(1 for r in replicas if r.state == "ready")
    min_ready = math.ceil(config.min_ready_fraction * len(replicas))
    out: list[SwitchDecision] = []
    for r in sorted(replicas, key=lambda r: r.index):
        hold = lambda why, **kw: SwitchDecision(r.index, "hold", r.variant, why, **kw)  # noqa: E731
        if r.state != "ready":
            out.append(hold(f"replica is {r.state}"))
            continue
        names = candidate_variants(recipe, r.variant, config)
        current = replica_tok_s(recipe, r.variant, r.concurrency)
        best = max(names, key=lambda n: (replica_tok_s(recipe, n, r.concurrency), n == r.variant))
        target = replica_tok_s(recipe, best, r.concurrency)
        nums = dict(predicted_tok_s_current=current, predicted_tok_s_target=target)
        if best == r.variant:
            out.append(hold(f"{r.variant} is already the fastest at concurrency {r.concurrency:.1f} "
                            f"({current:.1f} tok/s)", **nums))
            continue
        rel = target / current - 1.0 if current > 0 else math.inf
        gain = (target - current) * config.horizon_s
        cost = current * (config.drain_s + _load_s(recipe, best, config))
        nums.update(gain_tokens=gain, cost_tokens=cost)
        what = (f"{best} {target:.1f} vs {r.variant} {current:.1f} tok/s at concurrency {r.concurrency:.1f} "
                f"({rel:+.1%})")
        if rel < config.hysteresis:
            out.append(hold(f"{what}: below the {config.hysteresis:.0%} hysteresis", **nums))
        elif gain <= cost:
            out.append(hold(f"{what}: gain {gain:,.0f} tokens over {config.horizon_s:.0f} s does not repay the "
                            f"swap's {cost:,.0f} tokens", **nums))
        elif r.last_swap_at is not None and now - r.last_swap_at < config.dwell_s:
            out.append(hold(f"{what}: last swap {now - r.last_swap_at:.0f} s ago, dwell is {config.dwell_s:.0f} s",
                            **nums))
        elif in_flight >= config.max_concurrent_swaps:
            out.append(hold(f"{what}: {in_flight} swap(s) in flight, budget {config.max_concurrent_swaps}", **nums))
        elif ready - 1 < min_ready:
            out.append(hold(f"{what}: would leave {ready - 1} ready replicas, minimum {min_ready}", **nums))
        else:
            out.append(SwitchDecision(r.index, "swap", best, f"{what}: gain {gain:,.0f} tokens > cost {cost:,.0f}",
                                      **nums))
            in_flight += 1
            ready -= 1
    return out
