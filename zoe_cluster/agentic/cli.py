"""What `zoe sim replay --sessions` and `zoe bench agentic` do after parsing their flags: run, show, print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoe_cluster.agentic.options import REPORT_FIELDS, SessionOptions
from zoe_cluster.cli.common import console, fail, print_json


def show_report(report: dict[str, Any], json_out: bool) -> None:
    """The report as JSON on stdout, or its main fields for people (a None value says why when it can)."""
    if json_out:
        return print_json(report)
    for k in REPORT_FIELDS:
        v = report.get(k)
        console.print(f"[bold]{k}[/]: {round(v, 4) if isinstance(v, float) else v}")
    for note in report.get("notes", []):
        console.print(f"[dim]{note}[/]")


def build_driver(path: Path, opts: SessionOptions):  # type: ignore[no-untyped-def]
    try:
        return opts.driver(path)
    except ValueError as e:
        fail(str(e))


def replay_sessions_cmd(path: Path, opts: SessionOptions, recipe, variant: str, calibration, replicas: int,  # type: ignore[no-untyped-def]
                        policy, kv_tokens: int | None, host_kv_gb: float, json_out: bool,
                        slow: tuple[float | None, int | None, float | None] = (None, None, None)) -> None:
    """`zoe sim replay --sessions`: `slow` is (--slow-factor, --slow-min-samples, --slow-probe-s), the router's
    slow-replica ejection (`replay_sessions`; a None factor: off)."""
    from rich.progress import Progress

    from zoe_cluster.agentic.replay import replay_sessions

    driver = build_driver(path, opts)
    total = driver.planned_requests()
    with Progress(console=console, transient=True, disable=json_out) as prog:
        task = prog.add_task(f"{driver.total_sessions} sessions, {driver.live_sessions} live, {total:,} requests",
                             total=total)
        report = replay_sessions(recipe, variant, driver, replicas, policy, calibration=calibration,
                                 kv_tokens=kv_tokens, host_kv_gb=host_kv_gb,
                                 progress=lambda n: prog.update(task, completed=n), slow_factor=slow[0],
                                 slow_min_samples=slow[1], slow_probe_s=slow[2])
    show_report(report, json_out)


def twin_profile(model: str, variant: str | None):  # type: ignore[no-untyped-def]
    """The twin's step model of `model`/`variant` for the live TTFT floor (a bad name exits with the reason)."""
    from zoe_cluster.agentic.live import TwinProfile
    from zoe_cluster.recipes import RecipeError, RecipeRegistry, UnknownModelError
    from zoe_cluster.sim.calibrate import CalibrationError, calibrate

    try:
        recipe = RecipeRegistry.default().get(model)
        name = variant or recipe.default_variant
        v = recipe.variant(name)
        cal = calibrate(recipe, name)
    except (UnknownModelError, RecipeError, CalibrationError, KeyError, ValueError) as e:
        fail(f"--twin-model: {e}")
    return TwinProfile(f"{recipe.name}/{name}", cal.model, v.max_num_batched_tokens)


async def _resolve(url: str, model: str | None, engine_urls: list[str], time_scale: float | None,
                   timeout_s: float) -> tuple[str, float]:
    """The model to request and the server time scale (a simulated engine's /sim/info, behind a router too)."""
    import aiohttp

    from zoe_cluster.bench.server import probe_server

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        info = await probe_server(session, url, model)
        sim = info.sim
        for engine in engine_urls:
            if sim is not None:
                break
            try:
                async with session.get(engine.rstrip("/") + "/sim/info") as resp:
                    if resp.status == 200:
                        sim = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError):
                pass
    scale = time_scale or float((sim or {}).get("time_scale") or 1.0)
    return info.model, scale


def bench_agentic_cmd(path: Path, opts: SessionOptions, url: str, model: str | None, engine_urls: list[str],
                      gpus: int | None, twin, timeout_s: float, time_scale: float | None,  # type: ignore[no-untyped-def]
                      out: Path | None, json_out: bool) -> None:
    import asyncio
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zoe_cluster.agentic.live import LiveConfig, run_live
    from zoe_cluster.bench.server import ServerUnreachable
    from zoe_cluster.cli.common import EXIT_RUNTIME

    driver = build_driver(path, opts)
    try:
        served, scale = asyncio.run(_resolve(url, model, engine_urls, time_scale, timeout_s))
    except ServerUnreachable as e:
        fail(str(e), EXIT_RUNTIME)
    config = LiveConfig(url, served, gpus, engine_urls, twin, timeout_s, scale)
    total = driver.planned_requests()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[live]} sessions live"))
    with Progress(*columns, console=console, transient=True) as prog:
        task = prog.add_task(f"{driver.total_sessions} sessions -> {url}", total=total, live=0)
        report, records = asyncio.run(run_live(
            driver, config, lambda n, live: prog.update(task, completed=n, live=live)))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    show_report(report, json_out)
