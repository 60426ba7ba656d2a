"""Running a workload end to end: probe the server, set up the client and token counter, run, and wrap the
rows in a `BenchReport`. The CLI calls these with a progress callback; tests call them directly."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoe_cluster.bench.client import StreamingClient
from zoe_cluster.bench.decode import DecodeConfig, run_decode
from zoe_cluster.bench.prefill import PrefillConfig, run_prefill
from zoe_cluster.bench.prompts import probe_token_counter
from zoe_cluster.bench.replay import ReplayConfig, run_replay
from zoe_cluster.bench.report import BenchReport, command_line, utc_now, versions
from zoe_cluster.bench.server import probe_server
from zoe_cluster.bench.trace_prompts import TracePrompts
from zoe_cluster.bench.traces import TraceRequest

Progress = Callable[[str], None]


def _report(kind: str, info, label: str | None, config: dict[str, Any], rows, requests=None, command=None) -> BenchReport:
    return BenchReport(
        kind=kind,
        label=label or info.model,
        command=command or command_line(),
        created_at=utc_now(),
        versions=versions(),
        server=info,
        config=config,
        rows=rows,
        requests=requests or [],
    )


async def bench_prefill(
    url: str, model: str | None, config: PrefillConfig, *, label: str | None = None,
    on_request: Progress | None = None, timeout_s: float = 3600, command: str | None = None,
    server_time_scale: float = 1.0,
) -> BenchReport:  # fmt: skip
    async with StreamingClient(url, model or "", timeout_s=timeout_s, server_time_scale=server_time_scale) as client:
        info = await probe_server(client.session, url, model)
        client.model = info.model
        counter = await probe_token_counter(client.session, url, info.model)
        info.token_counter = counter.name
        rows = await run_prefill(client, counter, config, on_request)
    cfg = _config_dict(config) | {"server_time_scale": server_time_scale}
    return _report("prefill", info, label, cfg, rows, command=command)


async def bench_decode(
    url: str, model: str | None, config: DecodeConfig, *, label: str | None = None,
    on_request: Progress | None = None, timeout_s: float = 3600, command: str | None = None,
    server_time_scale: float = 1.0,
) -> BenchReport:  # fmt: skip
    async with StreamingClient(url, model or "", timeout_s=timeout_s, server_time_scale=server_time_scale) as client:
        info = await probe_server(client.session, url, model)
        client.model = info.model
        rows = await run_decode(client, config, on_request)
    cfg = _config_dict(config)
    cfg.pop("prompt")
    cfg["prompt_text"] = config.prompt
    cfg["server_time_scale"] = server_time_scale
    return _report("decode", info, label, cfg, rows, command=command)


async def bench_trace(
    url: str, model: str | None, requests: list[TraceRequest], config: ReplayConfig, *,
    trace_name: str, trace_format: str, skipped: int = 0, seed: int = 0, label: str | None = None,
    on_request: Progress | None = None, timeout_s: float = 3600, command: str | None = None,
    server_time_scale: float = 1.0,
) -> BenchReport:  # fmt: skip
    async with StreamingClient(url, model or "", timeout_s=timeout_s, server_time_scale=server_time_scale) as client:
        info = await probe_server(client.session, url, model)
        client.model = info.model
        counter = await probe_token_counter(client.session, url, info.model)
        prompts = await TracePrompts.calibrated(counter, seed)
        info.token_counter = f"{counter.name}; {prompts.describe()}"
        row, records = await run_replay(client, requests, prompts.prompt_for, config, on_request)
    row["skipped"] = skipped
    cfg = _config_dict(config) | {"trace_name": trace_name, "trace_format": trace_format, "seed": seed,
                                  "server_time_scale": server_time_scale}
    return _report("trace", info, label, cfg, [row], records, command=command)


def _config_dict(config: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config)


def run_sync(coro):
    """Run a bench coroutine to completion (uvloop is not needed: the client is I/O-bound)."""
    return asyncio.run(coro)


def default_out(kind: str) -> Path:
    return Path(f"zoe-bench-{kind}.json")
