"""`zoe sim replay`: a trace through N simulated replicas behind the router's real policy code, on the virtual
clock.

Requests come from a `RequestSource`: `RowSource` releases an open-loop trace's rows at their arrival times; a
closed-loop source (`zoe_cluster.agentic.replay`, the agentic session driver) creates arrivals as earlier
requests finish, told through `finished`.

Per request, exactly what the live router does (`zoe_cluster.routing`): build the `RequestContext` (for a
Mooncake trace, `context_from_trace` from its `hash_ids`), `policy.select` among the routable replicas, and the
router's load bookkeeping (`routing.accounting.LoadLedger`: the policy's `on_routed`/`on_finished`, the
`ReplicaView` counts, the per-class counts the switcher reads); then the chosen replica's `EngineCore` serves it.
The engines cache KV in blocks of the source's `block_tokens` keyed by the same chain hashes the router indexes, so
the router's picture and the engines' caches describe the same blocks.

Deterministic: the same trace, model, variant, replicas and policy give the same result.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from zoe_cluster.recipes import Recipe
from zoe_cluster.routing import Policy, ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.accounting import LoadLedger
from zoe_cluster.routing.hashing import MOONCAKE_BLOCK_TOKENS
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.sim.calibrate import Calibration, calibrate
from zoe_cluster.sim.core import EngineCore, RequestTooLarge, SimRequest
from zoe_cluster.sim.kv_cache import HOST_LINK_GB_S, PrefixCache, host_kv_tier, kv_capacity
from zoe_cluster.sim.load_time import real_load_s


@dataclass(frozen=True, slots=True)
class TraceRow:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    slo_class: str | None = None
    """Service class of the request (class-aware routing, per-class goodput); None: the default class."""


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request a source hands to the replay: the row, its id, its session key and block size."""

    request_id: str
    row: TraceRow
    session: str | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    """Tokens per `row.hash_ids` entry."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended: dropped (never served), or completed with its latencies (simulated seconds)."""

    dropped: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0


class RequestSource(Protocol):
    """Where a replay's requests come from. One block size for all of a source's requests."""

    block_tokens: int

    def next_arrival_s(self) -> float:
        """Arrival time of the next known request; inf when none is pending."""

    def pop(self) -> Arrival:
        """Take the next known request (the one `next_arrival_s` timed)."""

    def exhausted(self) -> bool:
        """No request will arrive any more (none pending, and none can be created)."""

    def horizon_s(self, next_event_s: float) -> float:
        """How far a replica may run decode steps unattended: the next arrival, or for a source that creates
        arrivals on completions, also the next simulation event `next_event_s` (a completion may come there)."""

    def finished(self, arrival: Arrival, now: float, outcome: Outcome) -> None:
        """`arrival` left the fleet at `now` (dropped or completed)."""


class RowSource:
    """An open-loop trace: rows released at their `arrival_s`, in order."""

    def __init__(self, rows: list[TraceRow], block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        self.rows, self.block_tokens, self.k = rows, block_tokens, 0

    def next_arrival_s(self) -> float:
        return self.rows[self.k].arrival_s if self.k < len(self.rows) else float("inf")

    def pop(self) -> Arrival:
        k = self.k
        self.k += 1
        return Arrival(f"r{k}", self.rows[k], None, self.block_tokens)

    def exhausted(self) -> bool:
        return self.k >= len(self.rows)

    def horizon_s(self, next_event_s: float) -> float:
        return self.next_arrival_s()

    def finished(self, arrival: Arrival, now: float, outcome: Outcome) -> None:
        pass


def load_mooncake(path: str | Path, limit: int | None = None) -> list[TraceRow]:
    """Rows of a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`), sorted by
    arrival; parsing is `zoe_cluster.bench.traces.load_mooncake`'s (one reader for replay and `zoe bench trace`)."""
    from zoe_cluster.bench.traces import load_mooncake as read_mooncake

    p = Path(path)
    try:
        requests = read_mooncake(p)
    except OSError as e:
        raise TraceError(f"{p}: cannot read: {e.strerror}") from None
    except ValueError as e:
        raise TraceError(str(e)) from None
    rows: list[TraceRow] = []
    for r in requests[:limit] if limit is not None else requests:
        if r.input_len <= 0:
            raise TraceError(f"{p}:{r.index + 1}: input_length must be positive")
        rows.append(TraceRow(r.arrival_s, r.input_len, r.output_len, r.hash_ids or ()))
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
    """Share of prompt tokens served from HBM prefix caches."""
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
    tpot_p90_s: float = float("nan")
    goodput_tok_s: float | None = None
    """Output tokens/s of requests that met both SLOs (`slo_ttft_s`, `slo_tpot_s`), when SLOs were given."""
    swaps: int = 0
    host_hit_rate: float = 0.0
    """Share of prompt tokens loaded from host-memory KV tiers (`host_kv_gb`); GPU+host = this + prefix_hit_rate."""
    host_kv_gb: float = 0.0
    host_kv_tokens: int = 0
    """Host-tier capacity per replica, tokens (0: no host tier)."""
    engine_ttft_mean_s: float = float("nan")
    """Mean over completed requests of first token minus `SimRequest.queued_s` (the engine's queue + prefill time,
    as vLLM's engine core stamps it: the step in progress at arrival and `frontend_s` left out)."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    request_log: list[tuple[float, float, float, int, str, str | None]] = field(default_factory=list)
    """With `log_requests`: (arrival_s, ttft_s, tpot_s, output_tokens, variant, slo_class) of every completed
    request."""
    """One row per controller tick: time, requests in flight, each replica's variant and state, tokens out."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReplayFleet:
    """The simulated replicas of one replay, as a controller sees them.

    It implements the switching actuator's `FleetControl` (`replicas`, `load`, `swap`), so the live controller's
    actuator and `decide` drive simulated swaps unchanged; `load` is the report of the router's load bookkeeping
    (`LoadLedger.report`), the one the live router answers at `GET /admin/load`. A swap is drain-first: the replica leaves
    the routable set, finishes what it holds, is down for the new variant's weights load time
    (`profile.weights_load_s` x `load_time_scale`), then comes back as a new generation with a fresh cache.
    """

    def __init__(self, recipe: Recipe, variants: list[str], cal_for: Callable[[str], Calibration],
                 kv_tokens: int | None, load_time_scale: float = 1.0, host_kv_gb: float = 0.0,
                 host_link_gb_s: float = HOST_LINK_GB_S, block_tokens: int = MOONCAKE_BLOCK_TOKENS,
                 ledger: LoadLedger | None = None):
        self.recipe, self.cal_for, self.kv_tokens = recipe, cal_for, kv_tokens
        self.ledger = ledger
        """The router's load bookkeeping (the per-class counts of `load`); None: none kept."""
        self.block_tokens = block_tokens
        self.host_kv_gb, self.host_link_gb_s = host_kv_gb, host_link_gb_s
        self.load_time_scale = load_time_scale
        self.now = 0.0
        n = len(variants)
        self.variants = list(variants)
        self.generation = [0] * n
        self.state = ["ready"] * n
        self.last_swap_at: list[float | None] = [None] * n
        self.pending: dict[int, str] = {}
        self.swaps = 0
        self.cores: list[EngineCore] = []
        self.views: list[ReplicaView] = []
        for i, v in enumerate(variants):
            core, view = self._build(i, v)
            self.cores.append(core)
            self.views.append(view)

    def _build(self, i: int, variant: str) -> tuple[EngineCore, ReplicaView]:
        v = self.recipe.variant(variant)
        cap = self.kv_tokens if self.kv_tokens is not None else kv_capacity(self.recipe, variant).tokens
        bs = self.block_tokens
        host = host_kv_tier(self.recipe, variant, self.host_kv_gb, self.host_link_gb_s)
        cache = PrefixCache(max(1, cap // bs), bs, host.tokens // bs, host.load_s_per_token)
        core = EngineCore.for_variant(self.cal_for(variant).model, cache, v)
        view = ReplicaView(f"sim/{i}/{self.generation[i]}", f"sim://{i}", variant=variant, kv_capacity_tokens=cap,
                           host_kv_capacity_tokens=host.tokens, max_active_requests=v.max_num_seqs)
        return core, view

    # FleetControl
    def replicas(self) -> list[Any]:
        from zoe_cluster.switching.actuator import FleetReplica

        return [FleetReplica(i, self.views[i].replica_id, self.variants[i], self.state[i], self.last_swap_at[i])
                for i in range(len(self.views))]

    def load(self) -> LoadReport:
        if self.ledger is None:
            return LoadReport(in_flight={v.replica_id: v.active_requests for v in self.views})
        return self.ledger.report(self.views)

    def swap(self, index: int, variant: str, reason: str = "") -> None:
        if self.state[index] != "ready":
            raise ValueError(f"replica {index} is {self.state[index]}, not ready")
        self.recipe.variant(variant)
        self.state[index] = "draining"
        self.views[index].draining = True
        self.pending[index] = variant
        self.swaps += 1

    def load_s(self, variant: str) -> float:
        """The real weights load time (sim.load_time's `real`): what a swap costs is the question replays answer."""
        load = real_load_s(self.recipe, variant)
        return (600.0 if load is None else load) * self.load_time_scale

    def come_back(self, i: int, now: float) -> None:
        variant = self.pending.pop(i)
        self.generation[i] += 1
        self.variants[i] = variant
        self.cores[i], self.views[i] = self._build(i, variant)
        self.state[i] = "ready"
        self.last_swap_at[i] = now


@dataclass(frozen=True, slots=True)
class SimReplayConfig:
    """How one `replay` runs: the fleet, its routing, its controller and what it measures."""

    recipe: Recipe
    variant: str
    """Every replica's variant, unless `variants` gives each its own."""
    replicas: int
    policy: str | Callable[[], Policy] = "prefix"
    """Routing policy: a registered name (`zoe_cluster.routing` registry, built with `policy_options`), or a factory
    that builds a fresh policy for each replay (one the registry does not name, e.g. `routing.router_fleet`'s)."""
    policy_options: Mapping[str, Any] | None = None
    """Tunables of a policy given by name."""
    calibration: Calibration | None = None
    """Step model of `variant` (default: `calibrate(recipe, variant)`); other variants are calibrated on first use."""
    kv_tokens: int | None = None
    """KV capacity per replica, tokens (default: the variant's `kv_capacity`)."""
    variants: Sequence[str] | None = None
    """Each replica's starting variant (a mixed fleet); its length is `replicas`."""
    controller: Callable[[ReplayFleet], Any] | None = None
    """Called every `tick_s` simulated seconds with the `ReplayFleet` (e.g. a switching actuator's `step`); ticks
    also record the timeline."""
    tick_s: float = 30.0
    load_time_scale: float = 1.0
    """Factor on a swap's weights load time."""
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    """With either SLO, goodput counts only the requests that met both."""
    log_requests: bool = False
    """Keep every completed request's latencies in `ReplayResult.request_log`."""
    host_kv_gb: float = 0.0
    """A host-memory KV tier of this size per replica (`sim.kv_cache.host_kv_tier`); the router's prefix index is
    sized to it."""
    host_link_gb_s: float = HOST_LINK_GB_S
    """Host-tier load bandwidth per GPU, GB/s."""

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            raise ValueError(f"replicas must be positive, got {self.replicas}")
        if self.variants is not None and len(self.variants) != self.replicas:
            raise ValueError(f"variants lists {len(self.variants)} replicas, expected {self.replicas}")
        if not isinstance(self.policy, str) and self.policy_options:
            raise ValueError("policy_options: a policy given by its factory takes its options from the factory")

    def build_policy(self) -> Policy:
        """A new instance of the replay's routing policy."""
        if isinstance(self.policy, str):
            return get_policy(self.policy, **(self.policy_options or {}))
        return self.policy()


def replay(config: SimReplayConfig, requests: list[TraceRow] | RequestSource,
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Serve `requests` (an open-loop trace, or any `RequestSource`) on the fleet `config` describes; see the
    module docstring. `progress(n)` is told the number of arrivals every 500 and at the end."""
    recipe, variant, replicas, controller = config.recipe, config.variant, config.replicas, config.controller
    slo_ttft_s, slo_tpot_s, tick_s = config.slo_ttft_s, config.slo_tpot_s, config.tick_s
    t_wall = time.perf_counter()
    pol = config.build_policy()
    cals: dict[str, Calibration] = {variant: config.calibration or calibrate(recipe, variant)}

    def cal_for(name: str) -> Calibration:
        if name not in cals:
            cals[name] = calibrate(recipe, name)
        return cals[name]

    source: RequestSource = RowSource(requests) if isinstance(requests, list) else requests
    ledger = LoadLedger(pol)
    fleet = ReplayFleet(recipe, list(config.variants or [variant] * replicas), cal_for, config.kv_tokens,
                        config.load_time_scale, config.host_kv_gb, config.host_link_gb_s, source.block_tokens, ledger)
    cores, views = fleet.cores, fleet.views
    busy = [False] * replicas
    heap: list[tuple[float, int, int, Any]] = []
    seq = 0
    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    engine_ttfts: list[float] = []
    reasons: dict[str, int] = {}
    dropped = completed = 0
    prompt_tokens = cached_tokens = host_tokens = out_tokens = good_tokens = 0
    last_finish = 0.0
    k = 0  # arrivals so far
    first_arrival = source.next_arrival_s()
    timeline: list[dict[str, Any]] = []
    tick_tokens = 0
    removed_preemptions = 0
    request_log: list[tuple[float, float, float, int, str, str | None]] = []

    def start(i: int, now: float) -> None:
        nonlocal seq
        core = cores[i]
        horizon = source.horizon_s(heap[0][0] if heap else float("inf"))
        if heap_tick[0] is not None:
            horizon = min(horizon, heap_tick[0])
        step = core.fast_forward(now, horizon) or core.schedule(now)
        if step is None:
            busy[i] = False
            if fleet.state[i] == "draining" and not core.has_work:
                fleet.state[i] = "loading"
                seq += 1
                heapq.heappush(heap, (now + fleet.load_s(fleet.pending[i]), seq, i, "ready"))
            return
        busy[i] = True
        seq += 1
        heapq.heappush(heap, (now + step.duration_s, seq, i, step))

    heap_tick: list[float | None] = [None]
    if controller is not None and first_arrival < float("inf"):
        heap_tick[0] = first_arrival
        seq += 1
        heapq.heappush(heap, (first_arrival, seq, -1, "tick"))

    while not source.exhausted() or heap:
        next_arrival = source.next_arrival_s()
        if not heap and next_arrival == float("inf"):
            raise RuntimeError("replay: the request source is not exhausted but has nothing pending or in flight")
        if next_arrival < float("inf") and (not heap or next_arrival <= heap[0][0]):
            arrival = source.pop()
            row = arrival.row
            now = row.arrival_s
            ctx = context_from_trace(arrival.request_id, recipe.name, row.hash_ids, row.input_tokens,
                                     max(1, row.output_tokens), session=arrival.session,
                                     block_tokens=arrival.block_tokens, arrival_s=now)
            if row.slo_class is not None:
                ctx = replace(ctx, slo_class=row.slo_class)
            k += 1
            cands = [view for view in views if view.routable]
            if not cands:
                dropped += 1
                source.finished(arrival, now, Outcome(dropped=True))
                continue
            d = pol.select(ctx, cands)
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
            i = int(d.replica_id.split("/")[1])
            est = d.matched_tokens(ctx)
            ledger.admit(ctx, d, views[i], est)
            req = SimRequest(ctx.request_id, row.input_tokens, max(1, row.output_tokens), ctx.block_hashes,
                             arrival_s=now, payload=[ctx, est, False, views[i], arrival])
            try:
                cores[i].add(req)
            except RequestTooLarge:
                dropped += 1
                ledger.release(ctx, views[i], est, prefilled=False, ok=False)
                source.finished(arrival, now, Outcome(dropped=True))
                continue
            if not busy[i]:
                start(i, now)
            if progress is not None and k % 500 == 0:
                progress(k)
            continue
        end, _, i, step = heapq.heappop(heap)
        if step == "tick":
            fleet.now = end
            controller(fleet)  # type: ignore[misc]
            timeline.append({"t_s": end, "in_flight": sum(v.active_requests for v in views),
                             "variants": list(fleet.variants), "states": list(fleet.state),
                             "output_tokens": tick_tokens, "in_flight_by_class": fleet.load().in_flight_by_class})
            tick_tokens = 0
            for j in range(replicas):  # a replica told to drain while idle starts loading now
                if fleet.state[j] == "draining" and not busy[j]:
                    start(j, end)
            more = not source.exhausted() or any(busy) or "loading" in fleet.state
            heap_tick[0] = end + tick_s if more else None
            if more:
                seq += 1
                heapq.heappush(heap, (end + tick_s, seq, -1, "tick"))
            continue
        if step == "ready":
            removed_preemptions += cores[i].counters.preemptions
            pol.on_replica_removed(views[i].replica_id)
            fleet.come_back(i, end)
            busy[i] = False
            continue
        for req, _n in cores[i].complete(step, end):
            pay = req.payload
            view = pay[3]
            if not pay[2]:
                pay[2] = True
                ttfts.append(req.first_token_s - req.arrival_s + cal_for(fleet.variants[i]).model.frontend_s)  # type: ignore[operator]
                ledger.prefill_done(pay[0], view, pay[1])
            if req.finish_s is not None:
                completed += 1
                ledger.release(pay[0], view, pay[1], prefilled=True, ok=True)
                frontend = cal_for(fleet.variants[i]).model.frontend_s
                ttft = req.first_token_s - req.arrival_s + frontend  # type: ignore[operator]
                e2es.append(req.finish_s - req.arrival_s + frontend)
                engine_ttfts.append(req.first_token_s - req.queued_s)  # type: ignore[operator]
                tpot = (req.finish_s - req.first_token_s) / (req.output - 1) if req.output > 1 else 0.0  # type: ignore[operator]
                if req.output > 1:
                    tpots.append(tpot)
                if config.log_requests:
                    request_log.append((req.arrival_s, ttft, tpot, req.output, fleet.variants[i], pay[0].slo_class))
                if (slo_ttft_s is None or ttft <= slo_ttft_s) and (slo_tpot_s is None or tpot <= slo_tpot_s):
                    good_tokens += req.output
                prompt_tokens += req.prompt_tokens
                cached_tokens += max(0, req.cached_tokens)
                host_tokens += req.host_cached_tokens
                out_tokens += req.output
                tick_tokens += req.output
                last_finish = max(last_finish, end)
                source.finished(pay[4], end, Outcome(
                    dropped=False, ttft_s=ttft, e2e_s=e2es[-1], tpot_s=tpot if req.output > 1 else None,
                    output_tokens=req.output, prompt_tokens=req.prompt_tokens, cached_tokens=max(0, req.cached_tokens),
                    host_cached_tokens=req.host_cached_tokens))
        start(i, end)
    if progress is not None:
        progress(k)
    span = last_finish - (first_arrival if k else 0.0)
    per = []
    for view, core in zip(views, cores):
        c = core.counters
        per.append({"replica": view.replica_id, "variant": view.variant, "finished": c.finished, "steps": c.steps,
                    "busy_s": round(c.busy_s, 3), "preemptions": c.preemptions,
                    "prefix_hit_rate": c.prefix_hits_tokens / c.prefix_queries_tokens if c.prefix_queries_tokens else 0.0})
    with_slo = slo_ttft_s is not None or slo_tpot_s is not None
    return ReplayResult(
        model=recipe.name, variant=variant, policy=pol.name, replicas=replicas, requests=k, completed=completed,
        dropped=dropped, prefix_hit_rate=cached_tokens / prompt_tokens if prompt_tokens else 0.0,
        ttft_p50_s=_pct(ttfts, 0.5), ttft_p90_s=_pct(ttfts, 0.9), ttft_p99_s=_pct(ttfts, 0.99),
        tpot_p50_s=_pct(tpots, 0.5), e2e_p50_s=_pct(e2es, 0.5), e2e_p99_s=_pct(e2es, 0.99),
        output_tok_s=out_tokens / span if span > 0 else 0.0, simulated_s=span,
        preemptions=sum(c.counters.preemptions for c in cores) + removed_preemptions,
        wall_s=time.perf_counter() - t_wall, routing_reasons=reasons, per_replica=per,
        tpot_p90_s=_pct(tpots, 0.9), goodput_tok_s=(good_tokens / span if span > 0 else 0.0) if with_slo else None,
        swaps=fleet.swaps, timeline=timeline, request_log=request_log,
        host_hit_rate=host_tokens / prompt_tokens if prompt_tokens else 0.0, host_kv_gb=config.host_kv_gb,
        host_kv_tokens=fleet.views[0].host_kv_capacity_tokens if fleet.views else 0,
        engine_ttft_mean_s=sum(engine_ttfts) / len(engine_ttfts) if engine_ttfts else float("nan"),
    )


def rows_from(items: Iterable[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRow]:
    """Trace rows from (arrival_s, input_tokens, output_tokens, hash_ids) tuples (tests, generated traces)."""
    return sorted((TraceRow(*it) for it in items), key=lambda r: r.arrival_s)
