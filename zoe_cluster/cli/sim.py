"""`zoe sim serve|predict|replay|calibrate`: the simulated engine (a calibrated MI355X twin) from the command line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from zoe_cluster.cli.common import console, fail, print_json

if TYPE_CHECKING:
    from zoe_cluster.routing import Policy

sim_app = typer.Typer(
    help="The simulated engine: a calibrated MI355X twin that speaks the OpenAI API and vLLM's metrics.",
    no_args_is_help=True,
)


def _recipe_variant(model: str, variant: Optional[str]):  # type: ignore[no-untyped-def]
    from zoe_cluster.recipes import RecipeError, RecipeRegistry, UnknownModelError

    try:
        recipe = RecipeRegistry.default().get(model)
    except (UnknownModelError, RecipeError) as e:
        fail(str(e))
    name = variant or recipe.default_variant
    if name not in recipe.variants:
        fail(f"model '{model}' has no variant '{name}'; known: {', '.join(sorted(recipe.variants))}")
    return recipe, name


def _calibrate(recipe, variant):  # type: ignore[no-untyped-def]
    from zoe_cluster.sim.calibrate import CalibrationError, calibrate

    try:
        return calibrate(recipe, variant)
    except CalibrationError as e:
        fail(str(e))


def _measured_engine(path: Path, kv_tokens: Optional[int]):  # type: ignore[no-untyped-def]
    """(recipe, variant, calibration, kv_tokens) of a `zoe sim calibrate --url` profile; `kv_tokens` given on the
    command line overrides the measured capacity. A bad file exits naming the file and field."""
    from zoe_cluster.sim.calibrate import CalibrationError
    from zoe_cluster.sim.engine_calibration import MEASURED_VARIANT, load_engine_profile

    try:
        prof = load_engine_profile(path)  # its errors name the file and field
    except ValueError as e:
        fail(f"--profile: {e}")
    try:
        cal = prof.calibration()
    except CalibrationError as e:
        fail(f"--profile: {path}: {e}")
    return prof.recipe(), MEASURED_VARIANT, cal, kv_tokens if kv_tokens is not None else prof.scheduler.kv_tokens


@sim_app.command("serve")
def serve_cmd(
    model: str = typer.Option(..., "--model", help="Recipe name, e.g. glm-5.3."),
    variant: Optional[str] = typer.Option(None, "--variant", help="Recipe variant (default: the recipe's default)."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Model name clients send."),
    time_scale: float = typer.Option(1.0, "--time-scale", envvar="ZOE_SIM_TIME_SCALE",
                                     help="Real seconds per simulated second (0.01 = 100x faster)."),
    seed: int = typer.Option(0, "--seed", envvar="ZOE_SIM_SEED", help="Seed of generated text and random faults."),
    load_time: str = typer.Option(
        "fast", "--load-time", envvar="ZOE_SIM_LOAD_TIME",
        help="Simulated weights load: 'fast' (a few seconds) or 'real' (the recipe's profile.weights_load_s)."),
    startup_s: Optional[float] = typer.Option(None, "--startup-s", envvar="ZOE_SIM_STARTUP_S",
                                              help="Simulated start-up (weights load) seconds; overrides --load-time."),
    metrics_mode: str = typer.Option("vllm", "--metrics", envvar="ZOE_SIM_METRICS", help="vllm or sglang names."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len", envvar="ZOE_SIM_MAX_MODEL_LEN"),
    kv_tokens: Optional[int] = typer.Option(None, "--kv-tokens", envvar="ZOE_SIM_KV_TOKENS",
                                            help="KV capacity override, tokens."),
    host_kv_gb: float = typer.Option(
        0.0, "--host-kv-gb", envvar="ZOE_SIM_HOST_KV_GB",
        help="Host memory for a second KV tier, GB per replica (as vLLM's --kv-offloading-size); 0: HBM only."),
    crash_after: Optional[int] = typer.Option(None, "--crash-after", envvar="ZOE_SIM_CRASH_AFTER"),
    hang_after: Optional[int] = typer.Option(None, "--hang-after", envvar="ZOE_SIM_HANG_AFTER"),
    error_after: Optional[int] = typer.Option(None, "--error-after", envvar="ZOE_SIM_ERROR_AFTER"),
    error_rate: float = typer.Option(0.0, "--error-rate", envvar="ZOE_SIM_ERROR_RATE"),
    slowdown: float = typer.Option(1.0, "--slowdown", envvar="ZOE_SIM_SLOWDOWN"),
    fault_endpoint: bool = typer.Option(
        False, "--fault-endpoint", help="Serve POST /sim/faults (unauthenticated fault injection; tests only)."),
    log_level: str = typer.Option("warning", "--log-level"),
) -> None:
    """Serve one simulated replica: OpenAI API, /health, /metrics (vLLM V1 names, or SGLang's)."""
    from pydantic import ValidationError

    from zoe_cluster.sim.faults import FaultConfig

    if time_scale <= 0:
        fail(f"--time-scale must be positive, got {time_scale}")
    from zoe_cluster.sim.metrics import DIALECTS

    if metrics_mode not in DIALECTS:
        fail(f"--metrics must be one of {', '.join(map(repr, DIALECTS))}, got '{metrics_mode}'")
    if not 0 < port < 65536:
        fail(f"--port must be in 1..65535, got {port}")
    from zoe_cluster.sim.load_time import LOAD_TIMES

    if load_time not in LOAD_TIMES:
        fail(f"--load-time must be one of {', '.join(LOAD_TIMES)}, got '{load_time}'")
    if startup_s is not None and startup_s < 0:
        fail(f"--startup-s must be >= 0, got {startup_s}")
    if host_kv_gb < 0:
        fail(f"--host-kv-gb must be >= 0, got {host_kv_gb}")
    try:
        faults = FaultConfig(crash_after=crash_after, hang_after=hang_after, error_after=error_after,
                             error_rate=error_rate, slowdown=slowdown)
    except ValidationError as e:
        fail("bad fault option: " + "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
    recipe, name = _recipe_variant(model, variant)
    import uvicorn

    from zoe_cluster.sim.server import ServerConfig, SimServer

    config = ServerConfig(
        served_model_name=served_model_name or recipe.served_model_name, time_scale=time_scale, seed=seed,
        load_time=load_time, startup_s=startup_s, metrics_mode=metrics_mode,  # type: ignore[arg-type]
        max_model_len=max_model_len, kv_tokens=kv_tokens, host_kv_gb=host_kv_gb, faults=faults,
        fault_endpoint=fault_endpoint,
    )
    try:
        server = SimServer(recipe, name, config, _calibrate(recipe, name))
    except ValueError as e:
        fail(str(e))
    from zoe_cluster.router.http_server import hardened_http

    uvicorn.run(server.app, host=host, port=port, log_level=log_level, access_log=False,
                http=hardened_http(header_timeout_s=10.0, body_timeout_s=60.0))  # slow clients cannot hold it


@sim_app.command("predict")
def predict_cmd(
    model: str = typer.Option(..., "--model"),
    variant: Optional[str] = typer.Option(None, "--variant"),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Prompt tokens (TTFT prediction)."),
    hit_rate: float = typer.Option(0.0, "--hit-rate", help="Share of the prompt already cached, 0..1."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", help="Concurrent requests (decode)."),
    output_len: int = typer.Option(1024, "--output-len", help="Output tokens per request (decode)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Predict single-request TTFT (--input-len, --hit-rate) or decode tok/s (--concurrency, --output-len)."""
    from zoe_cluster.sim.predict import predict_decode, predict_ttft

    if (input_len is None) == (concurrency is None):
        fail("give either --input-len (TTFT) or --concurrency (decode throughput)")
    recipe, name = _recipe_variant(model, variant)
    cal = _calibrate(recipe, name)
    out: dict = {"model": recipe.name, "variant": name}
    if input_len is not None:
        if input_len <= 0:
            fail(f"--input-len must be positive, got {input_len}")
        if not 0 <= hit_rate < 1:
            fail(f"--hit-rate must be in [0, 1), got {hit_rate}")
        if input_len > recipe.architecture.max_context_tokens:
            fail(f"--input-len {input_len} exceeds the model's context of {recipe.architecture.max_context_tokens} tokens")
        p = predict_ttft(recipe, name, input_len, hit_rate, cal)
        out.update(input_len=input_len, hit_rate=hit_rate, cached_tokens=p.cached_tokens, ttft_s=round(p.ttft_s, 4))
    else:
        assert concurrency is not None
        if concurrency <= 0 or output_len <= 1:
            fail("--concurrency must be positive and --output-len at least 2")
        d = predict_decode(recipe, name, concurrency, output_len, calibration=cal)
        out.update(concurrency=concurrency, output_len=output_len,
                   decode_tok_s_per_node=round(d.decode_tok_s_per_node, 2),
                   decode_tok_s_per_user=round(d.decode_tok_s_per_user, 2), ttft_s=round(d.ttft_s_mean, 4),
                   preemptions=d.preemptions)
    out["calibration"] = {"sources": cal.sources, "estimates": cal.estimates}
    if json_out:
        return print_json(out)
    for k, val in out.items():
        if k != "calibration":
            console.print(f"[bold]{k}[/]: {val}")
    for k, val in cal.sources.items():
        console.print(f"[dim]{k}: {val}[/]")


@sim_app.command("calibrate")
def calibrate_cmd(
    model: Optional[str] = typer.Option(None, "--model", help="Recipe name; with --url, the served model name."),
    variant: Optional[str] = typer.Option(None, "--variant"),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    url: Optional[str] = typer.Option(None, "--url", help="Measure this OpenAI-compatible engine instead of a recipe."),
    out: Optional[Path] = typer.Option(None, "--out", help="With --url: the profile YAML to write."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="With --url: PNG of the fit against the measurements."),
    max_num_batched_tokens: int = typer.Option(
        8192, "--max-num-batched-tokens", min=1, help="The engine's step token budget (not observable: say it)."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1, help="The engine's batch limit (not observable)."),
    kv_tokens: Optional[int] = typer.Option(None, "--kv-tokens", min=1,
                                            help="KV capacity, tokens, for an engine whose /metrics does not say."),
    lengths: str = typer.Option("128,256,512,1024,1536", "--lengths", help="Prefill input lengths, tokens."),
    hit_rates: str = typer.Option("0,0.5,0.9", "--hit-rates", help="Prefill prefix hit rates."),
    concurrency: str = typer.Option("1,2,4,8,16,32", "--concurrency", help="Decode batch sizes."),
    output_len: int = typer.Option(256, "--output-len", min=2, help="Decode output tokens per stream."),
    runs: int = typer.Option(5, "--runs", min=1, help="Runs per prefill cell (decode: 3)."),
    passes: int = typer.Option(1, "--passes", min=1, help="With --url: measure the engine this many times, one "
                               "pass after another, and fit each cell's median (a drifting load moves it less)."),
    routed_experts: int = typer.Option(1, "--routed-experts", min=1, help="E of the model (1: dense)."),
    experts_per_token: int = typer.Option(1, "--experts-per-token", min=1, help="Top-k of the model."),
) -> None:
    """Show the fitted step model of a recipe variant; or, with --url, measure a live engine and write a profile."""
    if url is not None:
        return _calibrate_live(url, model, out, plot, json_out, max_num_batched_tokens, max_num_seqs, kv_tokens,
                               lengths, hit_rates, concurrency, output_len, runs, routed_experts, experts_per_token,
                               passes)
    if model is None:
        fail("give --model (a recipe), or --url to measure a live engine")
    recipe, name = _recipe_variant(model, variant)
    cal = _calibrate(recipe, name)
    if json_out:
        return print_json({"model": recipe.name, "variant": name, **cal.to_dict()})
    for k, val in cal.to_dict().items():
        console.print(f"[bold]{k}[/]: {val}")


def _numbers(text: str, option: str, kind: type) -> list:  # type: ignore[type-arg]
    try:
        vals = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{option} must be comma-separated numbers, got '{text}'")
    if not vals:
        fail(f"{option} is empty")
    return vals


def _calibrate_live(url, model, out, plot, json_out, mnbt, mns, kv_tokens, lengths, hit_rates, concurrency,  # type: ignore[no-untyped-def]
                    output_len, runs, routed_experts, experts_per_token, passes=1) -> None:
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from zoe_cluster.sim.calibration_passes import run_calibration_passes
    from zoe_cluster.sim.engine_calibration import (
        EngineCalibrationError,
        IncompleteCalibration,
        SweepPlan,
        write_engine_profile,
    )

    if out is None:
        fail("--url needs --out PROFILE.yaml")
    rates = _numbers(hit_rates, "--hit-rates", float)
    if any(not 0 <= h < 1 for h in rates):
        fail(f"--hit-rates must be in [0, 1), got {hit_rates}")
    plan = SweepPlan(lengths=_numbers(lengths, "--lengths", int), hit_rates=rates, prefill_runs=runs,
                     concurrency=_numbers(concurrency, "--concurrency", int), decode_output_len=output_len)
    if min(plan.lengths) <= 0 or min(plan.concurrency) <= 0:
        fail("--lengths and --concurrency must be positive")
    partial = out.with_name(out.name + ".partial")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=json_out) as prog:
        current: list = []

        def on_phase(name: str, total: int) -> None:
            if current:
                prog.update(current[-1], completed=prog.tasks[-1].total)
            current.append(prog.add_task(name, total=total))

        def on_request(_tag: str) -> None:
            if current:
                prog.advance(current[-1])

        try:
            prof = asyncio.run(run_calibration_passes(
                url, model, plan, passes, max_num_batched_tokens=mnbt, max_num_seqs=mns, kv_tokens=kv_tokens,
                routed_experts=routed_experts, experts_per_token=experts_per_token, on_request=on_request,
                on_phase=on_phase))  # fmt: skip
        except IncompleteCalibration as e:
            write_engine_profile(e.partial, partial)
            fail(f"{e} (measurements kept in {partial}, marked complete: false; {out} not written)")
        except EngineCalibrationError as e:
            fail(f"calibration of {url} failed: {e} ({out} not written)")
    write_engine_profile(prof, out)
    partial.unlink(missing_ok=True)
    if plot is not None:
        from zoe_cluster.sim.calibrate_plot import plot_fit

        plot_fit(prof, prof.calibration(), plot)
    if json_out:
        return print_json(prof.model_dump(mode="json"))
    console.print(f"[bold]wrote[/] {out} ({prof.engine} {prof.engine_version}, {prof.wall_s:.0f} s)")
    s = prof.scheduler
    console.print(f"[bold]kv cache[/]: {s.kv_tokens:,} tokens in blocks of {s.block_tokens}")
    console.print(f"[bold]step model[/]: {prof.step_model}")
    console.print(f"[bold]fit error %[/]: { {k: round(v, 1) for k, v in prof.fit_error_pct.items()} }")


@sim_app.command("replay")
def replay_cmd(
    trace: Path = typer.Argument(..., help="Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids), "
                                           "or with --sessions a session file or directory (docs/agentic.md)."),
    model: Optional[str] = typer.Option(None, "--model", help="Recipe name (or --profile)."),
    variant: Optional[str] = typer.Option(None, "--variant"),
    profile: Optional[Path] = typer.Option(
        None, "--profile", help="Engine profile written by `zoe sim calibrate --url` (instead of --model): replicas of "
                                "the measured engine, its step model, KV capacity and scheduler limits."),
    replicas: int = typer.Option(1, "--replicas", help="Simulated replicas behind the router."),
    policy: str = typer.Option("prefix", "--policy", help="Routing policy (zoe_cluster.routing registry)."),
    routers: int = typer.Option(
        1, "--routers", min=1,
        help="Router instances in front of the replicas, each with its own policy state; they share the replicas' "
             "load (docs/router.md, Several routers)."),
    router_front: str = typer.Option(
        "random", "--router-front",
        help="With --routers > 1, what hands a request to a router: random (a plain Kubernetes Service) or affinity "
             "(a consistent hash of the session key, else of the leading prompt blocks)."),
    router_affinity_blocks: int = typer.Option(
        1, "--router-affinity-blocks", min=1,
        help="--router-front affinity, requests without a session key: leading prompt blocks the key covers."),
    router_share_s: Optional[float] = typer.Option(
        None, "--router-share-s",
        help="With --routers > 1: every this many seconds of the replay's clock each router takes the prefix-index "
             "chains its peers inserted and the sessions they routed, as `zoe router --picture-share-s` (default: the "
             "routers share nothing)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N requests (with --sessions: files)."),
    kv_tokens: Optional[int] = typer.Option(None, "--kv-tokens", help="KV capacity per replica override, tokens."),
    host_kv_gb: float = typer.Option(
        0.0, "--host-kv-gb", min=0.0,
        help="Host memory per replica for a second KV tier (KV offloading), GB; 0: none (docs/router.md).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    sessions: Optional[int] = typer.Option(
        None, "--sessions", help="Closed loop: agentic sessions live at once (a finished one is replaced)."),
    total_sessions: Optional[int] = typer.Option(
        None, "--total-sessions", help="Session instances in all (default: max(--sessions, files)); files cycle."),
    think_cap_s: float = typer.Option(60.0, "--think-cap-s", help="Longest think time between requests, s."),
    block_tokens: Optional[int] = typer.Option(
        None, "--block-tokens", min=1,
        help="Tokens per hash id. A trace: default 512 (Mooncake's). --sessions: default the files' block_size, and "
             "prompts scale with it (a profile's block size scales them to its engine)."),
    max_input_tokens: Optional[int] = typer.Option(
        None, "--max-input-tokens", help="Cut longer prompts to this many tokens (default: the model's context)."),
    max_output_tokens: Optional[int] = typer.Option(None, "--max-output-tokens", help="Cap output tokens."),
    warmup_requests: int = typer.Option(0, "--warmup-requests", help="First N requests left out of the metrics."),
    ramp_up_s: float = typer.Option(
        0.0, "--ramp-up-s", min=0, help="--sessions: start the first sessions spread evenly over this many seconds."),
    slow_factor: Optional[float] = typer.Option(
        None, "--slow-factor",
        help="--sessions: the router's slow-replica ejection around the policy, as `zoe router` runs it at this "
             "slow_factor (a replica whose median time per output token exceeds this many times its peers' gets no "
             "new requests until a probe shows it recovered); default off."),
    slow_min_samples: Optional[int] = typer.Option(
        None, "--slow-min-samples", help="With --slow-factor: the router's slow_min_samples (default: the router's)."),
    slow_probe_s: Optional[float] = typer.Option(
        None, "--slow-probe-s", help="With --slow-factor: the router's slow_probe_s (default: the router's)."),
) -> None:
    """Replay a trace on N simulated replicas behind the router's real policy code, on the virtual clock: a
    Mooncake trace open-loop, or agentic sessions closed-loop (--sessions)."""
    from zoe_cluster.routing import policy_names
    from zoe_cluster.routing.hashing import MOONCAKE_BLOCK_TOKENS
    from zoe_cluster.sim.replay import RowSource, SimReplayConfig, TraceError, load_mooncake, replay

    if replicas <= 0:
        fail(f"--replicas must be positive, got {replicas}")
    if policy not in policy_names():
        fail(f"unknown policy '{policy}'; known: {', '.join(policy_names())}")
    routing: str | Callable[[], Policy] = policy
    if routers > 1:  # N routers with their own state (routing.router_fleet), built directly: never registered
        from zoe_cluster.routing import PolicyConfigError
        from zoe_cluster.routing.router_fleet import fleet_factory

        try:
            routing = fleet_factory(routers, router_front, policy, affinity_blocks=router_affinity_blocks,
                                    share_every_s=router_share_s)
        except PolicyConfigError as e:
            fail(f"--routers/--router-front: {e}")
    if limit is not None and limit <= 0:
        fail(f"--limit must be positive, got {limit}")
    if slow_factor is None and (slow_min_samples is not None or slow_probe_s is not None):
        fail("--slow-min-samples and --slow-probe-s go with --slow-factor")
    if slow_factor is not None:
        if sessions is None:
            fail("--slow-factor replays the router's slow-replica ejection of agentic sessions: give --sessions")
        from pydantic import ValidationError

        from zoe_cluster.router.config import RouterConfig

        fields = {"slow_factor": slow_factor, "slow_min_samples": slow_min_samples, "slow_probe_s": slow_probe_s}
        try:  # the router's own bounds on the three fields
            RouterConfig.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as e:
            fail("; ".join(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}" for err in e.errors()))
    if profile is not None:
        if model is not None or variant is not None:
            fail("--profile is the engine to replay on: leave out --model and --variant")
        recipe, name, cal, kv_tokens = _measured_engine(profile, kv_tokens)
    elif model is None:
        fail("give --model (a recipe) or --profile (a measured engine)")
    else:
        recipe, name = _recipe_variant(model, variant)
        cal = _calibrate(recipe, name)
    if sessions is not None:
        from zoe_cluster.agentic.cli import replay_sessions_cmd
        from zoe_cluster.agentic.options import SessionOptions

        opts = SessionOptions(sessions, total_sessions, think_cap_s, block_tokens,
                              max_input_tokens or recipe.architecture.max_context_tokens, max_output_tokens,
                              warmup_requests, limit_files=limit, ramp_up_s=ramp_up_s)
        return replay_sessions_cmd(trace, opts, recipe, name, cal, replicas, routing, kv_tokens, host_kv_gb, json_out,
                                   (slow_factor, slow_min_samples, slow_probe_s))
    try:
        rows = load_mooncake(trace, limit)
    except TraceError as e:
        fail(str(e))
    if not rows:
        fail(f"{trace}: no requests")
    source = RowSource(rows, block_tokens or MOONCAKE_BLOCK_TOKENS)
    config = SimReplayConfig(recipe, name, replicas, routing, calibration=cal, kv_tokens=kv_tokens,
                             host_kv_gb=host_kv_gb)
    if json_out:
        res = replay(config, source)
        return print_json(res.to_dict())
    from rich.progress import Progress

    with Progress(console=console, transient=True) as prog:
        task = prog.add_task(f"replaying {len(rows):,} requests", total=len(rows))
        res = replay(config, source, progress=lambda n: prog.update(task, completed=n))
    d = res.to_dict()
    for k in ("requests", "completed", "dropped", "prefix_hit_rate", "host_hit_rate", "ttft_p50_s", "ttft_p90_s",
              "ttft_p99_s", "tpot_p50_s", "output_tok_s", "simulated_s", "preemptions", "wall_s", "routing_reasons"):
        v = d[k]
        console.print(f"[bold]{k}[/]: {round(v, 4) if isinstance(v, float) else v}")


def register(app: typer.Typer) -> None:
    """Add `zoe sim ...` to the top-level app."""
    app.add_typer(sim_app, name="sim")
