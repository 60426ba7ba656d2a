"""The built-in routing policies: `round_robin`, `least_load` and `prefix` (the default).

`prefix` scores every candidate replica r with an estimated cost, in prompt-token equivalents, of serving the
request there, and picks the cheapest:

    saved(r)  = min(prompt_tokens, matched_blocks(r) * block_tokens)   # from r's PrefixIndex
    cost(r)   = prefill_weight * (queued_prefill_tokens(r) + prompt_tokens - hit_weight * saved(r))
              + decode_weight  * active_decode_tokens(r)
              + request_weight * active_requests(r)
              + external_request_tokens * max(0, engine_requests(r) - active_requests(r))

The first term is the prefill work ahead of the request's first token on r (what TTFT grows with), so prefix
tokens saved are weighed directly against prefill already queued; `hit_weight` (default 4) counts a saved token
four times, because a hit also keeps the conversation's next turns local and its blocks warm (tuned on the
Mooncake conversation trace, bench/router/README.md: raising it from 1 to 4 lifted the hit rate from 25.6% to
28.6% on 4 simulated GLM-5.3 replicas and from 32.4% to 34.9% on 8, within 3% of the same p90 TTFT, and live
behind real HTTP it gave the best p50 and p90 TTFT of the settings tried); the second charges the decode batch the
request would join (longer steps); the last adds load the engine reports in /metrics that this router did not
send (other routers), when the scrape is younger than `engine_stats_max_age_s`. Saturated replicas
(`active_requests >= max_active_requests`) are skipped while another is open. Ties go to fewer active requests,
then rotate.

Session affinity (`ctx.session`) is a hint: the session's last replica wins only if its cost is within
`max(session_slack_tokens, session_slack_ratio * best_cost)` of the best, so one busy session cannot make a hot
spot. Context-length pools (`routing.pools`) apply to `least_load` and `prefix`.

Reasons reported: "prefix" (the chosen replica had the longest match and it mattered), "load_balance" (load
outweighed a longer match elsewhere), "least_load" (no replica matched more than the others), "session",
"pool_spill" (the request left its context pool), "only_choice" (one candidate).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pydantic import Field

from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.routing.policy import Policy, PolicyConfig
from zoe_cluster.routing.pools import PoolConfig, pool_candidates
from zoe_cluster.routing.prefix_index import PrefixIndex


def _open(replicas: Sequence[ReplicaView]) -> Sequence[ReplicaView]:
    """Unsaturated replicas, or all of them when every one is saturated."""
    open_ = [r for r in replicas if not r.saturated]
    return open_ or replicas


class RoundRobinPolicy(Policy, name="round_robin"):
    """Each candidate in turn; ignores load, locality and pools (the baseline)."""

    Config = PolicyConfig

    def __init__(self, config: PolicyConfig | None = None) -> None:
        super().__init__(config)
        self._next = 0

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        r = replicas[self._next % len(replicas)]
        self._next += 1
        return RoutingDecision(r.replica_id, "round_robin")


class LeastLoadConfig(PoolConfig):
    pass


class LeastLoadPolicy(Policy, name="least_load"):
    """Fewest active requests, then least queued prefill; respects context pools."""

    Config = LeastLoadConfig
    config: LeastLoadConfig

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        super().__init__(config)
        self._turn = 0

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        cands, spilled_from = pool_candidates(ctx, replicas, self.config)
        cands = _open(cands)
        self._turn += 1
        n = len(cands)
        best = min(
            range(n),
            key=lambda i: (cands[i].active_requests, cands[i].queued_prefill_tokens, (i - self._turn) % n),
        )
        r = cands[best]
        spilled = spilled_from is not None and r.replica_id not in spilled_from
        return RoutingDecision(r.replica_id, "pool_spill" if spilled else "least_load", spilled=spilled)


class PrefixConfig(PoolConfig):
    prefill_weight: float = Field(default=1.0, ge=0, description="Cost per prefill token queued or new.")
    hit_weight: float = Field(
        default=4.0, ge=0,
        description="Multiplier on prefix tokens saved (>1 also values keeping a conversation's later turns local).",
    )
    decode_weight: float = Field(
        default=0.01, ge=0, description="Cost per context token of requests decoding on the replica."
    )
    request_weight: float = Field(default=0.0, ge=0, description="Cost per active request on the replica.")
    external_request_tokens: float = Field(
        default=1024.0, ge=0, description="Cost per request the engine reports beyond this router's own count."
    )
    engine_stats_max_age_s: float = Field(default=5.0, gt=0, description="Ignore /metrics scrapes older than this.")
    session_slack_tokens: float = Field(
        default=2048.0, ge=0, description="Session affinity holds while its replica costs at most this much more."
    )
    session_slack_ratio: float = Field(
        default=0.1, ge=0, description="... or this share of the best cost, whichever is larger."
    )
    max_sessions: int = Field(default=100_000, gt=0, description="Sessions remembered for affinity (LRU).")


class PrefixPolicy(Policy, name="prefix"):
    """Prefix-cache locality weighed against load (see the module docstring for the score)."""

    Config = PrefixConfig
    config: PrefixConfig

    def __init__(self, config: PrefixConfig | None = None) -> None:
        super().__init__(config)
        self._indexes: dict[str, PrefixIndex] = {}
        self._block_tokens: dict[str, int] = {}  # block size each index was built with (for evictions in tokens)
        self._evict_residual: dict[str, int] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._turn = 0

    def index(self, replica: ReplicaView, block_tokens: int) -> PrefixIndex:
        """The replica's prefix index, sized to its KV capacity in blocks of `block_tokens`."""
        cap = replica.kv_capacity_blocks(block_tokens)
        idx = self._indexes.get(replica.replica_id)
        if idx is None:
            idx = self._indexes[replica.replica_id] = PrefixIndex(cap)
            self._block_tokens[replica.replica_id] = block_tokens
        elif idx.capacity_blocks != cap:
            idx.resize(cap)
        return idx

    def index_of(self, replica_id: str) -> PrefixIndex | None:
        return self._indexes.get(replica_id)

    def cost(self, ctx: RequestContext, r: ReplicaView, matched_blocks: int, now: float | None = None) -> float:
        c = self.config
        saved = min(ctx.prompt_tokens, matched_blocks * ctx.block_tokens)
        cost = c.prefill_weight * (r.queued_prefill_tokens + ctx.prompt_tokens - c.hit_weight * saved)
        cost += c.decode_weight * r.active_decode_tokens + c.request_weight * r.active_requests
        if c.external_request_tokens and r.stats is not None:
            engine = r.engine_requests(c.engine_stats_max_age_s, now)
            if engine is not None and engine > r.active_requests:
                cost += c.external_request_tokens * (engine - r.active_requests)
        return cost

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        cands, spilled_from = pool_candidates(ctx, replicas, self.config)
        cands = _open(cands)
        self._turn += 1
        n = len(cands)
        scored = []
        for i, r in enumerate(cands):
            m = self.index(r, ctx.block_tokens).match(ctx.block_hashes)
            scored.append((self.cost(ctx, r, m), r.active_requests, (i - self._turn) % n, m, r))
        best = min(scored, key=lambda s: s[:3])
        best_cost, _, _, matched, chosen = best
        max_match = max(s[3] for s in scored)
        min_match = min(s[3] for s in scored)
        reason = "prefix" if matched > min_match else ("load_balance" if matched < max_match else "least_load")

        if ctx.session is not None:
            sticky = self._sessions.get(ctx.session)
            if sticky is not None and sticky != chosen.replica_id:
                for s in scored:
                    if s[4].replica_id == sticky:
                        slack = max(self.config.session_slack_tokens, self.config.session_slack_ratio * best_cost)
                        if s[0] <= best_cost + slack:
                            _, _, _, matched, chosen = s
                            reason = "session"
                        break
        if n == 1 and reason != "session":
            reason = "only_choice" if len(replicas) == 1 else reason
        spilled = spilled_from is not None and chosen.replica_id not in spilled_from
        if spilled:
            reason = "pool_spill"
        return RoutingDecision(chosen.replica_id, reason, matched_blocks=matched, spilled=spilled)

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        idx = self._indexes.get(decision.replica_id)
        if idx is not None:
            idx.insert(ctx.block_hashes)
        if ctx.session is not None:
            self._sessions[ctx.session] = decision.replica_id
            self._sessions.move_to_end(ctx.session)
            if len(self._sessions) > self.config.max_sessions:
                self._sessions.popitem(last=False)

    def on_cache_evicted(self, replica_id: str, tokens: int | None) -> None:
        idx = self._indexes.get(replica_id)
        if idx is None:
            return
        if tokens is None:
            idx.clear()
            self._evict_residual.pop(replica_id, None)
        elif tokens > 0:
            bt = self._block_tokens.get(replica_id, 1)
            pending = self._evict_residual.get(replica_id, 0) + tokens
            idx.evict_lru(pending // bt)
            self._evict_residual[replica_id] = pending % bt  # carry the remainder: small evictions add up

    def on_replica_removed(self, replica_id: str) -> None:
        self._block_tokens.pop(replica_id, None)
        self._evict_residual.pop(replica_id, None)
        self._indexes.pop(replica_id, None)
        for s in [s for s, rid in self._sessions.items() if rid == replica_id]:
            del self._sessions[s]
