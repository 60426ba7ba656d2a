"""Context-length pools: long prompts go to replicas marked for long context, short ones stay off them.

Pools are in use when at least one candidate replica has `pool == long_pool`. Then a request of
`prompt_tokens >= long_context_tokens` has the long pool as its home, every other request the remaining
replicas. A request spills over to all candidates (the policy's score then decides) when its home is empty,
when every home replica is saturated, or, for long requests, when every long replica already has at least
`spill_queued_prefill_tokens` of prefill queued while some replica outside the pool is idle: long prefills are
not stacked on one replica while another is free.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from zoe_cluster.routing.context import ReplicaView, RequestContext
from zoe_cluster.routing.policy import PolicyConfig


class PoolConfig(PolicyConfig):
    long_context_tokens: int = Field(
        default=65536, gt=0, description="Prompts of at least this many tokens belong to the long pool."
    )
    long_pool: str = Field(default="long", min_length=1, description="Pool name that marks long-context replicas.")
    spill_queued_prefill_tokens: int = Field(
        default=131072,
        gt=0,
        description="A long request leaves its pool when every long replica has this much prefill queued and "
        "another replica is idle.",
    )


def pool_candidates(
    ctx: RequestContext, replicas: Sequence[ReplicaView], cfg: PoolConfig
) -> tuple[Sequence[ReplicaView], frozenset[str] | None]:
    """(candidates, home ids): the replicas the policy should score, and the ids of the request's home pool when
    the request spilled out of it (None when it did not spill or pools are not in use)."""
    if not any(r.pool == cfg.long_pool for r in replicas):
        return replicas, None
    is_long = ctx.prompt_tokens >= cfg.long_context_tokens
    home = [r for r in replicas if (r.pool == cfg.long_pool) == is_long]
    home_ids = frozenset(r.replica_id for r in home)
    if not home:
        return replicas, home_ids
    open_home = [r for r in home if not r.saturated]
    if not open_home:
        return replicas, home_ids
    if is_long and min(r.queued_prefill_tokens for r in open_home) >= cfg.spill_queued_prefill_tokens:
        if any(r.active_requests == 0 for r in replicas if r.replica_id not in home_ids):
            return replicas, home_ids
    return home, None
