"""Running a workload end to end: probe the server, set up the client and token counter, run, and wrap the
rows in a `BenchReport`. The CLI calls these with a progress callback; tests may call them directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from zoe_cluster.bench.client import StreamingClient
from zoe_cluster.bench.decode import DecodeConfig, run_decode
from zoe_cluster.bench.prefill import PrefillConfig, run_prefill
from zoe_cluster.bench.prompts import SimTokenCounter, TokenCounter, probe_token_counter
from zoe_cluster.bench.replay import ReplayConfig, run_replay
from zoe_cluster.bench.report import BenchReport, ServerInfo, command_line, utc_now, versions
from zoe_cluster.bench.server import probe_server
from zoe_cluster.bench.trace_prompts import TracePrompts
from zoe_cluster.bench.traces import TraceRequest

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """What is measured and how the run is recorded (shared by every workload)."""

    url: str
    model: str | None = None
    """None: the first model the server lists."""
    label: str | None = None
    timeout_s: float = 3600.0
    server_time_scale: float | None = None
    """Measured times are divided by this (a simulated engine at `--time-scale X`); None: the time scale a
    simulated engine reports in /sim/info, 1 for any other server."""
    command: str | None = None
    """The command line to record; None: this process's argv."""


@asynccontextmanager
async def _connected(target: Target) -> AsyncIterator[tuple[StreamingClient, ServerInfo]]:
    client = StreamingClient(target.url, target.model or "", target.timeout_s,
                             server_time_scale=target.server_time_scale or 1.0)  # fmt: skip
    async with client:
        info = await probe_server(client.session, target.url, target.model)
        client.model = info.model
        if target.server_time_scale is None and info.sim and info.sim.get("time_scale"):
            client.server_time_scale = float(info.sim["time_scale"])
        yield client, info


async def _token_counter(client: StreamingClient, info: ServerInfo) -> TokenCounter:
    if info.sim is not None:
        return SimTokenCounter()
    return await probe_token_counter(client.session, client.base_url, info.model)


def _report(kind: str, target: Target, info: ServerInfo, config: dict[str, Any], rows: list[dict],
            requests: list[dict] | None = None, time_scale: float = 1.0) -> BenchReport:  # fmt: skip
    return BenchReport(
        kind=kind,
        label=target.label or info.model,
        command=target.command or command_line(),
        created_at=utc_now(),
        versions=versions(),
        server=info,
        config=config | {"server_time_scale": time_scale},
        rows=rows,
        requests=requests or [],
    )


async def bench_prefill(target: Target, config: PrefillConfig, on_request: Progress | None = None) -> BenchReport:
    async with _connected(target) as (client, info):
        counter = await _token_counter(client, info)
        info.token_counter = counter.name
        rows = await run_prefill(client, counter, config, on_request)
    return _report("prefill", target, info, asdict(config), rows, time_scale=client.server_time_scale)


async def bench_decode(target: Target, config: DecodeConfig, on_request: Progress | None = None) -> BenchReport:
    async with _connected(target) as (client, info):
        rows = await run_decode(client, config, on_request)
    cfg = asdict(config)
    cfg["prompt_text"] = cfg.pop("prompt")
    return _report("decode", target, info, cfg, rows, time_scale=client.server_time_scale)


async def bench_trace(
    target: Target, requests: list[TraceRequest], config: ReplayConfig, *, trace_name: str, trace_format: str,
    skipped: int = 0, seed: int = 0, on_request: Progress | None = None,
) -> BenchReport:  # fmt: skip
    async with _connected(target) as (client, info):
        counter = await _token_counter(client, info)
        prompts = await TracePrompts.calibrated(counter, seed)
        info.token_counter = f"{counter.name}; {prompts.describe()}"
        row, records = await run_replay(client, requests, prompts.prompt_for, config, on_request)
    row["skipped"] = skipped
    cfg = asdict(config) | {"trace_name": trace_name, "trace_format": trace_format, "seed": seed}
    return _report("trace", target, info, cfg, [row], records, time_scale=client.server_time_scale)


def run_sync(coro):
    """Run a bench coroutine to completion (the client is I/O-bound: the default event loop is enough)."""
    return asyncio.run(coro)


def default_out(kind: str) -> Path:
    return Path(f"zoe-bench-{kind}.json")
