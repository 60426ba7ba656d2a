"""Trace workload: replay a trace against a URL, open-loop by timestamps or closed-loop with N users.

Open loop: request i is sent at `arrival_s * time_scale` wall seconds after the start, whether or not earlier
ones have finished (time_scale 0.1 replays ten times faster). Closed loop: N users each send the next request of the
trace as soon as their previous one ends; timestamps are ignored. Every request generates exactly its
`output_len` tokens (`ignore_eos`). Prompts come from a `prompt_for(request)` function (see `trace_prompts`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zoe_cluster.bench.client import Api, RequestResult, RequestSpec, StreamingClient
from zoe_cluster.bench.engine_metrics import hit_rate_between, scrape_cache_counters
from zoe_cluster.bench.stats import summarize
from zoe_cluster.bench.traces import TraceRequest


@dataclass(frozen=True)
class ReplayConfig:
    time_scale: float = 1.0
    closed_loop: int | None = None
    api: Api = "completions"
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise ValueError("time_scale must be positive")
        if self.closed_loop is not None and self.closed_loop < 1:
            raise ValueError("closed_loop must be at least 1")


def select_requests(
    requests: Sequence[TraceRequest], limit: int | None, max_input_len: int | None, max_output_len: int | None
) -> tuple[list[TraceRequest], int]:
    """The first `limit` requests whose input fits `max_input_len` (returns them and how many were skipped),
    with outputs capped at `max_output_len`."""
    chosen, skipped = [], 0
    for r in requests:
        if limit is not None and len(chosen) >= limit:
            break
        if max_input_len is not None and r.input_len > max_input_len:
            skipped += 1
            continue
        if max_output_len is not None and r.output_len > max_output_len:
            r = TraceRequest(r.index, r.arrival_s, r.input_len, max_output_len, r.hash_ids)
        chosen.append(r)
    return chosen, skipped


async def run_replay(
    client: StreamingClient,
    requests: Sequence[TraceRequest],
    prompt_for: Callable[[TraceRequest], str],
    config: ReplayConfig,
    on_request: Callable[[str], None] | None = None,
) -> tuple[dict, list[dict]]:
    """Replay `requests`; returns the summary row and one record per request (arrival, TTFT, ...)."""
    if not requests:
        raise ValueError("no requests to replay")

    async def one(req: TraceRequest) -> RequestResult:
        spec = RequestSpec(
            prompt=prompt_for(req),
            max_tokens=max(1, req.output_len),
            api=config.api,
            ignore_eos=True,
            temperature=config.temperature,
            tag=str(req.index),
        )
        result = await client.send(spec)
        if on_request:
            on_request("trace")
        return result

    before = await scrape_cache_counters(client.session, client.base_url)
    wall0, t0 = time.perf_counter(), client.now()
    if config.closed_loop:
        queue: asyncio.Queue[TraceRequest] = asyncio.Queue()
        for r in requests:
            queue.put_nowait(r)
        results: list[RequestResult] = []

        async def user() -> None:
            while not queue.empty():
                results.append(await one(queue.get_nowait()))

        await asyncio.gather(*(user() for _ in range(min(config.closed_loop, len(requests)))))
    else:
        tasks = []
        base = requests[0].arrival_s
        for r in requests:
            delay = wall0 + (r.arrival_s - base) * config.time_scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(r)))
        results = list(await asyncio.gather(*tasks))
    duration = client.now() - t0
    after = await scrape_cache_counters(client.session, client.base_url)

    by_index = {r.index: r for r in requests}
    good = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    out_tokens = sum(r.output_tokens for r in good)
    prompt_tokens = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    cached = [(r.cached_tokens, r.prompt_tokens) for r in good if r.cached_tokens is not None and r.prompt_tokens]
    row = {
        "requests": len(requests),
        "completed": len(good),
        "errors": len(errors),
        "error_samples": errors[:3],
        "duration_s": duration,
        "request_rate_per_s": len(good) / duration if duration > 0 else None,
        "output_tok_s": out_tokens / duration if duration > 0 else None,
        "ttft_s": summarize([r.ttft_s for r in good]),
        "itl_s": summarize([x for r in good for x in r.itl_s]),
        "e2e_s": summarize([r.e2e_s for r in good]),
        "stream_tok_s": summarize([r.decode_tok_s for r in good if r.decode_tok_s is not None]),
        "trace_input_tokens_total": sum(r.input_len for r in requests),
        "prompt_tokens_total": sum(prompt_tokens) if prompt_tokens else None,
        "output_tokens_total": out_tokens,
        "engine_hit_rate": hit_rate_between(before, after),
        "client_cached_fraction": (sum(c for c, _ in cached) / sum(p for _, p in cached)) if cached else None,
    }
    records = []
    for r in results:
        rec = r.to_json()
        req = by_index[int(r.tag)]
        rec.update(index=req.index, arrival_s=req.arrival_s, input_len=req.input_len, sent_s=r.start_s - t0)
        records.append(rec)
    records.sort(key=lambda rec: rec["index"])
    return row, records
