"""Several router instances behind one front: what `zoe sim replay --routers N` routes with.

A deployment with N router pods runs N copies of the routing policy, each with its own learned state (prefix
index, session table); what they share is what every router observes from the engines: the replicas' load. The
`RouterFleet` policy models that: it holds N inner policy instances and a front that hands each request to one
of them, and the chosen router decides alone. Every router reads the same `ReplicaView`s (the driver keeps one
load picture), and hears every replica removal and, in precise mode, every KV event (each router subscribes to
the engines' event streams, so their pictures of evictions are the same). With `share_every_s`, the routers also
share their approximate pictures as live routers do (`routing.picture_sharing`): at the first request at or after
each period of the replay's clock, every router takes the chains every peer inserted into its prefix indexes since
the last time, and the sessions every peer routed since (its session table's latest routings).

Fronts (`FRONTS`):
- "random": a plain Kubernetes Service, which spreads connections over router pods with no regard to content;
  modelled as a uniform random router per request from a seeded generator (deterministic replays).
- "affinity": a consistent hash (`routing.hash_ring`) of the request's affinity key over the router ids, as an
  ingress or Gateway with ring-hash affinity on a header does: the session key when the request has one, else
  the chain hash of its first `affinity_blocks` prompt blocks (a chain hash covers every block before it), else
  its request id. Requests that could share a cache meet on one router.

The fleet is never registered by name (it stays out of the live router's `--policy` choices and the chart's
schema): a replay takes the factory that builds it.

    replay(SimReplayConfig(recipe, variant, 8, fleet_factory(routers=4, front="affinity")), rows)
    replay(SimReplayConfig(recipe, variant, 8, fleet_factory(routers=4, share_every_s=1.0)), rows)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, model_validator

from zoe_cluster.config_errors import validation_problems
from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.routing.hash_ring import HashRing
from zoe_cluster.routing.picture_sharing import apply_picture_delta, apply_session_delta, picture_delta, session_delta
from zoe_cluster.routing.policy import (
    DEFAULT_POLICY,
    Policy,
    PolicyConfig,
    PolicyConfigError,
    get_policy,
    validate_policy_config,
)

FLEET_POLICY = "router_fleet"
"""The fleet's name in a replay's results (it is not a registered policy)."""

RouterFront = Literal["random", "affinity"]
FRONTS: tuple[str, ...] = ("random", "affinity")
"""What can stand in front of the routers (the CLI's --router-front choices)."""


class RouterFleetConfig(PolicyConfig):
    routers: int = Field(2, ge=1, description="Router instances, each with its own policy state.")
    front: RouterFront = Field("random", description="How a request is assigned to a router (module docstring).")
    policy: str = Field(DEFAULT_POLICY, description="The policy every router runs (a registered name).")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Tunables of `policy`, validated against its own Config.")
    seed: int = Field(0, description="Seed of the random front.")
    points_per_router: int = Field(100, ge=1, description="Ring points per router (affinity front).")
    affinity_blocks: int = Field(1, ge=1, description=(
        "Affinity front, requests without a session key: hash the chain hash of this many leading prompt blocks "
        "(fewer when the prompt is shorter). 1 keys on the first block; when every prompt opens with the same "
        "system prompt that sends all such requests to one router, and 2 or more spreads them by conversation."))
    share_every_s: float | None = Field(None, gt=0, description=(
        "Period, seconds of the replay's clock, of each router taking the prefix-index chains its peers inserted "
        "and the sessions they routed (routing.picture_sharing), as `zoe router --picture-share-s`; None: the "
        "routers share nothing."))

    @model_validator(mode="after")
    def _inner_policy_valid(self) -> "RouterFleetConfig":
        if self.policy == FLEET_POLICY:
            raise ValueError("a router fleet cannot run a router fleet")
        try:
            validate_policy_config(self.policy, self.options)
        except PolicyConfigError as e:
            raise ValueError(str(e)) from None
        return self


class RouterFleet(Policy):
    """N router instances (inner policies) behind a front; see the module docstring. Not registered: build it
    directly (`fleet_factory`)."""

    name: ClassVar[str] = FLEET_POLICY
    Config: ClassVar[type[PolicyConfig]] = RouterFleetConfig
    config: RouterFleetConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.routers: list[Policy] = [get_policy(cfg.policy, **cfg.options) for _ in range(cfg.routers)]
        self._ids = [f"router-{k}" for k in range(cfg.routers)]
        self._ring = HashRing(cfg.points_per_router, self._ids)
        self._rng = random.Random(cfg.seed)
        self._router_of: dict[str, int] = {}
        """Request id -> the router that routed it, until it finishes."""
        self.requests_per_router = [0] * cfg.routers
        self._views: dict[str, ReplicaView] = {}
        self._cursors = [[{} for _ in range(cfg.routers)] for _ in range(cfg.routers)]
        """_cursors[k][j]: per replica, the number of router j's index log that router k asks from next."""
        self._session_cursors = [[0] * cfg.routers for _ in range(cfg.routers)]
        """_session_cursors[k][j]: the number of router j's session table that router k asks from next."""
        self._next_share_s: float | None = None
        self.shared_chains = 0
        self.shared_sessions = 0

    def router_for(self, ctx: RequestContext) -> int:
        """Index of the router the front hands `ctx` to (the random front draws from its generator)."""
        if self.config.routers == 1:
            return 0
        if self.config.front == "random":
            return self._rng.randrange(self.config.routers)
        key: str | int = ctx.session if ctx.session is not None else (
            ctx.block_hashes[min(self.config.affinity_blocks, len(ctx.block_hashes)) - 1] if ctx.block_hashes
            else ctx.request_id)
        owner = self._ring.lookup(key)
        assert owner is not None  # the ring holds every router
        return self._ids.index(owner)

    def share(self, block_tokens: int, now: float) -> int:
        """Every router takes the chains each peer inserted and the sessions it routed since it last asked (`now`:
        the replay's clock); returns the chains taken."""
        added = 0
        for k, mine in enumerate(self.routers):
            for j, peer in enumerate(self.routers):
                if j != k:
                    delta = picture_delta(peer, self._cursors[k][j], self._views)
                    added += apply_picture_delta(mine, self._views, block_tokens, delta, self._cursors[k][j])
                    sessions = session_delta(peer, self._session_cursors[k][j], now)
                    self.shared_sessions += apply_session_delta(mine, self._views, sessions, now)
                    self._session_cursors[k][j] = sessions[0]
        self.shared_chains += added
        return added

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        for r in replicas:
            self._views[r.replica_id] = r
        every = self.config.share_every_s
        if every is not None and self.config.routers > 1 and ctx.arrival_s is not None:
            if self._next_share_s is None:
                self._next_share_s = ctx.arrival_s + every
            elif ctx.arrival_s >= self._next_share_s:
                self.share(ctx.block_tokens, ctx.arrival_s)
                self._next_share_s += every * (1 + (ctx.arrival_s - self._next_share_s) // every)
        k = self.router_for(ctx)
        self._router_of[ctx.request_id] = k
        self.requests_per_router[k] += 1
        return self.routers[k].select(ctx, replicas)

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        self.routers[self._router_of[ctx.request_id]].on_routed(ctx, decision)

    def on_finished(self, ctx: RequestContext, replica_id: str, ok: bool) -> None:
        k = self._router_of.pop(ctx.request_id, None)
        if k is not None:
            self.routers[k].on_finished(ctx, replica_id, ok)

    def on_replica_removed(self, replica_id: str) -> None:
        self._views.pop(replica_id, None)
        for cursors in self._cursors:
            for c in cursors:
                c.pop(replica_id, None)
        for r in self.routers:  # membership reaches every router
            r.on_replica_removed(replica_id)

    def on_cache_evicted(self, replica_id: str, tokens: int | None) -> None:
        for r in self.routers:  # precise mode: every router subscribes to the engines' KV events
            r.on_cache_evicted(replica_id, tokens)

    def class_of(self, ctx: RequestContext) -> str:
        return self.routers[0].class_of(ctx)  # every router runs the same policy and options

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "requests_per_router": list(self.requests_per_router),
                "shared_chains": self.shared_chains, "shared_sessions": self.shared_sessions}


def fleet_factory(routers: int, front: str = "random", policy: str = DEFAULT_POLICY,
                  options: dict[str, Any] | None = None, seed: int = 0,
                  affinity_blocks: int = 1, share_every_s: float | None = None) -> Callable[[], RouterFleet]:
    """What builds a fleet of `routers` routers running `policy` (with `options`) behind `front`, a fresh one per
    call (a replay's `SimReplayConfig.policy`). The config is validated here: PolicyConfigError names a bad field."""
    try:
        config = RouterFleetConfig(routers=routers, front=front, policy=policy, options=dict(options or {}),
                                   seed=seed, affinity_blocks=affinity_blocks, share_every_s=share_every_s)
    except ValidationError as e:
        raise PolicyConfigError(f"router fleet: {validation_problems(e, whole='policy')}") from None
    return partial(RouterFleet, config)
