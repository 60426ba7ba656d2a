"""Mixed fleets: which variant each replica should run, from the in-flight requests of each service class.

`decide` calls `decide_mix` when the switching config names service classes and the driver reports the fleet's
in-flight requests per class. It predicts, for every mix (how many replicas on each candidate variant), the
tokens per second delivered within each class's objective, with the same rule the router's `slo` policy
applies (`zoe_cluster.routing.slo`, limits from `switching.classes.class_limits`):

  place    classes tightest first: a class fills the replicas of its preferred variants in order, each up to its
           limit and to the limits of the classes already there; what is left spills onto replicas that serve
           no other class, else onto all (spread evenly)
  predict  a replica of variant v holding l requests gives each of them 1 / ITL tok/s, ITL = ITL_v(l) / (1 - f):
           ITL_v(l) = l / T_v(l) from the decode profile (seed table A8 via `replica_tok_s`), and f the share of the
           replica's time that chunked prefill takes (the classes' uncached prompt tokens/s it receives, in
           proportion to its share of each class, times `prefill_s_per_token`, seed table A5); a class's requests
           there count as good when ITL <= its objective (the router's limits keep `slo_headroom` of margin
           below it, which such interference uses up)
  good(m)  sum over replicas and classes of the good tok/s

The target mix is the best good(m) (ties: fewer swaps from the current mix, then more tok/s). The fleet moves
toward it one replica at a time under the single-replica rules: the relative gain must pass `hysteresis`, the
gain over `horizon_s` must exceed the good tokens lost while the replica drains and reloads, the replica's last
swap must be older than `dwell_s`, and at least `min_ready_fraction` of the replicas stay ready. While any swap
is in flight the fleet holds (the mix is re-evaluated once it lands). TTFT is not predicted here (the profile
has no queueing model); the objectives' ITL part decides the mix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from zoe_cluster.recipes import Recipe
from zoe_cluster.switching.classes import class_limits, predicted_itl_s, prefill_s_per_token
from zoe_cluster.switching.decide import (
    IN_FLIGHT_STATES,
    ReplicaObservation,
    SwitchConfig,
    SwitchDecision,
    _load_s,
    candidate_variants,
    replica_tok_s,
)


def place(variants: Sequence[str], demand: dict[str, float], limits: dict[str, dict[str, int]],
          order: Sequence[str]) -> list[dict[str, float]]:
    """Requests per class on each replica (fractional) when the `slo` router spreads `demand` over `variants`."""
    load: list[dict[str, float]] = [{} for _ in variants]

    def total(i: int) -> float:
        return sum(load[i].values())

    def guard(i: int) -> float:
        """Room under the limits of the classes replica i already serves (inf when it serves none with one)."""
        room = math.inf
        for c, x in load[i].items():
            lim = limits.get(c, {}).get(variants[i])
            if x > 0 and lim is not None:
                room = min(room, lim - total(i))
        return max(0.0, room)

    for cls in order:
        left = demand.get(cls, 0.0)
        for v, lim in limits.get(cls, {}).items():
            idx = [i for i, x in enumerate(variants) if x == v]
            rooms = [max(0.0, min(lim - total(i), guard(i))) for i in idx]
            room = sum(rooms)
            put = min(left, room)
            if put > 0:
                for i, r in zip(idx, rooms):
                    load[i][cls] = load[i].get(cls, 0.0) + put * r / room
                left -= put
        if left > 1e-9:
            free = [i for i in range(len(variants)) if guard(i) == math.inf] or list(range(len(variants)))
            for i in free:
                load[i][cls] = load[i].get(cls, 0.0) + left / len(free)
    return load


MAX_PREFILL_SHARE = 0.9
"""Cap on the predicted prefill share of a replica's time (beyond it the replica is simply overloaded)."""


def predict(recipe: Recipe, variants: Sequence[str], demand: dict[str, float], config: SwitchConfig,
            limits: dict[str, dict[str, int]], prefill_tok_s: dict[str, float] | None = None) -> tuple[float, float]:
    """(good tok/s, tok/s) of a fleet running `variants` under `demand` (in-flight requests per class) and
    `prefill_tok_s` (uncached prompt tokens/s per class; None: prefill ignored); see the module docstring."""
    objectives = {c.name: c.itl_s for c in config.classes}
    good = total = 0.0
    order = [c.name for c in sorted(config.classes, key=lambda c: c.itl_s)]
    for v, load in zip(variants, place(variants, demand, limits, order)):
        n = sum(load.values())
        if n <= 0:
            continue
        busy = sum(x / demand[c] * prefill_tok_s.get(c, 0.0) for c, x in load.items()
                   if demand.get(c, 0) > 0) * prefill_s_per_token(recipe, v) if prefill_tok_s else 0.0
        itl = predicted_itl_s(recipe, v, n) / (1.0 - min(busy, MAX_PREFILL_SHARE))
        total += n / itl
        good += sum(x / itl for c, x in load.items() if itl <= objectives.get(c, math.inf))
    return good, total


def mixes(candidates: Sequence[str], n: int) -> list[dict[str, int]]:
    """Every way to put `n` replicas on `candidates` (counts per variant)."""
    out = []
    for cut in itertools.combinations_with_replacement(range(len(candidates)), n):
        out.append({v: cut.count(k) for k, v in enumerate(candidates)})
    return out


def _fleet(mix: dict[str, int]) -> list[str]:
    return [v for v, k in mix.items() for _ in range(k)]


def best_mix(recipe: Recipe, candidates: Sequence[str], n: int, demand: dict[str, float], config: SwitchConfig,
             current: dict[str, int] | None = None,
             prefill_tok_s: dict[str, float] | None = None) -> tuple[dict[str, int], float, float]:
    """(mix, good tok/s, tok/s) of the best mix of `n` replicas for `demand`."""
    limits = class_limits(recipe, list(config.classes), list(candidates), config.slo_headroom)
    current = current or {}
    best = None
    for m in mixes(candidates, n):
        good, tok_s = predict(recipe, _fleet(m), demand, config, limits, prefill_tok_s)
        moves = sum(max(0, m[v] - current.get(v, 0)) for v in m)
        key = (round(good, 6), -moves, tok_s)
        if best is None or key > best[0]:
            best = (key, m, good, tok_s)
    assert best is not None
    return best[1], best[2], best[3]


def _describe(mix: dict[str, int]) -> str:
    return " + ".join(f"{k} {v}" for v, k in mix.items() if k) or "none"


def decide_mix(recipe: Recipe, replicas: list[ReplicaObservation], config: SwitchConfig, now: float,
               demand: dict[str, float], prefill_tok_s: dict[str, float] | None = None) -> list[SwitchDecision]:
    """One decision per replica, in replica order: at most one swap, toward the best mix for `demand` (in-flight
    requests per class) and `prefill_tok_s` (uncached prompt tokens/s per class, optional)."""
    rs = sorted(replicas, key=lambda r: r.index)
    hold_all = lambda why: [SwitchDecision(r.index, "hold", r.variant, why) for r in rs]  # noqa: E731
    if not rs:
        return []
    cands = candidate_variants(recipe, rs[0].variant, config)
    in_flight = [r for r in rs if r.state in IN_FLIGHT_STATES]
    if in_flight:
        return hold_all(f"replica {in_flight[0].index} is {in_flight[0].state}: one swap toward the mix at a time")
    ready = [r for r in rs if r.state == "ready"]
    limits = class_limits(recipe, list(config.classes), cands, config.slo_headroom)
    current = {v: sum(1 for r in ready if r.variant == v) for v in cands}
    target, good_t, _ = best_mix(recipe, cands, len(rs), demand, config, current, prefill_tok_s)
    good_c, _ = predict(recipe, _fleet(current), demand, config, limits, prefill_tok_s)
    want = ", ".join(f"{c} {demand.get(c, 0.0):.1f}" for c in (x.name for x in config.classes))
    what = (f"in flight by class: {want}; mix {_describe(target)} delivers {good_t:.0f} tok/s within objectives vs "
            f"{good_c:.0f} for {_describe(current)}")
    if target == current:
        return hold_all(f"{what}: the current mix is the best")
    rel = good_t / good_c - 1.0 if good_c > 0 else math.inf
    if rel < config.hysteresis:
        return hold_all(f"{what} ({rel:+.1%}): below the {config.hysteresis:.0%} hysteresis")
    to = next(v for v in cands if target[v] > current.get(v, 0))
    over = [r for r in ready if current.get(r.variant, 0) > target.get(r.variant, 0)]
    movable = [r for r in over if r.last_swap_at is None or now - r.last_swap_at >= config.dwell_s]
    if not movable:
        return hold_all(f"{what}: every replica to move swapped less than {config.dwell_s:.0f} s ago (dwell)")
    min_ready = math.ceil(config.min_ready_fraction * len(rs))
    if len(ready) - 1 < min_ready:
        return hold_all(f"{what}: a swap would leave {len(ready) - 1} ready replicas, minimum {min_ready}")
    pick = min(movable, key=lambda r: (r.concurrency, r.index))  # the least loaded drains fastest
    without = [r.variant for r in ready if r is not pick]
    good_away, _ = predict(recipe, without, demand, config, limits, prefill_tok_s)
    gain = (good_t - good_c) * config.horizon_s
    cost = max(0.0, good_c - good_away) * (config.drain_s + _load_s(recipe, to, config))
    nums = dict(predicted_tok_s_current=good_c, predicted_tok_s_target=good_t, gain_tokens=gain, cost_tokens=cost)
    if gain <= cost:
        return [SwitchDecision(r.index, "hold", r.variant, f"{what}: gain {gain:,.0f} good tokens over "
                               f"{config.horizon_s:.0f} s does not repay the swap's {cost:,.0f}", **nums) for r in rs]
    return [SwitchDecision(r.index, "swap", to, f"{what}: swap replica {r.index} {r.variant} -> {to}, gain "
                           f"{gain:,.0f} good tokens > cost {cost:,.0f}", **nums) if r is pick else
            SwitchDecision(r.index, "hold", r.variant, f"{what}: replica {pick.index} moves first", **nums)
            for r in rs]
