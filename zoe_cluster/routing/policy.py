"""The policy interface and its registry.

A policy is one class: it subclasses `Policy` with a `name=` keyword, which registers it in `POLICIES`, and
declares its tunables as a nested pydantic model `Config` (unknown or badly typed keys are rejected). The
driver calls, for every request:

    decision = policy.select(ctx, candidates)   # candidates: routable replicas, never empty
    policy.on_routed(ctx, decision)             # the request was sent to decision.replica_id
    ...
    policy.on_finished(ctx, replica_id, ok)     # it ended (ok False: error, or retried elsewhere)

and `policy.on_replica_removed(replica_id)` when a replica leaves membership (its learned state is dropped);
`policy.on_cache_evicted(replica_id, tokens)` in precise mode, when the engine reports evictions (`kv_events`).
`select` is synchronous and does no I/O, so the same object routes live traffic and `zoe sim replay`.

    from zoe_cluster.routing import get_policy
    policy = get_policy("prefix", long_context_tokens=65536)

CLI choices come from `policy_names()`; `get_policy` raises `PolicyConfigError` naming the bad key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from zoe_cluster.config_errors import validation_problems
from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision


class PolicyConfigError(ValueError):
    """A policy name or tunable is invalid."""


class PolicyConfig(BaseModel):
    """Base of every policy's tunables: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


POLICIES: dict[str, type["Policy"]] = {}
"""Every policy class by name, filled in by `Policy.__init_subclass__`."""


class Policy:
    """Base class: pick one replica for a request. Subclass with `class X(Policy, name="x")`."""

    name: ClassVar[str]
    Config: ClassVar[type[PolicyConfig]] = PolicyConfig

    def __init_subclass__(cls, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if name is None:
            return  # an abstract intermediate class
        if name in POLICIES and POLICIES[name] is not cls:
            raise TypeError(f"routing policy '{name}' is defined twice ({POLICIES[name].__qualname__}, {cls.__qualname__})")
        cls.name = name
        POLICIES[name] = cls

    def __init__(self, config: PolicyConfig | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        """Choose among `replicas` (routable, non-empty). Pure apart from the policy's own learned state."""
        raise NotImplementedError

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        """The request was sent to `decision.replica_id`."""

    def on_finished(self, ctx: RequestContext, replica_id: str, ok: bool) -> None:
        """The request ended on `replica_id` (ok False: failed there)."""

    def on_replica_removed(self, replica_id: str) -> None:
        """The replica left membership (or changed generation): forget what was learned about it."""

    def on_cache_evicted(self, replica_id: str, tokens: int | None) -> None:
        """The replica's engine evicted `tokens` tokens of KV cache (None: all of it), from its KV events."""

    def class_of(self, ctx: RequestContext) -> str:
        """The service class `ctx` counts in (the load's per-class counts, `routing.accounting`): the class it names,
        "" for none. A class-aware policy (`slo`) maps it onto the classes it knows."""
        return ctx.slo_class or ""

    def describe(self) -> dict[str, Any]:
        return {"policy": self.name, **self.config.model_dump()}


def policy_names() -> list[str]:
    """Registered policy names (CLI choices), the default first. The built-in policies are registered by the
    package's __init__, which Python runs before this module."""
    names = sorted(POLICIES)
    if DEFAULT_POLICY in names:
        names.remove(DEFAULT_POLICY)
        names.insert(0, DEFAULT_POLICY)
    return names


DEFAULT_POLICY = "prefix"


def validate_policy_config(name: str, config: dict[str, Any] | None = None) -> PolicyConfig:
    """The validated tunables of policy `name`; PolicyConfigError names the unknown policy or bad key."""
    names = policy_names()
    if name not in POLICIES:
        raise PolicyConfigError(f"unknown routing policy '{name}'; choose one of: {', '.join(names)}")
    try:
        return POLICIES[name].Config(**(config or {}))
    except ValidationError as e:
        raise PolicyConfigError(f"policy '{name}': {validation_problems(e)}") from None


def get_policy(name: str = DEFAULT_POLICY, **config: Any) -> Policy:
    """A new policy instance of `name` with validated tunables."""
    cfg = validate_policy_config(name, config)
    return POLICIES[name](cfg)
