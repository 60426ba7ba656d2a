"""Load shapes for evaluating recipe switching on the simulated engine.

`day_shaped_rows` makes an open-loop trace whose concurrency follows a target curve: arrivals are Poisson with
rate C(t) / S(C(t)), where S is the expected request time at that concurrency on a reference variant (Little's
law), so the fleet holds about C(t) requests at once. Requests are chat turns: a shared system-prompt block, then
a session's growing history (Mooncake-style 512-token block ids), so the prefix cache matters as in real traffic.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.profile import decode_tok_s_per_node, ttft_s
from zoe_cluster.sim.replay import TraceRow, rows_from

BLOCK = 512


def ramp(points: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """Piecewise-linear concurrency target through (time_s, concurrency) points, held at the ends."""
    pts = sorted(points)

    def at(t: float) -> float:
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, c0), (t1, c1) in zip(pts, pts[1:]):
            if t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    return at


def day_shaped_rows(recipe: Recipe, reference_variant: str, target: Callable[[float], float], duration_s: float,
                    replicas: int, seed: int = 0, input_blocks: tuple[int, int] = (2, 8),
                    output_tokens: tuple[int, int] = (256, 1024), sessions: int = 400,
                    history_blocks: int = 16, class_shares: dict[str, float] | None = None) -> list[TraceRow]:
    """Arrivals over [0, duration_s) that hold about `target(t)` requests in flight across `replicas`.

    With `class_shares` ({class: share}, shares summing to 1) every request draws its service class."""
    rng = random.Random(seed)
    classes = assign_classes(class_shares, seed + 1) if class_shares else None
    mean_out = sum(output_tokens) / 2
    history: dict[int, list[int]] = {}
    next_block = 1
    t = 0.0
    items = []
    while True:
        c = max(target(t), 0.05)
        per_replica = max(c / replicas, 1.0)
        pred = decode_tok_s_per_node(recipe, reference_variant, per_replica)
        per_user = pred.value / per_replica if pred else 30.0
        mean_in = BLOCK * (1 + history_blocks / 2)
        prefill = ttft_s(recipe, reference_variant, mean_in, 0.5)
        service_s = mean_out / per_user + (prefill.value if prefill else 0.5)
        rate = c / service_s
        t += rng.expovariate(rate)
        if t >= duration_s:
            break
        sid = rng.randrange(sessions)
        hist = history.setdefault(sid, [])
        new = rng.randint(*input_blocks)
        for _ in range(new):
            hist.append(next_block)
            next_block += 1
        del hist[:-history_blocks]  # a session keeps its most recent history_blocks x 512 tokens
        ids = (0, *hist)  # block 0: the shared system prompt
        row = (t, len(ids) * BLOCK, rng.randint(*output_tokens), ids)
        items.append((*row, classes()) if classes else row)
    return rows_from(items)


def assign_classes(shares: dict[str, float], seed: int = 0) -> Callable[[], str]:
    """A seeded draw of a service class with the given shares (its own stream: arrivals stay the same)."""
    total = sum(shares.values())
    if not shares or total <= 0 or any(v < 0 for v in shares.values()):
        raise ValueError(f"class shares must be non-negative and sum to more than 0: {shares}")
    rng = random.Random(seed)
    names = list(shares)
    weights = [shares[n] / total for n in names]
    return lambda: rng.choices(names, weights)[0]


def with_classes(rows: Sequence[TraceRow], shares: dict[str, float], seed: int = 0) -> list[TraceRow]:
    """`rows` with a service class drawn for each (a trace that has none, e.g. Azure's)."""
    draw = assign_classes(shares, seed)
    return [TraceRow(r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids, draw()) for r in rows]


def mean_concurrency(rows: Sequence[TraceRow], e2e_s: Sequence[float], t0: float, t1: float) -> float:
    """Time-average requests in flight over [t0, t1) given each row's end-to-end time (for reports)."""
    total = 0.0
    for r, d in zip(rows, e2e_s):
        lo, hi = max(r.arrival_s, t0), min(r.arrival_s + d, t1)
        total += max(0.0, hi - lo)
    return total / (t1 - t0) if t1 > t0 else math.nan
