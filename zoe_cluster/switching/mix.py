"""Mixed fleets: which variant each replica should run, from the in-flight requests of each service class.

`decide` calls `decide_mix` when the switching config names service classes and the driver reports the fleet's
in-flight requests per class. It predicts, for every mix (how many replicas on each candidate variant), the
tokens per second delivered within each class's objective, with the same rule the router's `slo` policy
applies (`zoe_cluster.routing.slo`, limits from `switching.classes.class_limits`):

  place    classes tightest first: a class fills the replicas of its preferred variants in order, each up to its
           limit and to the limits of the classes already there; what is left spills onto replicas that serve
           no other class, else onto all (spread evenly)
  predict  a replica of variant v holding l requests on average gives each 1 / ITL tok/s, ITL = ITL_v(k) / (1 - f)
           with k = 1 + Poisson(l) requests seen by a request (Poisson arrivals, M/G/inf occupancy):
           ITL_v(k) = k / T_v(k) from the decode profile (seed table A8, `predict.predicted_itl_s`), and f the
           share of the replica's time that chunked prefill takes (the uncached prompt tokens/s it receives, in
           proportion to its share of each class, times `prefill_s_per_token`, seed table A5); a class's
           requests there count as good when ITL <= its objective (the router's limits keep `slo_headroom` of
           margin below it, which such interference uses up)
  good(m)  sum over replicas and classes of the good tok/s

The target is the mix with the largest net gain: (good(m) - good(current)) over what is left of `horizon_s` after
the swaps that reach m, minus the good tokens lost on the way (each swap takes a replica away for drain + load
time, and a path may pass through a poorer intermediate mix: `_path`). The fleet moves one replica at a time
under the single-replica rules: the net gain must be positive, the relative gain must pass `hysteresis`, the
replica's last swap must be older than `dwell_s`, and at least `min_ready_fraction` of the replicas stay ready.
While any replica is not ready the fleet holds (the mix is re-evaluated once the swap lands). `best_mix` gives
the best mix for a load regardless of the path (the fixed mix a planner would pick). TTFT is not predicted here (the profile
has no queueing model); the objectives' ITL part decides the mix.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from zoe_cluster.recipes import Recipe
from zoe_cluster.switching.classes import class_limits
from zoe_cluster.switching.predict import candidate_variants, load_s, predicted_itl_s, prefill_s_per_token
from zoe_cluster.switching.vocabulary import ReplicaObservation, SwitchConfig, SwitchDecision


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


def _poisson(mean: float) -> list[float]:
    """P(m) for m = 0.. until the tail is negligible (the pmf of a Poisson count with this mean)."""
    top = int(mean + 6 * math.sqrt(mean) + 6)
    p = [math.exp(-mean)]
    for m in range(1, top + 1):
        p.append(p[-1] * mean / m)
    return p


def predict(recipe: Recipe, variants: Sequence[str], demand: dict[str, float], config: SwitchConfig,
            limits: dict[str, dict[str, int]], prefill_tok_s: dict[str, float] | None = None,
            itl_cache: dict[tuple[str, int], float] | None = None) -> tuple[float, float]:
    """(good tok/s, tok/s) of a fleet running `variants` under `demand` (in-flight requests per class) and
    `prefill_tok_s` (uncached prompt tokens/s per class; None: prefill ignored); see the module docstring.

    A replica's mean load l is what the router's placement gives it; the requests it actually holds vary around l:
    with Poisson arrivals the count in service is Poisson(l) (an M/G/inf queue), and a request sees itself plus
    a Poisson(l) count of others. So each request's ITL is averaged over that count, and a class's share of
    good tokens falls smoothly, not as a cliff, as l approaches the class's limit."""
    objectives = {c.name: c.itl_s for c in config.classes}
    cache = itl_cache if itl_cache is not None else {}
    good = total = 0.0
    order = [c.name for c in sorted(config.classes, key=lambda c: c.itl_s)]
    for v, load in zip(variants, place(variants, demand, limits, order)):
        n = sum(load.values())
        if n <= 0:
            continue
        busy = sum(x / demand[c] * prefill_tok_s.get(c, 0.0) for c, x in load.items()
                   if demand.get(c, 0) > 0) * prefill_s_per_token(recipe, v) if prefill_tok_s else 0.0
        stretch = 1.0 / (1.0 - min(busy, MAX_PREFILL_SHARE))
        rate = 0.0  # expected tok/s of one request on this replica
        good_rate = dict.fromkeys(load, 0.0)
        for m, pm in enumerate(_poisson(n)):
            key = (v, m + 1)
            if key not in cache:
                cache[key] = predicted_itl_s(recipe, v, m + 1)
            itl = cache[key] * stretch
            rate += pm / itl
            for c in load:
                if itl <= objectives.get(c, math.inf):
                    good_rate[c] += pm / itl
        total += n * rate
        good += sum(x * good_rate[c] for c, x in load.items())
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
    cache: dict[tuple[str, int], float] = {}
    for m in mixes(candidates, n):
        good, tok_s = predict(recipe, _fleet(m), demand, config, limits, prefill_tok_s, cache)
        moves = sum(max(0, m[v] - current.get(v, 0)) for v in m)
        key = (round(good, 6), -moves, tok_s)
        if best is None or key > best[0]:
            best = (key, m, good, tok_s)
    assert best is not None
    return best[1], best[2], best[3]


def _describe(mix: dict[str, int]) -> str:
    return " + ".join(f"{k} {v}" for v, k in mix.items() if k) or "none"


def _path(recipe: Recipe, current: dict[str, int], target: dict[str, int], good_now: float, value, config: SwitchConfig
          ) -> tuple[float, float, tuple[str, str]]:
    """(good tokens lost, seconds, first move (from, to)) of moving `current` to `target` one swap at a time.

    Each step takes one replica away for drain + the new variant's load time, while the others serve; the step
    chosen next is the one whose resulting mix is best. A path through a poor intermediate mix costs what that
    mix loses against `good_now` for as long as it lasts."""
    state, lost, secs, first = dict(current), 0.0, 0.0, None
    while any(state[v] > target[v] for v in state):
        options = []
        for f in (v for v in state if state[v] > target[v]):
            for t in (v for v in target if state[v] < target[v]):
                nxt = {**state, f: state[f] - 1, t: state[t] + 1}
                options.append((value(nxt), value({**state, f: state[f] - 1}), f, t, nxt))
        _, good_away, f, t, state = max(options, key=lambda o: o[:2])
        step_s = config.drain_s + load_s(recipe, t, config)
        lost += max(0.0, good_now - good_away) * step_s
        secs += step_s
        first = first or (f, t)
    assert first is not None
    return lost, secs, first


def decide_mix(recipe: Recipe, replicas: list[ReplicaObservation], config: SwitchConfig, now: float,
               demand: dict[str, float], prefill_tok_s: dict[str, float] | None = None) -> list[SwitchDecision]:
    """One decision per replica, in replica order: at most one swap, toward the mix whose predicted gain over the
    horizon (after the swaps that reach it) most exceeds what those swaps lose on the way."""
    rs = sorted(replicas, key=lambda r: r.index)
    hold_all = lambda why, **kw: [SwitchDecision(r.index, "hold", r.variant, why, **kw) for r in rs]  # noqa: E731
    if not rs:
        return []
    cands = candidate_variants(recipe, rs[0].variant, config)
    waiting = [r for r in rs if r.state != "ready"]
    if waiting:
        return hold_all(f"replica {waiting[0].index} is {waiting[0].state}: the mix moves one swap at a time, "
                        "from a fleet that is all ready")
    limits = class_limits(recipe, list(config.classes), cands, config.slo_headroom)
    cache: dict[tuple[str, int], float] = {}
    values: dict[tuple[int, ...], float] = {}

    def value(mix: dict[str, int]) -> float:
        key = tuple(mix.get(v, 0) for v in cands)
        if key not in values:
            values[key] = predict(recipe, _fleet(mix), demand, config, limits, prefill_tok_s, cache)[0]
        return values[key]

    current = {v: sum(1 for r in rs if r.variant == v) for v in cands}
    good_c = value(current)
    want = ", ".join(f"{c} {demand.get(c, 0.0):.1f}" for c in (x.name for x in config.classes))
    best = None  # (net tokens, mix, good, lost, secs, first move)
    for m in mixes(cands, len(rs)):
        if m == current:
            continue
        lost, secs, first = _path(recipe, current, m, good_c, value, config)
        net = (value(m) - good_c) * max(0.0, config.horizon_s - secs) - lost
        if best is None or net > best[0]:
            best = (net, m, value(m), lost, secs, first)
    if best is None:
        return hold_all(f"in flight by class: {want}: one variant only")
    net, target, good_t, lost, secs, (frm, to) = best
    gain = net + lost
    what = (f"in flight by class: {want}; mix {_describe(target)} delivers {good_t:.0f} tok/s within objectives vs "
            f"{good_c:.0f} for {_describe(current)}")
    nums = dict(predicted_tok_s_current=good_c, predicted_tok_s_target=good_t, gain_tokens=gain, cost_tokens=lost)
    if all(v <= good_c for v in values.values()):
        return hold_all(f"in flight by class: {want}; {_describe(current)} delivers {good_c:.0f} tok/s within "
                        "objectives: the current mix is the best", **nums)
    if net <= 0:
        return hold_all(f"in flight by class: {want}: no mix repays its swaps ({_describe(current)} delivers "
                        f"{good_c:.0f} tok/s within objectives; best other {_describe(target)} {good_t:.0f})", **nums)
    rel = good_t / good_c - 1.0 if good_c > 0 else math.inf
    if rel < config.hysteresis:
        return hold_all(f"{what} ({rel:+.1%}): below the {config.hysteresis:.0%} hysteresis", **nums)
    movable = [r for r in rs if r.variant == frm and (r.last_swap_at is None or now - r.last_swap_at >= config.dwell_s)]
    if not movable:
        return hold_all(f"{what}: every {frm} replica swapped less than {config.dwell_s:.0f} s ago (dwell)", **nums)
    min_ready = math.ceil(config.min_ready_fraction * len(rs))
    if len(rs) - 1 < min_ready:
        return hold_all(f"{what}: a swap would leave {len(rs) - 1} ready replicas, minimum {min_ready}", **nums)
    pick = min(movable, key=lambda r: (r.concurrency, r.index))  # the least loaded drains fastest
    why = (f"{what}: swap replica {pick.index} {frm} -> {to}; gain {gain:,.0f} good tokens over the "
           f"{config.horizon_s - secs:.0f} s left of the horizon > {lost:,.0f} lost during the {secs:.0f} s of swaps")
    return [SwitchDecision(r.index, "swap", to, why, **nums) if r is pick else
            SwitchDecision(r.index, "hold", r.variant, f"{what}: replica {pick.index} moves first", **nums)
            for r in rs]
