"""`zoe router`: run the OpenAI-compatible prefix/context-aware router.

Standalone:   zoe router --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002 --policy prefix
In a deployment the controller owns the process (`python -m zoe_cluster.cli.main router --config-json ...`, the
admin key from ZOE_ROUTER_ADMIN_KEY) and pushes membership to PUT /admin/membership.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import typer

from zoe_cluster.cli.common import console, fail, parse_service_classes
from zoe_cluster.config_errors import validation_problems
from zoe_cluster.engines import ENGINE_NAMES
from zoe_cluster.engines.vllm import VllmAdapter


def _parse_kv(items: list[str]) -> dict:
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            fail(f"--policy-config expects key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _keys(values: list[str], env: str) -> list[str]:
    keys = list(values)
    keys += [k for k in os.environ.get(env, "").split(",") if k.strip()]
    return [k.strip() for k in keys]


def register(app: typer.Typer) -> None:
    """Add `zoe router` to the top-level app."""
    from zoe_cluster.routing import policy_names

    choices = policy_names()

    @app.command("router")
    def router_cmd(
        replica: list[str] = typer.Option([], "--replica", help="Replica base URL (repeatable); pool 'default'."),
        long_replica: list[str] = typer.Option(
            [], "--long-replica", help="Replica base URL for long prompts (pool 'long'; repeatable)."
        ),
        policy: str = typer.Option("prefix", "--policy", help=f"Routing policy: {', '.join(choices)}."),
        policy_config: list[str] = typer.Option(
            [], "--policy-config", help="Policy tunable key=value (repeatable), e.g. decode_weight=0.2."
        ),
        host: str = typer.Option("127.0.0.1", help="Address to bind (loopback unless told otherwise)."),
        port: int = typer.Option(8080, help="Port to listen on."),
        model: list[str] = typer.Option([], "--model", help="Served model name (repeatable); others get 404."),
        api_key: list[str] = typer.Option(
            [], "--api-key", help="Bearer key clients must send (repeatable; also ZOE_ROUTER_API_KEYS, comma-separated)."
        ),
        admin_key: Optional[str] = typer.Option(
            None, "--admin-key", envvar="ZOE_ROUTER_ADMIN_KEY", help="Bearer key of /admin (membership, drain)."
        ),
        max_context_tokens: Optional[int] = typer.Option(
            None, help="Reject prompts estimated longer than this (400 naming the limit)."
        ),
        kv_capacity_tokens: int = typer.Option(
            1_000_000, help="KV capacity of each --replica, tokens (sizes the prefix index)."
        ),
        host_kv_capacity_tokens: int = typer.Option(
            0, min=0, help="KV tokens each --replica also keeps in host memory (KV offloading); 0: none."
        ),
        max_active_requests: int = typer.Option(256, help="Requests per replica before it counts as saturated."),
        engine: str = typer.Option(
            VllmAdapter.name, help=f"Engine of the --replica URLs ({', '.join(ENGINE_NAMES)}): /metrics parser."
        ),
        kv_events_endpoint: Optional[str] = typer.Option(
            None, help="Precise mode for engines configured to connect their KV-event publisher to one router: bind "
            "this ZMQ endpoint (topic = replica id). Engines started by zoe (--kv-events) bind their own publishers, "
            "which every router subscribes to from membership, without this option."
        ),
        slo_class: list[str] = typer.Option(
            [], "--slo-class", help="Service class NAME:TTFT_S:ITL_S, tightest first (repeatable), as `zoe deploy "
            "--switch-class`: runs the `slo` filter around --policy with per-class limits derived from the "
            "--slo-model recipe's profiles of the --slo-variants (what the controller gives its own router).",
        ),
        slo_model: Optional[str] = typer.Option(None, "--slo-model", help="Recipe the --slo-class limits come from."),
        slo_variants: Optional[str] = typer.Option(
            None, "--slo-variants", help="Comma-separated variants the replicas run (`zoe deploy --switch`)."
        ),
        migration_limit: int = typer.Option(
            3, "--migration-limit", min=0,
            help="Continuations of a stream on other replicas after its replica fails mid-stream (0: the stream ends "
            "with an error event).",
        ),
        membership_file: Optional[str] = typer.Option(
            None, "--membership-file",
            help="Keep the last applied membership in this file and start from it (a restarted router serves its "
            "replicas before the controller's next push).",
        ),
        picture_peers: Optional[str] = typer.Option(
            None, "--picture-peers",
            help="Peer routers' base URLs, comma-separated (http://host:port; a headless Service name reaches every "
            "pod): at start without a picture file, their pictures (and membership, when none) are pulled with the "
            "admin key, for at most 3 s (--config-json '{\"picture_peer_timeout_s\": S}').",
        ),
        picture_share_s: float = typer.Option(
            0.0, "--picture-share-s", min=0,
            help="With --picture-peers: every this many seconds take the prefix-index chains each peer inserted and "
            "the sessions it routed since the last time, so routers behind a plain Service keep one approximate "
            "picture (0: only at start).",
        ),
        drain_delay_s: float = typer.Option(
            0.0, "--drain-delay-s", min=0,
            help="On SIGTERM, keep serving this long while /health answers 503 (load balancers take the router "
            "out), then stop accepting.",
        ),
        drain_timeout_s: float = typer.Option(
            60.0, "--drain-timeout-s", min=0.001,
            help="On SIGTERM, after the listener closes: longest wait for in-flight requests before exiting.",
        ),
        config_json: Optional[str] = typer.Option(
            None, "--config-json", help="RouterConfig fields as JSON, winning over the flags, e.g. "
            "'{\"max_retries\": 1}' (a deployment's controller passes its router's whole config this way)."
        ),
        log_level: str = typer.Option("warning", help="uvicorn log level."),
    ) -> None:
        """Run the router in the foreground until interrupted."""
        from pydantic import ValidationError

        from zoe_cluster.router.app import build_router, static_membership
        from zoe_cluster.router.config import RouterConfig
        from zoe_cluster.router.membership import MemberReplica, Membership
        from zoe_cluster.routing import PolicyConfigError

        policy, options = _slo_policy(policy, _parse_kv(policy_config), slo_class, slo_model, slo_variants)
        extra = {}
        if config_json:
            try:
                extra = json.loads(config_json)
            except ValueError as e:
                fail(f"--config-json is not valid JSON: {e}")
        try:
            flags = dict(
                host=host, port=port, policy=policy, policy_config=options, models=model,
                api_keys=_keys(api_key, "ZOE_ROUTER_API_KEYS"), admin_key=admin_key or None,
                max_context_tokens=max_context_tokens, kv_events_endpoint=kv_events_endpoint,
                migration_limit=migration_limit, membership_file=membership_file,
                drain_delay_s=drain_delay_s, drain_timeout_s=drain_timeout_s,
                picture_peers=[u.strip() for u in (picture_peers or "").split(",") if u.strip()],
                picture_share_s=picture_share_s,
            )
            cfg = RouterConfig(**{**flags, **extra})  # --config-json fields win over the flags
            fields = dict(kv_capacity_tokens=kv_capacity_tokens, host_kv_capacity_tokens=host_kv_capacity_tokens,
                          max_active_requests=max_active_requests, engine=engine)
            members = static_membership(replica, **fields).replicas + [
                MemberReplica(id=f"static-long/{i}/0", url=u, pool="long", **fields) for i, u in enumerate(long_replica)
            ]
            membership = Membership(version=0, replicas=members) if members else None
        except PolicyConfigError as e:
            fail(str(e))
        except ValidationError as e:
            fail(validation_problems(e))
        if membership is None and cfg.admin_key is None and not cfg.membership_file:
            fail("no --replica given and no --admin-key to receive membership: the router would have nothing to route to")
        run_router(build_router(cfg, membership=membership), cfg, log_level)


def _slo_policy(policy: str, options: dict, slo_class: list[str], slo_model: str | None,
                slo_variants: str | None) -> tuple[str, dict]:
    """The policy and options the router runs: unchanged without --slo-class; with it the `slo` filter around
    `policy`, its limits from `switching.classes.slo_policy_config` (the function the controller uses for its
    own router, so router pods of a Helm release and the controller's router apply the same limits).
    --policy-config values win over the derived ones."""
    if not slo_class:
        if slo_model or slo_variants:
            fail("--slo-model and --slo-variants only apply with --slo-class")
        return policy, options
    from zoe_cluster.recipes.loader import RecipeError, RecipeRegistry, UnknownModelError
    from zoe_cluster.switching.classes import slo_policy_config

    if not slo_model or not slo_variants:
        fail("--slo-class needs --slo-model and --slo-variants (the recipe and the variants the limits come from)")
    try:
        recipe = RecipeRegistry.default().get(slo_model)
    except (UnknownModelError, RecipeError) as e:
        fail(f"--slo-model: {e}")
    variants = [v.strip() for v in slo_variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in recipe.variants]
    if unknown or not variants:
        fail(f"--slo-variants: model {slo_model} has no variant {', '.join(map(repr, unknown)) or '(none given)'}; "
             f"known: {', '.join(sorted(recipe.variants))}")
    classes = parse_service_classes(slo_class, "--slo-class")
    inner = options.pop("inner", None) or (policy if policy != "slo" else "prefix")
    try:
        derived = slo_policy_config(recipe, classes, variants, inner=inner)
    except ValueError as e:
        fail(f"--slo-class: {e}")
    return "slo", derived | options


def run_router(router, cfg, log_level: str = "warning") -> None:
    """Serve `router` with uvicorn (uvloop when available; httptools with read timeouts) until SIGINT, or SIGTERM
    and its drain."""
    import uvicorn

    console.print(
        f"zoe router on http://{cfg.host}:{cfg.port} policy={cfg.policy} replicas={len(router.replicas.by_id)}",
        highlight=False,
    )
    from zoe_cluster.router.drain import DrainingServer, uvicorn_drain_kwargs
    from zoe_cluster.router.http_server import hardened_http

    config = uvicorn.Config(
        router.app, host=cfg.host, port=cfg.port, loop="auto", lifespan="on", access_log=False,
        http=hardened_http(cfg.header_timeout_s, cfg.body_timeout_s),  # read timeouts, HTTP/1.0 framing
        log_level=log_level, timeout_keep_alive=75,
        proxy_headers=False,  # the router is the edge: no X-Forwarded-* rewriting (one ASGI layer less per request)
        server_header=False, **uvicorn_drain_kwargs(router),
    )
    DrainingServer(config, router).run()  # SIGTERM: drain (router.drain), then exit
