"""The membership contract: what the controller pushes to the router (the controller is its single writer).

    PUT /admin/membership            body: Membership JSON; Authorization: Bearer <admin key>
        200 {"version": N, "replicas": K}   applied (a version <= the current one answers 409: stale push)
    POST /admin/replicas/{replica_id}/drain     stop sending new requests; in-flight ones finish
    POST /admin/replicas/{replica_id}/undrain
    GET  /admin/membership           the current membership and each replica's load and health

(`replica_id` contains slashes; URL-encode it or send it as it is: the route takes the rest of the path.)

A replica is identified by "deployment/index/generation". A replica that is absent from a new membership, or
whose URL changed, is removed from the router (its prefix index is dropped); in-flight requests to it finish.
State "draining" keeps a replica known but sends it nothing new: use it before swapping a replica's variant,
then push a membership without it (or with the new generation's id) once its in-flight count is 0
(`GET /admin/membership` shows `active_requests`).

    from zoe_cluster.router.membership import Membership, MemberReplica
    m = Membership(version=3, replicas=[MemberReplica(id="glm/0/1", url="http://10.0.0.5:8000",
                                                      pool="default", variant="fp8-tp8", state="ready")])
    httpx.put(f"{router}/admin/membership", json=m.model_dump(), headers={"Authorization": f"Bearer {key}"})
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zoe_cluster.engines.base import EngineName
from zoe_cluster.engines.vllm import VllmAdapter

REPLICA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]*/[0-9]+/[0-9]+$"


class KvEventSource(BaseModel):
    """One KV-event publisher of a replica's engine (one per data-parallel rank): the engine binds these, every
    router connects to them (precise mode, `zoe_cluster.router.kv_events`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(description="ZMQ PUB endpoint the engine binds, as routers reach it: tcp://host:port.")
    replay_endpoint: str | None = Field(
        default=None, description="ZMQ ROUTER endpoint where the engine replays its recent batches "
        "(tcp://host:port); a router that (re)connects asks it for what it missed. None: no replay.")

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _tcp_endpoint(cls, v: str | None) -> str | None:
        if v is None:
            return v
        u = urlsplit(v)
        try:
            port = u.port
        except ValueError as e:
            raise ValueError(f"{v!r}: {e}") from None
        if u.scheme != "tcp" or not u.hostname or u.hostname == "*" or not port:
            raise ValueError(f"a KV-event endpoint must be tcp://host:port with a concrete host, got {v!r}")
        return v


class MemberReplica(BaseModel):
    """One replica the router may send requests to."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=REPLICA_ID_PATTERN, description='Replica identity "deployment/index/generation".')
    url: str = Field(description="Base URL of the engine's OpenAI server, e.g. http://10.0.0.5:8000 (no /v1); "
                     "http only: https is refused here, since the router cannot send to it.")
    pool: str = Field(default="default", min_length=1, description='Context pool; "long" for long-context replicas.')
    variant: str = Field(default="", description="Recipe variant the replica serves (shown in metrics and admin).")
    state: Literal["ready", "draining"] = Field(
        default="ready", description="ready: receives requests; draining: in-flight requests finish, no new ones."
    )
    engine: EngineName = Field(
        default=VllmAdapter.name, description="Engine behind the URL; picks the parser of its /metrics."
    )
    models: list[str] = Field(
        default_factory=list, description="Served model names; empty means the router's configured model list."
    )
    kv_capacity_tokens: int = Field(
        default=1_000_000, gt=0, description="KV-cache capacity, tokens (sizes the router's prefix index)."
    )
    host_kv_capacity_tokens: int = Field(
        default=0, ge=0,
        description="KV tokens the engine also keeps in host memory (KV offloading); 0: none. The prefix index is "
        "sized to the larger of this and kv_capacity_tokens.",
    )
    max_active_requests: int = Field(
        default=256, gt=0, description="Concurrent requests before the router counts the replica saturated."
    )
    max_context_tokens: int | None = Field(
        default=None, gt=0, description="Longest prompt + output the replica accepts, tokens (None: no check)."
    )
    kv_events: list[KvEventSource] = Field(
        default_factory=list,
        description="The engine's KV-event publishers, one per data-parallel rank (precise mode): every router "
        "subscribes to each; empty: the replica publishes none.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if v.startswith("https://"):
            raise ValueError(f"url {v!r}: https upstreams are not supported (the router's upstream client speaks "
                             "plain HTTP/1.1 to engines on the cluster network); give the engine's http:// address")
        u = urlsplit(v)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"url must be http://host[:port], got {v!r}")
        try:
            u.port
        except ValueError as e:
            raise ValueError(f"url {v!r}: {e}") from None
        return v.rstrip("/")


class Membership(BaseModel):
    """The whole set of replicas, versioned: the router applies only pushes newer than what it has."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=0, description="Monotonic version; the router rejects a push not newer than its own.")
    replicas: list[MemberReplica] = Field(default_factory=list, description="Every replica, ready or draining.")

    @model_validator(mode="after")
    def _unique_ids(self) -> "Membership":
        ids = [r.id for r in self.replicas]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"replica ids listed twice: {dup}")
        return self
