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
                        policy: str, kv_tokens: int | None, host_kv_gb: float, json_out: bool) -> None:
    from rich.progress import Progress

    from zoe_cluster.agentic.replay import replay_sessions

    driver = build_driver(path, opts)
    total = driver.planned_requests()
    with Progress(console=console, transient=True, disable=json_out) as prog:
        task = prog.add_task(f"{driver.total_sessions} sessions, {driver.live_sessions} live, {total:,} requests",
                             total=total)
        report = replay_sessions(recipe, variant, driver, replicas, policy, calibration=calibration,
                                 kv_tokens=kv_tokens, host_kv_gb=host_kv_gb,
                                 progress=lambda n: prog.update(task, completed=n))
    show_report(report, json_out)
