"""Agentic sessions on the virtual clock: the session driver feeds `zoe_cluster.sim.replay.replay` (simulated
replicas behind the router's real policy code) as a closed-loop `RequestSource`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zoe_cluster.agentic.driver import Call, SessionDriver
from zoe_cluster.agentic.metrics import CallRecord, summarize, ttft_floor_s
from zoe_cluster.agentic.options import SessionOptions
from zoe_cluster.recipes import Recipe
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.slowness import (
    JUDGE_EVERY_S,
    LatencyFacts,
    judge_due,
    mark_slow,
    probe_due,
    record_sample,
    slow_replicas,
)
from zoe_cluster.routing import Policy, get_policy
from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.sim.calibrate import Calibration, calibrate
from zoe_cluster.sim.core import long_prefill_cap
from zoe_cluster.sim.kv_cache import HOST_LINK_GB_S
from zoe_cluster.sim.replay import Arrival, Outcome, SimReplayConfig, TraceRow, replay


class SlowReplicaGuard(Policy):
    """The live router's slow-replica ejection on the virtual clock, around the replay's policy: the same decisions
    (`router.slowness`: a replica whose median time per output token over its latest `min_samples` requests
    exceeds `factor` x its peers' median gets no new requests; every `probe_s` one request goes to it as a probe,
    and the probe's sample replaces its window), applied as the router applies them (`router.replicas`: a slow
    replica is left out of the candidates while others remain; a due probe goes before the policy is asked, unless
    the replica is saturated; the slow set is judged again at most every `judge_every_s`, and after a probe).
    Samples come from `record` (the replay's finished requests); times are the virtual clock's."""

    def __init__(self, inner: Policy, factor: float, min_samples: int, probe_s: float,
                 judge_every_s: float = JUDGE_EVERY_S) -> None:
        super().__init__(inner.config)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.factor, self.min_samples, self.probe_s, self.judge_every_s = factor, min_samples, probe_s, judge_every_s
        self.facts: dict[str, LatencyFacts] = {}
        self.slow: dict[str, str] = {}
        self.ejections = 0
        self._routed: dict[str, tuple[str, bool]] = {}
        self._judged_at = float("-inf")

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        now = ctx.arrival_s or 0.0
        for v in replicas:
            facts = self.facts.setdefault(v.replica_id, LatencyFacts.empty())
            if v.replica_id in self.slow and not v.saturated and probe_due(facts, now, self.probe_s):
                facts.last_probe_at = now
                return RoutingDecision(v.replica_id, "probe")
        fast = [v for v in replicas if v.replica_id not in self.slow]
        return self.inner.select(ctx, fast or replicas)

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        self._routed[ctx.request_id] = (decision.replica_id, decision.reason == "probe")
        self.inner.on_routed(ctx, decision)

    def on_finished(self, ctx: RequestContext, replica_id: str, ok: bool) -> None:
        self.inner.on_finished(ctx, replica_id, ok)

    def on_replica_removed(self, replica_id: str) -> None:
        self.facts.pop(replica_id, None)
        self.slow.pop(replica_id, None)
        self.inner.on_replica_removed(replica_id)

    def on_cache_evicted(self, replica_id: str, tokens: int | None) -> None:
        self.inner.on_cache_evicted(replica_id, tokens)

    def class_of(self, ctx: RequestContext) -> str:
        return self.inner.class_of(ctx)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "slow_factor": self.factor, "slow_ejections": self.ejections}

    def record(self, request_id: str, tpot_s: float | None, now: float) -> None:
        """A finished request's time per output token (None: fewer than two output tokens, no sample)."""
        replica_id, probe = self._routed.pop(request_id, ("", False))
        if not replica_id or tpot_s is None:
            return
        record_sample(self.facts.setdefault(replica_id, LatencyFacts.empty()), "tpot_s", tpot_s, self.min_samples,
                      probe=probe)
        if not judge_due(self._judged_at, now, probe, self.judge_every_s):
            return
        self._judged_at = now
        slow = slow_replicas(self.facts, self.factor, self.min_samples)
        newly, _ = mark_slow(self.facts, self.slow, slow, now)
        self.ejections += len(newly)
        self.slow = slow


class SessionSource:
    """A `RequestSource` whose arrivals the session driver releases as earlier requests finish. Keeps one
    `CallRecord` per request, with the twin's zero-wait TTFT floor (`metrics.ttft_floor_s`)."""

    def __init__(self, driver: SessionDriver, floor: Callable[[Call], float],
                 guard: SlowReplicaGuard | None = None) -> None:
        self.driver = driver
        self.floor = floor
        self.guard = guard
        self.calls: dict[str, Call] = {}
        self.records: list[CallRecord] = []
        self.cached_tokens = 0
        self.prompt_tokens = 0
        self.host_cached_tokens = 0
        sizes = {driver.scaling.block_tokens or s.block_size for s in driver.sessions}
        if len(sizes) != 1:
            raise ValueError(f"sessions of different block sizes ({sorted(sizes)}) cannot share one replay; "
                             "give the block size to scale them to")
        self.block_tokens = sizes.pop()
        driver.start(0.0)

    def next_arrival_s(self) -> float:
        return self.driver.next_release_s()

    def pop(self) -> Arrival:
        call = self.driver.pop()
        self.calls[call.request_id] = call
        row = TraceRow(call.release_s, call.input_tokens, call.output_tokens, call.block_keys)
        return Arrival(call.request_id, row, call.session_key, call.block_tokens)

    def exhausted(self) -> bool:
        return self.driver.done

    def horizon_s(self, next_event_s: float) -> float:
        return min(self.driver.next_release_s(), next_event_s)

    def finished(self, arrival: Arrival, now: float, outcome: Outcome) -> None:
        call = self.calls.pop(arrival.request_id)
        if self.guard is not None:
            self.guard.record(arrival.request_id, outcome.tpot_s, now)
        rec = CallRecord(call, ok=not outcome.dropped, start_s=call.release_s, dropped=outcome.dropped,
                         error="dropped" if outcome.dropped else None, ttft_s=outcome.ttft_s, e2e_s=outcome.e2e_s,
                         output_tokens=outcome.output_tokens, tpot_s=outcome.tpot_s)
        if not outcome.dropped:
            rec.ttft_floor_s = self.floor(call)
            rec.prompt_tokens = outcome.prompt_tokens
            rec.cached_tokens = outcome.cached_tokens + outcome.host_cached_tokens  # as the server's usage reports
            if not call.warmup:
                self.prompt_tokens += outcome.prompt_tokens
                self.cached_tokens += outcome.cached_tokens
                self.host_cached_tokens += outcome.host_cached_tokens
        self.records.append(rec)
        # the client sees the end after the frontend latency the e2e time includes; its think time starts there
        seen_s = call.release_s + outcome.e2e_s if outcome.e2e_s is not None else now
        self.driver.finished(call, max(now, seen_s), ok=not outcome.dropped)


def replay_sessions(
    recipe: Recipe, variant: str, driver: SessionDriver, replicas: int,
    policy: str | Callable[[], Policy] = "prefix", *,
    policy_options: dict[str, Any] | None = None, calibration: Calibration | None = None,
    kv_tokens: int | None = None, host_kv_gb: float = 0.0, host_link_gb_s: float = HOST_LINK_GB_S,
    progress: Callable[[int], None] | None = None, records_out: list[CallRecord] | None = None,
    slow_factor: float | None = None, slow_min_samples: int | None = None, slow_probe_s: float | None = None,
) -> dict[str, Any]:
    """Run `driver`'s sessions on `replicas` simulated replicas of `variant`; the agentic report
    (`metrics.summarize`) with the twin's prefix hit rate, plus the replay's own counters. `records_out`, when
    given, receives every request's `CallRecord`. `slow_factor` (the router's `slow_factor`; None: off) puts the
    router's slow-replica ejection around the policy (`SlowReplicaGuard`), with the router's window
    (`slow_min_samples`) and probe period (`slow_probe_s`; None: the router's defaults); the report then counts its
    `slow_ejections`."""
    cal = calibration or calibrate(recipe, variant)
    v = recipe.variant(variant)
    chunk = long_prefill_cap(v).lone_chunk_tokens(v.max_num_batched_tokens)  # a lone request's prefill per step
    guard = None
    if slow_factor is not None:
        inner = get_policy(policy, **(policy_options or {})) if isinstance(policy, str) else policy()
        fields = RouterConfig.model_fields  # the router's window and probe period
        guard = made = SlowReplicaGuard(
            inner, slow_factor,
            fields["slow_min_samples"].default if slow_min_samples is None else slow_min_samples,
            fields["slow_probe_s"].default if slow_probe_s is None else slow_probe_s)
        policy, policy_options = (lambda: made), None
    source = SessionSource(driver, lambda c: ttft_floor_s(cal.model, chunk, c.input_tokens,
                                                          c.reusable_blocks * c.block_tokens), guard)
    config = SimReplayConfig(recipe, variant, replicas, policy, policy_options=policy_options, calibration=cal,
                             kv_tokens=kv_tokens, host_kv_gb=host_kv_gb, host_link_gb_s=host_link_gb_s)
    res = replay(config, source, progress)
    gpus = replicas * v.parallelism.gpus
    if records_out is not None:
        records_out.extend(source.records)
    hit = source.cached_tokens / source.prompt_tokens if source.prompt_tokens else 0.0
    report = summarize(source.records, gpus=gpus, prefix_hit_rate=hit)
    report.update(
        clock="virtual", model=recipe.name, variant=variant, policy=res.policy, replicas=replicas, gpus=gpus,
        live_sessions=driver.live_sessions, total_sessions=driver.total_sessions, think_cap_s=driver.think_cap_s,
        host_kv_gb=host_kv_gb,
        host_hit_rate=source.host_cached_tokens / source.prompt_tokens if source.prompt_tokens else 0.0,
        preemptions=res.preemptions, routing_reasons=res.routing_reasons, per_replica=res.per_replica,
        simulated_s=res.simulated_s, engine_ttft_mean_s=res.engine_ttft_mean_s,
        wall_s=res.wall_s, ttft_floor_source="twin step model (each request alone, every reusable block hit)",
    )
    if guard is not None:
        report.update(slow_factor=slow_factor, slow_min_samples=guard.min_samples, slow_probe_s=guard.probe_s,
                      slow_ejections=guard.ejections)
    return report


def run_closed_loop(
    path: str | Path, sessions: int, replicas: int, policy: str | Callable[[], Policy] = "prefix", *,
    model: str = "glm-5.3",
    variant: str | None = None, policy_options: dict[str, Any] | None = None, host_kv_gb: float = 0.0,
    kv_tokens: int | None = None, options: SessionOptions | None = None,
) -> dict[str, Any]:
    """`zoe sim replay PATH --sessions N` in-process: the agentic report of `sessions` live sessions from the
    files under `path` on `replicas` replicas of `model` (benchmarks sweep this). `options` overrides the
    session options (its `live_sessions` is replaced by `sessions`); prompts are cut to the model's context."""
    from dataclasses import replace

    from zoe_cluster.recipes import RecipeRegistry

    recipe = RecipeRegistry.default().get(model)
    name = variant or recipe.default_variant
    opts = replace(options or SessionOptions(sessions), live_sessions=sessions)
    if opts.max_input_tokens is None:
        opts = replace(opts, max_input_tokens=recipe.architecture.max_context_tokens)
    return replay_sessions(recipe, name, opts.driver(path), replicas, policy, policy_options=policy_options,
                           kv_tokens=kv_tokens, host_kv_gb=host_kv_gb)
