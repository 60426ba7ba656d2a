"""Agentic sessions on the wall clock: the session driver against any OpenAI endpoint (zoe's router, a bare
engine, sglang-router), through the bench's streaming client.

Every request streams `/v1/completions` with the synthesized prompt, `max_tokens` = the trace's output (EOS
ignored, so lengths are exact), and the session key as `x-session-id` and `user`. Times are on the server's
clock (`StreamingClient.now`: wall seconds / `server_time_scale`, so a simulated engine at `--time-scale X`
reports modelled seconds) and think times are slept on that clock too.

The prefix hit rate is the engines' own: their /metrics counters before and after the run (`engine_urls`, or
the endpoint itself when it exposes them; a router exposes none), else the total of the responses'
`usage.prompt_tokens_details.cached_tokens` when the server reports it, else None. The zero-wait TTFT floor
needs a twin profile (recipe and variant) to price each request alone; without one it is None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zoe_cluster.agentic.driver import Call, SessionDriver
from zoe_cluster.agentic.metrics import CallRecord, summarize, ttft_floor_s
from zoe_cluster.bench.client import RequestResult, RequestSpec, StreamingClient
from zoe_cluster.bench.engine_metrics import CacheCounters, scrape_cache_counters
from zoe_cluster.sim.step_model import StepModel


@dataclass(frozen=True)
class TwinProfile:
    """The twin's step model of the engines behind the endpoint, for the TTFT floor."""

    name: str
    model: StepModel
    max_num_batched_tokens: int


@dataclass
class LiveConfig:
    url: str
    model: str
    gpus: int | None = None
    engine_urls: list[str] = field(default_factory=list)
    twin: TwinProfile | None = None
    timeout_s: float = 3600.0
    server_time_scale: float = 1.0


def _sum(counters: list[CacheCounters]) -> CacheCounters | None:
    known = [c for c in counters if c.engine is not None]
    if not known:
        return None
    return CacheCounters(known[0].engine, sum(c.hits for c in known), sum(c.queries for c in known))


async def _scrape(client: StreamingClient, urls: list[str]) -> CacheCounters | None:
    return _sum([await scrape_cache_counters(client.session, u) for u in urls])


def _record(call: Call, res: RequestResult, twin: TwinProfile | None) -> CallRecord:
    tpot = None
    if res.ok and res.ttft_s is not None and res.e2e_s is not None and res.output_tokens > 1:
        tpot = (res.e2e_s - res.ttft_s) / (res.output_tokens - 1)
    floor = None
    if twin is not None:
        floor = ttft_floor_s(twin.model, twin.max_num_batched_tokens, call.input_tokens,
                             call.reusable_blocks * call.block_tokens)
    return CallRecord(call, ok=res.ok, start_s=res.start_s, error=res.error, ttft_s=res.ttft_s, e2e_s=res.e2e_s,
                      output_tokens=res.output_tokens, tpot_s=tpot, ttft_floor_s=floor,
                      prompt_tokens=res.prompt_tokens, cached_tokens=res.cached_tokens)


async def run_live(driver: SessionDriver, config: LiveConfig,
                   progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, Any], list[CallRecord]]:
    """Run every session of `driver` against `config.url`; the agentic report and the per-request records.
    `progress(finished, live_sessions)` is called as requests end."""
    client = StreamingClient(config.url, config.model, config.timeout_s, server_time_scale=config.server_time_scale)
    records: list[CallRecord] = []
    metric_urls = config.engine_urls or [config.url]
    async with client:
        before = await _scrape(client, metric_urls)
        t0 = client.now()
        driver.start(0.0)
        pending: set[asyncio.Task[tuple[Call, RequestResult]]] = set()

        async def send(call: Call) -> tuple[Call, RequestResult]:
            spec = RequestSpec(call.prompt(), call.output_tokens, tag=call.request_id, session=call.session_key)
            res = await client.send(spec)
            res.start_s -= t0
            return call, res

        while not driver.done:
            now = client.now() - t0
            for call in driver.due(now):
                pending.add(asyncio.create_task(send(call)))
            wait_s = (driver.next_release_s() - (client.now() - t0)) * client.server_time_scale
            if not pending and wait_s == float("inf"):
                raise RuntimeError("session driver stalled: nothing in flight and nothing to release")
            if not pending:
                await asyncio.sleep(max(0.0, wait_s))
                continue
            done, pending = await asyncio.wait(pending, timeout=None if wait_s == float("inf") else max(0.0, wait_s),
                                               return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                call, res = task.result()
                records.append(_record(call, res, config.twin))
                end = res.start_s + res.e2e_s if res.e2e_s is not None else client.now() - t0
                driver.finished(call, end, ok=res.ok)
                if progress is not None:
                    progress(len(records), driver.live)
        after = await _scrape(client, metric_urls)
    notes: list[str] = []
    hit, source = _hit_rate(before, after, records)
    notes.append(f"prefix_hit_rate: {source}")
    if config.twin is None:
        notes.append("ttft_floor_p90_s: null (no twin profile given: --twin-model)")
    if config.gpus is None:
        notes.append("output_tok_s_per_gpu: null (--gpus not given)")
    report = summarize(records, gpus=config.gpus, prefix_hit_rate=hit)
    report.update(clock="live", url=config.url, model=config.model, gpus=config.gpus,
                  live_sessions=driver.live_sessions, total_sessions=driver.total_sessions,
                  think_cap_s=driver.think_cap_s, server_time_scale=config.server_time_scale,
                  ttft_floor_source=f"twin {config.twin.name}" if config.twin else None,
                  prefix_hit_rate_source=source, notes=notes)
    return report, records


def _hit_rate(before: CacheCounters | None, after: CacheCounters | None,
              records: list[CallRecord]) -> tuple[float | None, str]:
    if before is not None and after is not None and after.queries > before.queries:
        return ((after.hits - before.hits) / (after.queries - before.queries),
                f"engine /metrics ({after.engine}), whole run including warm-up")
    measured = [r for r in records if r.ok and not r.call.warmup]
    if measured and all(r.cached_tokens is not None and r.prompt_tokens for r in measured):
        prompt = sum(r.prompt_tokens or 0 for r in measured)
        return sum(r.cached_tokens or 0 for r in measured) / prompt, "responses' usage.cached_tokens"
    return None, "unknown (no engine /metrics counters and no usage.cached_tokens: pass the engines' URLs)"
