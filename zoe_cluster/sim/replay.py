"""`zoe sim replay`: a trace through N simulated replicas behind the router's real policy code, on the virtual
clock.

Per request, exactly what the live router does (`zoe_cluster.routing`): build the `RequestContext` (for a
Mooncake trace, `context_from_trace` from its `hash_ids`), `policy.select` among the routable replicas,
`policy.on_routed`, and the `ReplicaView` load accounting (`admit`, `prefill_done`, `finish`); then the
chosen replica's `EngineCore` serves it. The engines cache KV in 512-token blocks keyed by the same chain
hashes the router indexes, so the router's picture and the engines' caches describe the same blocks.

Deterministic: the same trace, model, variant, replicas and policy give the same result.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zoe_cluster.recipes import Recipe
from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.hashing import MOONCAKE_BLOCK_TOKENS
from zoe_cluster.sim.calibrate import Calibration, calibrate
from zoe_cluster.sim.core import EngineCore, RequestTooLarge, SimRequest
from zoe_cluster.sim.kv_cache import PrefixCache, kv_capacity


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


class TraceError(ValueError):
    pass


def load_mooncake(path: str | Path, limit: int | None = None) -> list[TraceRow]:
    """Rows of a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`)."""
    rows: list[TraceRow] = []
    p = Path(path)
    try:
        fh = p.open()
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e.strerror}") from None
    with fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                rows.append(TraceRow(float(d["timestamp"]) / 1000.0, int(d["input_length"]),
                                     int(d["output_length"]), tuple(d.get("hash_ids") or ())))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise TraceError(f"{p}:{i}: not a Mooncake trace row ({type(e).__name__}: {e})") from None
            if rows[-1].input_tokens <= 0:
                raise TraceError(f"{p}:{i}: input_length must be positive")
            if limit is not None and len(rows) >= limit:
                break
    rows.sort(key=lambda r: r.arrival_s)
    return rows


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass
class ReplayResult:
    model: str
    variant: str
    policy: str
    replicas: int
    requests: int
    completed: int
    dropped: int
    prefix_hit_rate: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    output_tok_s: float
    simulated_s: float
    preemptions: int
    wall_s: float
    routing_reasons: dict[str, int] = field(default_factory=dict)
    per_replica: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay(
    recipe: Recipe,
    variant: str,
    rows: list[TraceRow],
    replicas: int,
    policy: str = "prefix",
    policy_options: dict[str, Any] | None = None,
    calibration: Calibration | None = None,
    kv_tokens: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Serve `rows` on `replicas` simulated replicas of `variant` routed by `policy`; see the module docstring."""
    if replicas <= 0:
        raise ValueError(f"replicas must be positive, got {replicas}")
    t_wall = time.perf_counter()
    v = recipe.variant(variant)
    pol = get_policy(policy, **(policy_options or {}))
    cal = calibration or calibrate(recipe, variant)
    cap = kv_tokens if kv_tokens is not None else kv_capacity(recipe, variant).tokens
    bs = MOONCAKE_BLOCK_TOKENS
    cores = [EngineCore(cal.model, PrefixCache(max(1, cap // bs), bs), v.max_num_seqs, v.max_num_batched_tokens)
             for _ in range(replicas)]
    views = [ReplicaView(f"sim/{i}/0", f"sim://{i}", variant=variant, kv_capacity_tokens=cap,
                         max_active_requests=v.max_num_seqs) for i in range(replicas)]
    index = {view.replica_id: i for i, view in enumerate(views)}
    frontend = cal.model.frontend_s
    busy = [False] * replicas
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    reasons: dict[str, int] = {}
    dropped = completed = 0
    prompt_tokens = cached_tokens = out_tokens = 0
    last_finish = 0.0
    n_rows = len(rows)
    k = 0  # next arrival

    def start(i: int, now: float) -> None:
        nonlocal seq
        core = cores[i]
        horizon = rows[k].arrival_s if k < n_rows else float("inf")
        step = core.fast_forward(now, horizon) or core.schedule(now)
        if step is None:
            busy[i] = False
            return
        busy[i] = True
        seq += 1
        heapq.heappush(heap, (now + step.duration_s, seq, i, step))

    while k < n_rows or heap:
        if k < n_rows and (not heap or rows[k].arrival_s <= heap[0][0]):
            row = rows[k]
            now = row.arrival_s
            ctx = context_from_trace(f"r{k}", recipe.name, row.hash_ids, row.input_tokens, max(1, row.output_tokens))
            k += 1
            cands = [view for view in views if view.routable]
            d = pol.select(ctx, cands)
            pol.on_routed(ctx, d)
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
            i = index[d.replica_id]
            est = d.matched_tokens(ctx)
            views[i].admit(ctx, est)
            req = SimRequest(ctx.request_id, row.input_tokens, max(1, row.output_tokens), ctx.block_hashes,
                             arrival_s=now, payload=[ctx, est, False])
            try:
                cores[i].add(req)
            except RequestTooLarge:
                dropped += 1
                views[i].finish(ctx, est, prefilled=False)
                pol.on_finished(ctx, d.replica_id, False)
                continue
            if not busy[i]:
                start(i, now)
            if progress is not None and k % 500 == 0:
                progress(k)
            continue
        end, _, i, step = heapq.heappop(heap)
        view = views[i]
        for req, _n in cores[i].complete(step, end):
            pay = req.payload
            if not pay[2]:
                pay[2] = True
                ttfts.append(req.first_token_s - req.arrival_s + frontend)  # type: ignore[operator]
                view.prefill_done(pay[0], pay[1])
            if req.finish_s is not None:
                completed += 1
                view.finish(pay[0], pay[1])
                pol.on_finished(pay[0], view.replica_id, True)
                e2es.append(req.finish_s - req.arrival_s + frontend)
                if req.output > 1:
                    tpots.append((req.finish_s - req.first_token_s) / (req.output - 1))  # type: ignore[operator]
                prompt_tokens += req.prompt_tokens
                cached_tokens += max(0, req.cached_tokens)
                out_tokens += req.output
                last_finish = max(last_finish, end)
        start(i, end)
    if progress is not None:
        progress(n_rows)
    span = last_finish - (rows[0].arrival_s if rows else 0.0)
    per = []
    for view, core in zip(views, cores):
        c = core.counters
        per.append({"replica": view.replica_id, "finished": c.finished, "steps": c.steps,
                    "busy_s": round(c.busy_s, 3), "preemptions": c.preemptions,
                    "prefix_hit_rate": c.prefix_hits_tokens / c.prefix_queries_tokens if c.prefix_queries_tokens else 0.0})
    return ReplayResult(
        model=recipe.name, variant=variant, policy=policy, replicas=replicas, requests=n_rows, completed=completed,
        dropped=dropped, prefix_hit_rate=cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        ttft_p50_s=_pct(ttfts, 0.5), ttft_p90_s=_pct(ttfts, 0.9), ttft_p99_s=_pct(ttfts, 0.99),
        tpot_p50_s=_pct(tpots, 0.5), e2e_p50_s=_pct(e2es, 0.5), e2e_p99_s=_pct(e2es, 0.99),
        output_tok_s=out_tokens / span if span > 0 else 0.0, simulated_s=span,
        preemptions=sum(c.counters.preemptions for c in cores), wall_s=time.perf_counter() - t_wall,
        routing_reasons=reasons, per_replica=per,
    )


def rows_from(items: Iterable[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRow]:
    """Trace rows from (arrival_s, input_tokens, output_tokens, hash_ids) tuples (tests, generated traces)."""
    return sorted((TraceRow(*it) for it in items), key=lambda r: r.arrival_s)
