"""`zoe bench prefill|decode|trace|agentic|compare`: measure a deployment from the client side, the way the seed did.

Thin commands: parse and check the options, run a workload from `zoe_cluster.bench` under a rich progress
bar, write the JSON report and its PNG, print a table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from zoe_cluster.cli.common import EXIT_RUNTIME, console, fail, print_json

bench_app = typer.Typer(help="Benchmark a deployment: prefill TTFT, decode tok/s, trace replay, compare.",
                        no_args_is_help=True)  # fmt: skip

URL = typer.Option(..., "--url", help="Base URL of the OpenAI-compatible server (engine or router).")
MODEL = typer.Option(None, "--model", help="Model name to request (default: the first one /v1/models lists).")
OUT = typer.Option(None, "--out", help="Report JSON path (default: ./zoe-bench-<kind>.json).")
PLOT = typer.Option(None, "--plot", help="PNG path (default: the report path with .png).")
LABEL = typer.Option(None, "--label", help="Name of this run in plots and comparisons (default: the model).")
TIMEOUT = typer.Option(3600.0, "--timeout", help="Per-request timeout, seconds.")
SERVER_TIME_SCALE = typer.Option(
    None, "--server-time-scale", min=1e-6,
    help="Divide measured times by this. Default: the time scale zoe's simulated engine reports in /sim/info "
    "(so its results are in modelled seconds), 1 for any other server.")  # fmt: skip


def _full_command(ctx: typer.Context) -> str:
    """The running `zoe bench ...` command with every option spelled out (defaults included), so a report
    records exactly what ran even when it was started from Python or a test."""
    import shlex

    words = ["zoe", *ctx.command_path.split()[1:]]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or param.name in ("out", "plot"):
            continue
        if param.param_type_name == "argument":
            words.append(str(value))
        elif isinstance(value, bool) and param.secondary_opts:
            words.append(param.opts[0] if value else param.secondary_opts[0])
        elif isinstance(value, bool):
            if value:
                words.append(param.opts[0])
        else:
            words += [max(param.opts, key=len), str(value)]
    return shlex.join(words)


def _target(ctx: typer.Context, url: str, model: str | None, label: str | None, timeout: float,
            scale: float | None):
    from zoe_cluster.bench.runner import Target

    return Target(url=url, model=model, label=label, timeout_s=timeout, server_time_scale=scale,
                  command=_full_command(ctx))  # fmt: skip


def _check_api(api: str) -> None:
    if api not in ("completions", "chat"):
        fail(f"--api: expected completions or chat, got {api!r}")


def _fresh_seed(ctx: typer.Context) -> int:
    """A new prompt seed, written back into the command's parameters so the report's command reproduces it."""
    import secrets

    seed = 1 + secrets.randbelow(2**31 - 1)
    ctx.params["seed"] = seed
    return seed


def _parse(fn, text: str, option: str):
    try:
        return fn(text)
    except ValueError as exc:
        fail(f"{option}: {exc}")


def _run_with_progress(total: int, description: str, make_coro):
    """Run the coroutine `make_coro(on_request)` under a progress bar of `total` requests."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zoe_cluster.bench.runner import run_sync
    from zoe_cluster.bench.server import ServerUnreachable

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[cell]}"),
        TimeElapsedColumn(), console=console, transient=False,
    ) as progress:  # fmt: skip
        task = progress.add_task(description, total=total, cell="")

        def on_request(tag: str) -> None:
            progress.update(task, advance=1, cell=tag)

        try:
            return run_sync(make_coro(on_request))
        except ServerUnreachable as exc:
            progress.stop()
            fail(str(exc), code=EXIT_RUNTIME)
        except ValueError as exc:
            progress.stop()
            fail(str(exc))


def _save(report, out: Optional[Path], plot: Optional[Path]) -> tuple[Path, Path]:
    from zoe_cluster.bench.plots import plot_report
    from zoe_cluster.bench.runner import default_out

    out = out or default_out(report.kind)
    plot = plot or out.with_suffix(".png")
    report.save(out)
    plot_report(report, plot)
    console.print(f"report: {out}\nplot:   {plot}")
    return out, plot


def _fmt(summary: dict | None, scale: float = 1.0, digits: int = 3) -> str:
    if not summary or summary.get("mean") is None:
        return "-"
    return f"{summary['mean'] * scale:.{digits}f} ± {(summary.get('std') or 0) * scale:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _check_errors(rows: list[dict]) -> None:
    failed = [r for r in rows if r.get("completed", 0) == 0]
    if failed:
        sample = next((r["error_samples"][0] for r in failed if r.get("error_samples")), "no detail")
        fail(f"{len(failed)} of {len(rows)} cells had no successful request; first error: {sample}", code=EXIT_RUNTIME)


@bench_app.command("prefill")
def prefill(
    ctx: typer.Context,
    url: str = URL,
    model: Optional[str] = MODEL,
    lengths: str = typer.Option("8k,16k,32k", "--lengths", help="Input lengths, tokens (8k = 8192)."),
    hit_rates: str = typer.Option("0,0.6,0.9", "--hit-rates", help="Target prefix-cache hit rates in [0, 1)."),
    runs: int = typer.Option(10, "--runs", min=1, help="Measured requests per cell."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Warmup requests per cell (they cache the prefix)."),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed of the random prompt text (default: fresh, so a rerun against the same server "
        "does not hit the previous run's cache; the seed used is in the report)."),  # fmt: skip
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    out: Optional[Path] = OUT,
    plot: Optional[Path] = PLOT,
    label: Optional[str] = LABEL,
    timeout: float = TIMEOUT,
    server_time_scale: Optional[float] = SERVER_TIME_SCALE,
) -> None:
    """Single-request TTFT by input length at controlled prefix-cache hit rates (one output token)."""
    from rich.table import Table

    from zoe_cluster.bench.prefill import PrefillConfig
    from zoe_cluster.bench.runner import bench_prefill
    from zoe_cluster.bench.sizes import format_tokens, parse_rates, parse_token_counts

    _check_api(api)
    if seed is None:
        seed = _fresh_seed(ctx)
    parsed_lengths = _parse(parse_token_counts, lengths, "--lengths")
    parsed_rates = _parse(parse_rates, hit_rates, "--hit-rates")
    config = _parse(
        lambda _: PrefillConfig(lengths=parsed_lengths, hit_rates=parsed_rates, runs=runs, warmup=warmup, seed=seed,
                                api=api),  # type: ignore[arg-type]
        "", "--warmup",
    )  # fmt: skip
    report = _run_with_progress(
        config.total_requests, "prefill",
        lambda cb: bench_prefill(_target(ctx, url, model, label, timeout, server_time_scale), config, cb),
    )  # fmt: skip
    table = Table("input", "hit rate (target)", "engine saw", "TTFT s (mean ± std)", "p90 s", "ok/runs")
    for r in report.rows:
        table.add_row(format_tokens(r["input_len"]), f"{r['hit_rate_target']:.0%}", _pct(r["engine_hit_rate"]),
                      _fmt(r["ttft_s"], digits=4), f"{r['ttft_s']['p90']:.4f}" if r["ttft_s"]["p90"] else "-",
                      f"{r['completed']}/{r['runs']}")  # fmt: skip
    console.print(table)
    _save(report, out, plot)
    _check_errors(report.rows)


@bench_app.command("decode")
def decode(
    ctx: typer.Context,
    url: str = URL,
    model: Optional[str] = MODEL,
    concurrency: str = typer.Option("1,2,4,8,16,32", "--concurrency", help="Concurrent streams per step."),
    output_len: int = typer.Option(1024, "--output-len", min=2, help="Tokens each stream generates (OSL)."),
    prompt: str = typer.Option("apex", "--prompt", help="apex, gsm8k (the seed's prompts) or a text FILE."),
    runs: int = typer.Option(3, "--runs", min=1, help="Measured runs per concurrency."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Warmup runs per concurrency."),
    nodes: int = typer.Option(1, "--nodes", min=1, help="Nodes behind the URL (per-node = total / nodes)."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (seed: 1.0)."),
    top_p: float = typer.Option(0.95, "--top-p", help="Nucleus sampling (seed: 0.95)."),
    ignore_eos: bool = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Force exactly --output-len."),
    api: str = typer.Option("chat", "--api", help="chat or completions."),
    out: Optional[Path] = OUT,
    plot: Optional[Path] = PLOT,
    label: Optional[str] = LABEL,
    timeout: float = TIMEOUT,
    server_time_scale: Optional[float] = SERVER_TIME_SCALE,
) -> None:
    """Per-user and per-node decode tok/s by concurrency (TTFT excluded)."""
    from rich.table import Table

    from zoe_cluster.bench.decode import DecodeConfig
    from zoe_cluster.bench.prompts import load_prompt
    from zoe_cluster.bench.runner import bench_decode
    from zoe_cluster.bench.sizes import parse_positive_ints

    _check_api(api)
    prompt_label, prompt_text = _parse(load_prompt, prompt, "--prompt")
    config = DecodeConfig(
        concurrency=_parse(lambda t: parse_positive_ints(t, "concurrency"), concurrency, "--concurrency"),
        output_len=output_len, prompt=prompt_text, prompt_label=prompt_label, runs=runs, warmup=warmup,
        nodes=nodes, temperature=temperature, top_p=top_p, ignore_eos=ignore_eos, api=api,  # type: ignore[arg-type]
    )  # fmt: skip
    report = _run_with_progress(
        config.total_requests, "decode",
        lambda cb: bench_decode(_target(ctx, url, model, label, timeout, server_time_scale), config, cb),
    )  # fmt: skip
    table = Table("concurrency", "per-user tok/s", "per-node tok/s", "TTFT s (excluded)", "tokens/stream", "ok")
    for r in report.rows:
        table.add_row(str(r["concurrency"]), _fmt(r["per_user_tok_s"], digits=1), _fmt(r["per_node_tok_s"], digits=1),
                      _fmt(r["ttft_s"]), f"{r['output_tokens_mean'] or 0:.0f}",
                      f"{r['completed']}/{r['concurrency'] * r['runs']}")  # fmt: skip
    console.print(table)
    _save(report, out, plot)
    _check_errors(report.rows)


@bench_app.command("trace")
def trace(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="Mooncake JSONL (hash_ids of 512-token blocks) or Azure CSV trace."),
    url: str = URL,
    model: Optional[str] = MODEL,
    time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply trace timestamps by this (0.1 = 10x faster)."),
    closed_loop: Optional[int] = typer.Option(
        None, "--closed-loop", min=1, help="N users back to back; ignores timestamps."),  # fmt: skip
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Replay only the first N requests."),
    max_input_len: Optional[int] = typer.Option(None, "--max-input-len", min=1, help="Skip longer requests (tokens)."),
    max_output_len: Optional[int] = typer.Option(None, "--max-output-len", min=1, help="Cap output tokens."),
    seed: Optional[int] = typer.Option(
        None, "--seed", min=0, help="Prompt seed (default: fresh). 0 replays Mooncake hash_ids as they are; "
        "another shifts every block id by the same amount (same sharing, text no earlier run cached)."),  # fmt: skip
    out: Optional[Path] = OUT,
    plot: Optional[Path] = PLOT,
    label: Optional[str] = LABEL,
    timeout: float = TIMEOUT,
    server_time_scale: Optional[float] = SERVER_TIME_SCALE,
) -> None:
    """Replay a trace open-loop by its timestamps (or closed-loop) and report TTFT, ITL, e2e and hit rate."""
    from rich.table import Table

    from zoe_cluster.bench.replay import ReplayConfig, select_requests
    from zoe_cluster.bench.runner import bench_trace
    from zoe_cluster.bench.traces import load_trace

    if time_scale <= 0:
        fail(f"--time-scale must be positive, got {time_scale}")
    fmt, requests = _parse(load_trace, str(file), "trace")
    chosen, skipped = select_requests(requests, limit, max_input_len, max_output_len)
    if not chosen:
        fail(f"no request of {file} fits --max-input-len {max_input_len}")
    config = ReplayConfig(time_scale=time_scale, closed_loop=closed_loop)
    if seed is None:
        seed = _fresh_seed(ctx)
    report = _run_with_progress(
        len(chosen), f"trace ({fmt})",
        lambda cb: bench_trace(_target(ctx, url, model, label, timeout, server_time_scale), chosen, config,
                               trace_name=file.name, trace_format=fmt, skipped=skipped, seed=seed, on_request=cb),
    )  # fmt: skip
    r = report.rows[0]
    table = Table("requests", "ok", "skipped", "TTFT p50/p90/p99 s", "ITL mean s", "output tok/s", "engine hit rate")
    t = r["ttft_s"]
    table.add_row(str(r["requests"]), str(r["completed"]), str(skipped),
                  "-" if t["p50"] is None else f"{t['p50']:.3f}/{t['p90']:.3f}/{t['p99']:.3f}",
                  _fmt(r["itl_s"], digits=4), f"{r['output_tok_s'] or 0:.1f}", _pct(r["engine_hit_rate"]))  # fmt: skip
    console.print(table)
    _save(report, out, plot)
    _check_errors(report.rows)


@bench_app.command("agentic")
def agentic_cmd(
    path: Path = typer.Argument(..., help="A session file or a directory of them (kv-cache-tester format)."),
    url: str = URL,
    sessions: int = typer.Option(..., "--sessions", help="Sessions live at once (a finished one is replaced)."),
    model: Optional[str] = MODEL,
    engine_url: list[str] = typer.Option(
        [], "--engine-url", help="An engine behind --url whose /metrics prefix-cache counters give the hit rate "
        "(repeat per engine; default: --url itself)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="GPUs behind --url (for output tok/s per GPU)."),
    twin_model: Optional[str] = typer.Option(
        None, "--twin-model", help="Recipe whose twin prices the zero-wait TTFT floor (default: no floor)."),
    twin_variant: Optional[str] = typer.Option(None, "--twin-variant", help="Variant of --twin-model."),
    total_sessions: Optional[int] = typer.Option(
        None, "--total-sessions", help="Session instances in all (default: max(--sessions, files)); files cycle."),
    think_cap_s: float = typer.Option(60.0, "--think-cap-s", help="Longest think time between requests, s."),
    block_tokens: Optional[int] = typer.Option(
        None, "--block-tokens", help="Tokens per hash id (default: the trace's block_size); prompts scale with it."),
    max_input_tokens: Optional[int] = typer.Option(None, "--max-input-tokens", help="Cut longer prompts."),
    max_output_tokens: Optional[int] = typer.Option(None, "--max-output-tokens", help="Cap output tokens."),
    warmup_requests: int = typer.Option(0, "--warmup-requests", help="First N requests left out of the metrics."),
    ramp_up_s: float = typer.Option(
        0.0, "--ramp-up-s", min=0, help="--sessions: start the first sessions spread evenly over this many seconds."),
    cache_bust: bool = typer.Option(
        True, "--cache-bust/--no-cache-bust",
        help="Salt every block's text with a fresh run salt, so first turns miss whatever earlier runs cached."),
    salt: Optional[int] = typer.Option(None, "--salt", help="The run salt (0-255) instead of a random one."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N session files."),
    timeout: float = TIMEOUT,
    server_time_scale: Optional[float] = SERVER_TIME_SCALE,
    out: Optional[Path] = OUT,
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Closed-loop agentic sessions against an OpenAI endpoint (docs/agentic.md): the same driver as
    `zoe sim replay --sessions`, on the wall clock."""
    import random

    from zoe_cluster.agentic.cli import bench_agentic_cmd, twin_profile
    from zoe_cluster.agentic.options import SessionOptions

    run_salt = salt if salt is not None else (random.randrange(1, 256) if cache_bust else 0)
    opts = SessionOptions(sessions, total_sessions, think_cap_s, block_tokens, max_input_tokens, max_output_tokens,
                          warmup_requests, run_salt, limit, ramp_up_s)
    twin = twin_profile(twin_model, twin_variant) if twin_model else None
    bench_agentic_cmd(path, opts, url, model, engine_url, gpus, twin, timeout, server_time_scale, out, json_out)


@bench_app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Report A (the baseline)."),
    b: Path = typer.Argument(..., help="Report B."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG path (default: compare-<A>-<B>.png next to B)."),
    as_json: bool = typer.Option(False, "--json", help="Print the ratios as JSON instead of a table."),
) -> None:
    """B/A ratios of every matching cell of two reports of the same workload, plotted side by side."""
    from rich.table import Table

    from zoe_cluster.bench.compare import compare_reports
    from zoe_cluster.bench.plots import plot_comparison
    from zoe_cluster.bench.report import load_report

    ra, rb = _parse(load_report, str(a), "A"), _parse(load_report, str(b), "B")
    cells, unmatched = _parse(lambda _: compare_reports(ra, rb), "", "compare")
    if not cells:
        fail(f"{a} and {b} have no cell in common" + (f" (unmatched: {', '.join(unmatched)})" if unmatched else ""))
    plot = plot or b.with_name(f"compare-{a.stem}-{b.stem}.png")
    plot_comparison(ra, rb, cells, plot)
    if as_json:
        print_json({"a": str(a), "b": str(b), "cells": cells, "unmatched": unmatched, "plot": str(plot)})
        return
    table = Table("cell", "metric", f"A: {ra.label}", f"B: {rb.label}", "B/A", "speedup (B better > 1)")
    for c in cells:
        table.add_row(c["cell"], c["metric"], f"{c['a_mean']:.4g} ± {c['a_std'] or 0:.2g}",
                      f"{c['b_mean']:.4g} ± {c['b_std'] or 0:.2g}",
                      "-" if c["ratio"] is None else f"{c['ratio']:.3f}",
                      "-" if c["speedup"] is None else f"{c['speedup']:.2f}x")  # fmt: skip
    console.print(table)
    for u in unmatched:
        console.print(f"[yellow]unmatched:[/] {u}")
    console.print(f"plot: {plot}")


def register(app: typer.Typer) -> None:
    """Add `zoe bench ...` to the top-level app."""
    app.add_typer(bench_app, name="bench")


if __name__ == "__main__":  # pragma: no cover
    bench_app(sys.argv[1:])
