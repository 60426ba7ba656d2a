"""`zoe deploy | status | scale | switch | logs | undeploy`: run a model as Ray actor gangs behind the router.

Every command finds the deployment by asking Ray for its controller (a detached named actor); nothing about a
deployment is kept in local files. With no cluster to join, `zoe deploy` starts a local Ray (fake GPUs when
the machine has none, enough for `--engine sim`); on a cluster without real GPUs it serves on the simulated engine
unless `--engine` says otherwise.
"""

from __future__ import annotations

import shlex
import time
from typing import Optional

import typer

from zoe_cluster.cli.common import EXIT_RUNTIME, console, fail, parse_service_classes, print_json
from zoe_cluster.config_errors import validation_problems
from zoe_cluster.engines import ENGINE_NAMES, get_adapter, simulated_engine

SIM_DEFAULT_REPLICAS = 2
"""Replicas `zoe deploy` starts on the simulated engine when none are asked for: two, so the router has a choice."""


def _connect(address: Optional[str], start_local: bool = False, num_gpus: Optional[int] = None) -> str:
    from zoe_cluster.cluster.bootstrap import NoCluster, connect

    try:
        return connect(address, start_local=start_local, num_gpus=num_gpus)
    except NoCluster as e:
        fail(str(e), code=EXIT_RUNTIME)


def _controller(name: str):
    from zoe_cluster.cluster.client import NoDeployment, get_controller

    try:
        return get_controller(name)
    except NoDeployment as e:
        fail(str(e), code=EXIT_RUNTIME)


def _call(ref, timeout_s: float = 600):
    import ray

    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        fail(f"the controller did not answer in {timeout_s:.0f}s", code=EXIT_RUNTIME)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if getattr(e, "cause", None) is not None else e
        fail(str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__, code=EXIT_RUNTIME)


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            fail(f"--env expects KEY=VALUE, got {item!r}")
        env[k] = v
    return env


def _parse_image_resources(items: list[str]) -> dict[str, str]:
    """`--image-resource IMAGE=BASE` items -> {BASE: IMAGE} (recipe image -> the worker image built FROM it)."""
    images: dict[str, str] = {}
    for item in items:
        name, sep, base = item.partition("=")
        if not sep or not name or not base:
            fail(f"--image-resource expects IMAGE=BASE (e.g. zoe-vllm-rocm=vllm/vllm-openai-rocm:v0.29.0), got {item!r}")
        if images.get(base, name) != name:
            fail(f"--image-resource: {base} is the base of both {images[base]} and {name}; a variant's image must "
                 "name one worker image")
        images[base] = name
    return images


def _fmt_age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


_STATE_STYLE = {"ready": "green", "loading": "yellow", "starting": "yellow", "pending": "yellow",
                "draining": "cyan", "stopped": "dim", "failed": "red"}


def render_status(st: dict) -> None:
    from rich.table import Table

    head = (f"[bold]{st['deployment']}[/] model {st['model']} engine {st['engine']} variant {st['variant']}  "
            f"ready {st['replicas_ready']}/{st['replicas_desired']}")
    console.print(head, highlight=False)
    if st.get("endpoint"):
        console.print(f"endpoint {st['endpoint']}  (model name '{st['served_model_name']}')", highlight=False)
    if st.get("router_error"):
        console.print(f"[red]router: {st['router_error']}[/]")
    t = Table(box=None, pad_edge=False)
    # pid: the engine process (`kill PID` ends it; the controller heals the replica); group: its process group
    # (engine, its children and the process supervisor; `kill -- -GROUP` ends them all)
    for col in ("replica", "id", "state", "since", "variant", "nodes", "GPUs", "pid", "group", "uptime", "restarts",
                "kernels", "url", "last event"):
        t.add_column(col)
    now = st["now"]
    for r in st["replicas"]:
        ev = r["events"][-1] if r["events"] else None
        last = f"{ev['what']} {ev['detail']}".strip() if ev else ""
        if r.get("failure") and r["state"] == "failed":
            last = r["failure"]
        gpus = " ".join(",".join(str(g) for g in ids) for ids in r["gpu_ids"]) or "-"
        style = _STATE_STYLE.get(r["state"], "")
        # what the engine's zoe plugin reports running (its /metrics), not what the recipe asks for
        kernels = "?" if r.get("kernels_active") is None else (",".join(r["kernels_active"]) or "none")
        pids = " ".join(str(p) for p in r.get("pids", [])) or "-"
        groups = " ".join(str(g) for g in r.get("process_groups", [])) or "-"
        t.add_row(str(r["index"]), r["id"], f"[{style}]{r['state']}[/]", _fmt_age(now - r["state_since"]),
                  r["variant"], " ".join(r["nodes"]) or "-", gpus, pids, groups,
                  _fmt_age(r["uptime_s"]) if r["uptime_s"] else "-",
                  str(r["restarts"]), kernels, r["url"] or "-", last[:60])
    console.print(t)
    sw = st.get("switching")
    if sw:
        console.print(f"switching: {sw['swaps_started']} swap(s) started; candidates "
                      f"{', '.join(sw['config']['candidates']) or 'all non-speculative variants'}", highlight=False)
        for d in sw["latest"]:
            console.print(f"  replica {d['replica']}: concurrency {d['concurrency']:.1f}, {d['action']}: {d['reason']}",
                          highlight=False)
        for d in sw["recent_swaps"][-3:]:
            console.print(f"  swap at {_fmt_age(now - d['at'])} ago: replica {d['replica']} -> {d['variant']}",
                          highlight=False)


def _wait_with_progress(handle, want: int, timeout_s: float, label: str, give_up_after: int = 3,
                        expected_load_s: dict[str, float] | None = None) -> dict:
    """Poll the controller, showing each replica's state, until `want` replicas are ready; returns the status.

    Returns early when no replica is ready and one has failed `give_up_after` times (a bad flag, a missing
    binary: waiting longer will not help; the controller keeps retrying with backoff)."""
    import ray
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    order = ["pending", "starting", "loading", "ready"]
    expected_load_s = expected_load_s or {}
    deadline = time.monotonic() + timeout_s
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[state]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        tasks: dict[int, int] = {}
        while True:
            st = ray.get(handle.status.remote(), timeout=60)
            for r in st["replicas"]:
                i = r["index"]
                if i not in tasks:
                    tasks[i] = progress.add_task(f"{label} replica {i}", total=len(order) - 1, state="")
                step = order.index(r["state"]) if r["state"] in order else 0
                detail = r["state"]
                if r["state"] == "loading":
                    waited = st["now"] - r["state_since"]
                    expected = expected_load_s.get(r["variant"])
                    detail += f" {waited:.0f}s" + (f" of ~{expected:.0f}s" if expected else "")
                    if expected:  # the bar moves through loading as the profile's load time passes
                        step = order.index("loading") + min(0.95, waited / expected)
                if r["state"] == "failed":
                    detail = f"failed: {(r.get('failure') or '')[:60]}; restarting"
                progress.update(tasks[i], completed=step, state=detail)
            if st["replicas_ready"] >= want and len(st["replicas"]) >= want:
                return st
            if time.monotonic() > deadline:
                return st
            stuck = [r for r in st["replicas"] if r["restarts"] >= give_up_after and r["state"] != "ready"]
            if stuck and not st["replicas_ready"]:
                return st
            time.sleep(0.5)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the top-level app."""

    @app.command("deploy")
    def deploy_cmd(
        model: str = typer.Argument(..., help="Model name (a recipe in recipes/), e.g. glm-5.3."),
        variant: Optional[str] = typer.Option(None, help="Recipe variant (default: the recipe's default)."),
        concurrency: Optional[int] = typer.Option(
            None, help="Expected concurrent requests: the planner picks the variant and replica count."),
        replicas: Optional[int] = typer.Option(
            None, min=0, help=f"Replica count (default: the plan's; else 1, or {SIM_DEFAULT_REPLICAS} on the simulated "
            "engine where the cluster's GPUs hold them)."),
        engine: Optional[str] = typer.Option(
            None, help=f"{', '.join(ENGINE_NAMES)} ({simulated_engine()} is simulated; needs no GPUs). Default: the "
            f"variant's engine, or {simulated_engine()} when "
            "the Ray cluster has no GPUs."),
        address: Optional[str] = typer.Option(
            None, help="Ray cluster to join (else $RAY_ADDRESS, a running local one, or a new local one)."),
        port: int = typer.Option(8000, help="Port of the OpenAI endpoint (the router)."),
        host: Optional[str] = typer.Option(
            None, help="Router bind address (default 0.0.0.0 on a cluster, 127.0.0.1 on a local Ray)."),
        name: Optional[str] = typer.Option(None, help="Deployment name (default: the model name)."),
        policy: Optional[str] = typer.Option(None, help="Routing policy (router default if unset)."),
        kv_events: bool = typer.Option(
            False, "--kv-events", help="Precise routing: engines publish their KV-cache events and every router "
            "subscribes to them (vLLM, SGLang; docs/router.md).",
        ),
        model_path: Optional[str] = typer.Option(None, help="Local checkpoint instead of the recipe's weights."),
        max_model_len: Optional[int] = typer.Option(None, help="Context limit passed to the engine, tokens."),
        launcher: Optional[str] = typer.Option(
            None, help="Command that starts the engine, e.g. '/opt/venv/bin/vllm' (default: the engine's own)."),
        engine_arg: list[str] = typer.Option([], "--engine-arg", help="Extra engine flag (repeatable)."),
        env: list[str] = typer.Option([], "--env", help="Extra engine environment KEY=VALUE (repeatable)."),
        sim_load_time: str = typer.Option(
            "fast", "--sim-load-time", help="The simulated engine's weights load: 'fast' (a few seconds) or 'real' "
            "(as long as the recipe estimates for the real engine, minutes)."),
        host_kv_gb: float = typer.Option(
            0.0, "--host-kv-gb", help="Host memory for a second KV tier, GB per replica (vLLM's CPU offloading, "
            "SGLang's HiCache, the simulated engine's host tier); 0: HBM only."),
        load_timeout: float = typer.Option(1800, help="Seconds a replica may take to load before it is restarted."),
        num_gpus: Optional[int] = typer.Option(
            None, help="GPUs a new local Ray declares (default: the machine's, or 16 fake ones without GPUs)."),
        wait: bool = typer.Option(True, help="Wait for the replicas to be ready (with progress)."),
        timeout: float = typer.Option(3600, help="Seconds to wait for readiness."),
        json_out: bool = typer.Option(False, "--json", help="Print the final status as JSON."),
        switch: Optional[str] = typer.Option(
            None, "--switch", help="Let the controller switch recipes by concurrency among these variants "
            "(comma-separated; 'auto' = every non-speculative variant of the engine whose kernels can activate on its "
            "image)."),
        switch_dwell: float = typer.Option(1800, help="Least seconds between two swaps of one replica."),
        switch_class: list[str] = typer.Option(
            [], "--switch-class", help="Service class NAME:TTFT_S:ITL_S, tightest first (repeatable), e.g. "
            "interactive:1:0.020 standard:2:0.030; requests name theirs in the x-zoe-slo header. With classes the "
            "router runs the class-aware 'slo' policy and the switcher targets a mix of variants."),
        metrics_port: Optional[int] = typer.Option(
            None, help="Serve the controller's switching metrics on this port (0: a free one)."),
        image_resource: list[str] = typer.Option(
            [], "--image-resource", help="IMAGE=BASE (repeatable): the cluster's nodes running worker image IMAGE, "
            "built FROM the engine image BASE (a recipe variant's `image`), advertise the Ray resource zoe-image/IMAGE "
            "(the Helm chart's worker groups do, and its RayJob passes one per group). Each replica then runs only on "
            "nodes of its variant's image, and the planner and `--switch auto` choose among the variants these "
            "images run."),
    ) -> None:
        """Deploy MODEL as Ray actor gangs behind the router; prints the OpenAI endpoint when ready."""
        from pydantic import ValidationError

        from zoe_cluster.cluster.client import DeploymentExists, create_deployment
        from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec, HealthConfig
        from zoe_cluster.recipes.loader import RecipeError, RecipeRegistry, UnknownModelError
        from zoe_cluster.switching import SwitchConfig

        from zoe_cluster.sim.load_time import LOAD_TIMES

        if engine is not None and engine not in ENGINE_NAMES:
            fail(f"--engine must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}")
        if sim_load_time not in LOAD_TIMES:
            fail(f"--sim-load-time must be one of {', '.join(LOAD_TIMES)}, got {sim_load_time!r}")
        if variant and concurrency is not None:
            fail("give either --variant or --concurrency, not both")
        worker_images = _parse_image_resources(image_resource)
        try:
            recipe = RecipeRegistry.default().get(model)
        except (UnknownModelError, RecipeError) as e:
            fail(str(e))
        chosen = variant or recipe.default_variant
        runnable = [n for n, v in recipe.variants.items() if not worker_images or v.image in worker_images]
        if concurrency is not None:
            from zoe_cluster.planner import Demand, NoFeasibleVariant, plan

            if not runnable:
                fail(f"no variant of {model} runs in the worker images --image-resource names")
            candidates = recipe.model_copy(update={"variants": {n: recipe.variants[n] for n in runnable}})
            try:
                p = plan(candidates, Demand(concurrency=concurrency))
            except (NoFeasibleVariant, ValueError) as e:
                fail(str(e))
            chosen = p.variant
            replicas = p.replicas if replicas is None else replicas
            console.print(f"plan: {p.reason}", highlight=False)
        if chosen not in recipe.variants:
            fail(f"model {model} has no variant '{chosen}'; known: {', '.join(sorted(recipe.variants))}")
        if concurrency is None:  # a named or default variant, not the planner's: say when its kernels cannot run
            from zoe_cluster.kernel_support import KernelSupport

            v = recipe.variants[chosen]
            if blocked := KernelSupport.load().blockers(list(v.kernels), v.engine, v.image):
                console.print(f"[yellow]warning[/]: {chosen}: {blocked}; the engine serves on its own kernels, not "
                              "the ones its profile measured", highlight=False)
        engine_env = _parse_env(env)
        if host_kv_gb < 0:
            fail(f"--host-kv-gb must be >= 0, got {host_kv_gb}")
        classes = parse_service_classes(switch_class, "--switch-class")
        if classes and switch is None:
            fail("--switch-class needs --switch (the variants the mix is made of)")
        switch_candidates = [c.strip() for c in (switch or "").split(",") if c.strip() and switch != "auto"]
        if switch == "auto":  # among the variants the worker images run and whose kernels activate on their image
            from zoe_cluster.kernel_support import KernelSupport
            from zoe_cluster.switching import candidate_variants

            blocked = KernelSupport.load().blocked_variants(recipe)
            switch_candidates = [n for n in candidate_variants(recipe, chosen, SwitchConfig(), blocked)
                                 if n in runnable]  # fmt: skip
            for n in candidate_variants(recipe, chosen, SwitchConfig()):
                if n in blocked:
                    console.print(f"--switch auto leaves out {n}: {blocked[n]}", highlight=False)
            if not switch_candidates:
                fail(f"--switch auto: no variant of {model} can run here (see above)")
        gcs = _connect(address, start_local=True, num_gpus=num_gpus)
        local = gcs.startswith("127.0.0.1:")
        if engine is None:
            engine = recipe.variants[chosen].engine
            if not _cluster_has_gpus(local):
                console.print(f"no GPUs in the Ray cluster at {gcs}: serving on the simulated engine (pass "
                              f"--engine {engine} to wait for GPU nodes instead)", highlight=False)
                engine = simulated_engine()
        simulated = get_adapter(engine).is_simulated
        if replicas is None and simulated:
            replicas = _sim_replicas(recipe.variants[chosen].parallelism.gpus)
        if simulated:
            engine_env.setdefault("ZOE_SIM_LOAD_TIME", sim_load_time)
        try:
            spec = DeploymentSpec(
                name=name or recipe.name, recipe=recipe, variant=chosen,
                replicas=1 if replicas is None else replicas, engine=engine, model_path=model_path,
                max_model_len=max_model_len, launcher=shlex.split(launcher) if launcher else None,
                engine_args=list(engine_arg), engine_env=engine_env, host_kv_gb=host_kv_gb,
                health=HealthConfig(load_timeout_s=load_timeout),
                router=DeploymentRouter(host=host or ("127.0.0.1" if local else "0.0.0.0"), port=port, policy=policy,
                                        kv_events=kv_events),
                switching=None if switch is None else SwitchConfig(
                    candidates=switch_candidates, dwell_s=switch_dwell, classes=classes),
                metrics_port=metrics_port, worker_images=worker_images,
            )
        except ValidationError as e:
            fail(validation_problems(e))
        console.print(f"deploying {spec.name}: {spec.replicas} x {chosen} on {engine} (Ray {gcs})", highlight=False)
        load = recipe.variants[chosen].profile.weights_load_s
        if simulated and load and engine_env["ZOE_SIM_LOAD_TIME"] == "real":
            console.print(f"the simulated engine loads for {load.value:.0f} s like the real one ({load.source})",
                          highlight=False)
        try:
            handle = create_deployment(spec, gcs)
        except DeploymentExists as e:
            fail(str(e), code=EXIT_RUNTIME)
        except ValueError as e:
            fail(str(e))
        except Exception as e:  # noqa: BLE001 - the controller could not start (router port taken, ...)
            fail(f"the deployment's controller did not start: {_root_cause(e)}", code=EXIT_RUNTIME)
        if not wait:
            st = _call(handle.status.remote())
        else:
            st = _wait_with_progress(handle, spec.replicas, timeout, spec.name,
                                     expected_load_s=_expected_load(recipe, engine_env if simulated else {}))
        if json_out:
            print_json(st)
        else:
            render_status(st)
        if st["replicas_ready"] < spec.replicas and wait:
            failures = sorted({h["failure"] for h in st["history"] if h.get("failure")})
            why = f"; last failures: {'; '.join(failures[-3:])}" if failures else ""
            fail(f"{st['replicas_ready']}/{spec.replicas} replicas ready{why} (the controller keeps retrying; see "
                 f"`zoe logs {spec.name}`, or `zoe undeploy {spec.name}`)", code=EXIT_RUNTIME)
        if st.get("endpoint"):
            console.print(f"[bold green]OpenAI endpoint:[/] {st['endpoint']}  model '{st['served_model_name']}'",
                          highlight=False)

    @app.command("status")
    def status_cmd(
        model: Optional[str] = typer.Argument(None, help="Deployment name (default: all deployments)."),
        address: Optional[str] = typer.Option(None, help="Ray cluster (else $RAY_ADDRESS or the local one)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Replicas of each deployment: state, variant, nodes, GPUs, uptime, restarts."""
        from zoe_cluster.cluster.client import list_deployments

        _connect(address)
        names = [model] if model else list_deployments()
        statuses = [_call(_controller(n).status.remote(), 60) for n in names]
        if json_out:
            print_json(statuses[0] if model else statuses)
            return
        if not statuses:
            console.print("no deployments")
        for st in statuses:
            render_status(st)

    @app.command("scale")
    def scale_cmd(
        model: str = typer.Argument(..., help="Deployment name."),
        replicas: int = typer.Argument(..., min=0, help="Replica count to keep running."),
        address: Optional[str] = typer.Option(None, help="Ray cluster."),
        wait: bool = typer.Option(True, help="Wait until the new count is ready."),
        timeout: float = typer.Option(3600, help="Seconds to wait."),
    ) -> None:
        """Change the replica count (new replicas start; extra ones drain, then stop)."""
        _connect(address)
        handle = _controller(model)
        st = _call(handle.scale.remote(replicas))
        if wait and replicas:
            st = _wait_with_progress(handle, replicas, timeout, model)
        render_status(st)

    @app.command("switch")
    def switch_cmd(
        model: str = typer.Argument(..., help="Deployment name."),
        variant: str = typer.Argument(..., help="Variant to roll the replicas to."),
        replica: Optional[int] = typer.Option(None, help="Only this replica index (default: all, one at a time)."),
        address: Optional[str] = typer.Option(None, help="Ray cluster."),
        timeout: float = typer.Option(3600, help="Seconds to wait."),
    ) -> None:
        """Manual override: roll replicas to VARIANT, one at a time, draining each first."""
        _connect(address)
        handle = _controller(model)
        st = _call(handle.switch.remote(variant, [replica] if replica is not None else None), timeout)
        render_status(st)

    @app.command("logs")
    def logs_cmd(
        model: str = typer.Argument(..., help="Deployment name."),
        replica: Optional[int] = typer.Option(None, help="Replica index (default: every replica)."),
        router: bool = typer.Option(False, "--router", help="The router's log instead of the engines'."),
        bytes_: int = typer.Option(20_000, "--bytes", help="How much of the end of each log to show."),
        address: Optional[str] = typer.Option(None, help="Ray cluster."),
    ) -> None:
        """The end of each replica's engine log (stdout and stderr of every node's process)."""
        import sys

        _connect(address)
        logs = _call(_controller(model).logs.remote(-1 if router else replica, bytes_), 60)
        for key, text in logs.items():
            if len(logs) > 1 or replica is None:
                console.rule(f"{model} {'router' if key == 'router' else 'replica ' + key}")
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")

    @app.command("undeploy")
    def undeploy_cmd(
        model: str = typer.Argument(..., help="Deployment name."),
        address: Optional[str] = typer.Option(None, help="Ray cluster."),
        force: bool = typer.Option(False, help="Skip draining: kill everything now."),
    ) -> None:
        """Drain and stop every replica and the router, free the GPUs, remove the controller."""
        from zoe_cluster.cluster.client import NoDeployment, remove_deployment

        _connect(address)
        try:
            remove_deployment(model, graceful=not force)
        except NoDeployment as e:
            fail(str(e), code=EXIT_RUNTIME)
        console.print(f"undeployed {model}")


def _expected_load(recipe, sim_env: dict[str, str]) -> dict[str, float]:
    """Seconds each variant is expected to load: profile.weights_load_s for a real engine (empty `sim_env`), or what
    the simulated engine takes with its settings (ZOE_SIM_LOAD_TIME, ZOE_SIM_STARTUP_S, ZOE_SIM_TIME_SCALE)."""
    from zoe_cluster.sim.load_time import load_s, real_load_s

    out = {}
    for name in recipe.variants:
        if real_load_s(recipe, name) is None:
            continue
        if "ZOE_SIM_STARTUP_S" in sim_env:
            secs = float(sim_env["ZOE_SIM_STARTUP_S"])
        else:
            secs = load_s(recipe, name, sim_env.get("ZOE_SIM_LOAD_TIME", "real"))  # type: ignore[arg-type]
        out[name] = secs * float(sim_env.get("ZOE_SIM_TIME_SCALE", 1.0))
    return out


def _cluster_has_gpus(local: bool) -> bool:
    """Whether the connected Ray cluster has real GPUs: Ray gives their nodes an `accelerator_type:<model>`
    resource (the fake GPUs a local cluster declares on a machine without any carry none); on a local cluster the
    machine's own device files count too."""
    import ray

    from zoe_cluster.cluster.bootstrap import detect_gpus

    if any(k.startswith("accelerator_type:") for k in ray.cluster_resources()):
        return True
    return local and detect_gpus() > 0


def _sim_replicas(gpus_per_replica: int) -> int:
    """SIM_DEFAULT_REPLICAS, or as many as the cluster's GPUs (fake ones included) hold, at least 1."""
    import ray

    fit = int(ray.cluster_resources().get("GPU", 0) // max(1, gpus_per_replica))
    return max(1, min(SIM_DEFAULT_REPLICAS, fit))


def _root_cause(e: BaseException) -> str:
    cause = getattr(e, "cause", None)
    text = str(cause if cause is not None else e).strip()
    return text.splitlines()[-1] if text else type(e).__name__
