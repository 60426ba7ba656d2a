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

from zoe_cluster.recipes import Recipe
from zoe_cluster.replica_state import TRANSITIONING, ReplicaState
from zoe_cluster.switching.mix import decide_mix
from zoe_cluster.switching.predict import candidate_variants, load_s, replica_tok_s
from zoe_cluster.switching.vocabulary import ReplicaObservation, SwitchConfig, SwitchDecision

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
        return decide_mix(recipe, replicas, config, now, demand, prefill_tok_s)
    in_flight = sum(1 for r in replicas if ReplicaState(r.state) in TRANSITIONING)
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
        cost = current * (config.drain_s + load_s(recipe, best, config))
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
