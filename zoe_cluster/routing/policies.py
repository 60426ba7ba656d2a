"""The built-in routing policies: `round_robin`, `least_load`, `session_hash` and `prefix` (the default); and
`SglangCacheAwarePolicy`, sglang-router's `cache_aware` as a baseline for the benchmarks (unregistered).

`prefix` scores every candidate replica r with an estimated cost, in prompt-token equivalents, of serving the
request there, and picks the cheapest:

    hbm, host = r's PrefixIndex.match_tiers(blocks)                    # leading blocks in HBM, then in host memory
    saved(r)  = hbm_tokens + (1 - host_transfer_cost) * host_tokens    # a host-tier hit costs its transfer
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

Sessions (`ctx.session`; `routing.sessions`):

- **Affinity held until saturation.** A session's request goes to the replica holding its chain while that
  replica is not saturated for sessions (`session_saturated`: active requests >= `session_saturation_active` x its
  max, or queued prefill >= `session_saturation_prefill_tokens` at every request seen for `session_saturation_s`)
  and still holds some of the chain. A backlog must persist: one session's 100K-token turn queues that much for a
  few seconds, and moving a session off it re-prefills the moved chain, whose prefill then shares the new
  replica's steps with every session there (bench/agentic/policies.md measures what that costs TTFT). When it is
  saturated, the request moves to the cheapest unsaturated replica if that costs less than staying, and the
  session moves with it ("session_move"): its later turns follow the new replica, and it does not move back
  unless that one saturates in turn. When every replica is saturated nobody moves (no death spiral of re-prefills).
- **Placement of a new session** (or one whose chain is gone) adds what the replica has already promised:
  `session_tokens` per live session bound there (running or thinking: a session in a tool pause comes back, and
  its chain stays warm only if new sessions do not crowd its replica), and `sibling_tokens` per live sub-agent of
  the same parent there (a burst of sub-agents spreads; each still matches the parent's shared prefix wherever it
  is cached).
- A session is live from its first request until it has been idle (nothing in flight) for `session_idle_s`.

Context-length pools (`routing.pools`) apply to `least_load` and `prefix`.

Reasons reported: "prefix" (the chosen replica had the longest match and it mattered), "load_balance" (load
outweighed a longer match elsewhere), "least_load" (no replica matched more than the others), "session",
"session_move", "session_hash", "pool_spill" (the request left its context pool), "only_choice" (one candidate).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.routing.hash_ring import HashRing
from zoe_cluster.routing.hashing import CHARS_PER_TOKEN
from zoe_cluster.routing.policy import Policy, PolicyConfig
from zoe_cluster.routing.pools import PoolConfig, pool_candidates
from zoe_cluster.routing.prefix_index import PrefixIndex
from zoe_cluster.routing.sessions import SessionTable, session_family


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


class SessionHashConfig(PolicyConfig):
    points_per_replica: int = Field(
        default=100, gt=0, description="Points each replica owns on the hash ring (more: shares closer to 1/N)."
    )


class SessionHashPolicy(Policy, name="session_hash"):
    """Consistent hashing by session (what AMD's InferenceX recipes route by): a session always goes to the replica
    its key hashes to on a ring over replica ids (`routing.hash_ring`), so adding or removing a replica moves only
    that replica's share of sessions. A request without a session hashes its prompt's first block (so requests
    sharing a system prompt meet), and one without a full block its request id. A saturated or unroutable owner
    passes the request on clockwise. Ignores load otherwise: the baseline for session-aware `prefix`."""

    Config = SessionHashConfig
    config: SessionHashConfig

    def __init__(self, config: SessionHashConfig | None = None) -> None:
        super().__init__(config)
        self.ring = HashRing(self.config.points_per_replica)

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        for r in replicas:
            self.ring.add(r.replica_id)  # membership is learned as replicas appear
        by_id = {r.replica_id: r for r in replicas}
        key: str | int = ctx.session if ctx.session is not None else (
            ctx.block_hashes[0] if ctx.block_hashes else ctx.request_id)
        rid = self.ring.lookup(key, lambda r: r in by_id and not by_id[r].saturated)
        if rid is None:  # every candidate saturated: its owner among them all
            rid = self.ring.lookup(key, lambda r: r in by_id)
        assert rid is not None
        return RoutingDecision(rid, "session_hash" if len(replicas) > 1 else "only_choice")

    def on_replica_removed(self, replica_id: str) -> None:
        self.ring.remove(replica_id)


class CacheAwareConfig(PolicyConfig):
    """sglang-router's `cache_aware` tunables, defaulting to its documented defaults (sglang-router's
    `router_args.py`: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5, max_tree_size
    2**26)."""

    cache_threshold: float = Field(
        default=0.3, ge=0, le=1,
        description="Route to the best-matching replica when it holds more than this share of the prompt.",
    )
    balance_abs_threshold: int = Field(
        default=64, ge=0, description="Imbalanced when the most and least active requests differ by more than this..."
    )
    balance_rel_threshold: float = Field(
        default=1.5, ge=1, description="... and the most is more than this times the least."
    )
    max_tree_tokens: int = Field(
        default=2**26 // CHARS_PER_TOKEN, gt=0,
        description="Tokens each replica's tree remembers (sglang-router's max_tree_size of 2**26 characters).",
    )


class SglangCacheAwarePolicy(Policy):
    """sglang-router's `cache_aware` policy (a baseline the agentic benchmarks compare against; not registered, so
    not a choice of zoe's router: `zoe sim replay` and the benchmarks build it by its class), on the router's block
    index instead of its character tree: when the fleet is imbalanced (active requests: max - min >
    `balance_abs_threshold` and max > `balance_rel_threshold` x min) the least active replica; otherwise the
    replica whose tree matches the most of the prompt if that share exceeds `cache_threshold`, else the replica with
    the smallest tree. Every routed prompt enters the chosen replica's tree, which forgets by LRU at
    `max_tree_tokens` (it knows nothing of the engine's KV size). No sessions, no prefill load."""

    name: ClassVar[str] = "sglang_cache_aware"
    Config = CacheAwareConfig
    config: CacheAwareConfig

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        super().__init__(config)
        self._trees: dict[str, PrefixIndex] = {}
        self._turn = 0

    def _tree(self, replica_id: str, block_tokens: int) -> PrefixIndex:
        tree = self._trees.get(replica_id)
        if tree is None:
            tree = self._trees[replica_id] = PrefixIndex(max(1, self.config.max_tree_tokens // max(1, block_tokens)))
        return tree

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        c = self.config
        self._turn += 1
        n = len(replicas)
        loads = [r.active_requests for r in replicas]
        if max(loads) - min(loads) > c.balance_abs_threshold and max(loads) > c.balance_rel_threshold * min(loads):
            i = min(range(n), key=lambda i: (loads[i], (i - self._turn) % n))
            return RoutingDecision(replicas[i].replica_id, "least_load")
        trees = [self._tree(r.replica_id, ctx.block_tokens) for r in replicas]
        matched = [t.match(ctx.block_hashes) for t in trees]
        best = max(range(n), key=lambda i: (matched[i], -((i - self._turn) % n)))
        share = min(ctx.prompt_tokens, matched[best] * ctx.block_tokens) / max(1, ctx.prompt_tokens)
        if share > c.cache_threshold:
            return RoutingDecision(replicas[best].replica_id, "prefix" if n > 1 else "only_choice",
                                   matched_blocks=matched[best])
        i = min(range(n), key=lambda i: (len(trees[i]), (i - self._turn) % n))
        return RoutingDecision(replicas[i].replica_id, "least_load" if n > 1 else "only_choice",
                               matched_blocks=matched[i])

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        self._tree(decision.replica_id, ctx.block_tokens).insert(ctx.block_hashes)

    def on_replica_removed(self, replica_id: str) -> None:
        self._trees.pop(replica_id, None)


class PrefixConfig(PoolConfig):
    prefill_weight: float = Field(default=1.0, ge=0, description="Cost per prefill token queued or new.")
    hit_weight: float = Field(
        default=4.0, ge=0,
        description="Multiplier on prefix tokens saved (>1 also values keeping a conversation's later turns local).",
    )
    placement_hit_weight: float = Field(
        default=1.0, ge=0,
        description="hit_weight when a session is placed or moved (its later turns follow it wherever it goes).",
    )
    host_transfer_cost: float = Field(
        default=0.05, ge=0, le=1,
        description="Cost of loading one token's KV from a host-memory tier, as a share of prefilling it (the host "
        "link's load time per token over the engine's prefill time per token).",
    )
    decode_weight: float = Field(
        default=0.01, ge=0, description="Cost per context token of requests decoding on the replica."
    )
    request_weight: float = Field(default=0.0, ge=0, description="Cost per active request on the replica.")
    external_request_tokens: float = Field(
        default=1024.0, ge=0, description="Cost per request the engine reports beyond this router's own count."
    )
    engine_stats_max_age_s: float = Field(default=5.0, gt=0, description="Ignore /metrics scrapes older than this.")
    session_saturation_prefill_tokens: float = Field(
        default=65536.0, gt=0,
        description="A session's replica counts as saturated (the session may move) with this much prefill queued.",
    )
    session_saturation_active: float = Field(
        default=0.9, gt=0, le=1,
        description="... or with this share of its max_active_requests in flight.",
    )
    session_tokens: float = Field(
        default=2048.0, ge=0,
        description="Placing a new session: cost per live session already bound to the replica.",
    )
    sibling_tokens: float = Field(
        default=8192.0, ge=0,
        description="Placing a new sub-agent: cost per live sub-agent of the same parent on the replica.",
    )
    session_idle_s: float = Field(
        default=300.0, gt=0, description="A session idle this long (nothing in flight) is forgotten (it ended)."
    )
    session_saturation_s: float = Field(
        default=60.0, ge=0,
        description="... held for this long (a backlog that persists, not a long prefill passing through).",
    )
    max_sessions: int = Field(default=100_000, gt=0, description="Sessions remembered for affinity (LRU).")


class PrefixPolicy(Policy, name="prefix"):
    """Prefix-cache locality weighed against load, with session affinity (see the module docstring)."""

    Config = PrefixConfig
    config: PrefixConfig

    def __init__(self, config: PrefixConfig | None = None) -> None:
        super().__init__(config)
        self._indexes: dict[str, PrefixIndex] = {}
        self._block_tokens: dict[str, int] = {}  # block size each index was built with (for evictions in tokens)
        self._evict_residual: dict[str, int] = {}
        self.sessions = SessionTable(self.config.max_sessions, self.config.session_idle_s)
        self._turn = 0
        self._virtual_now: float | None = None  # latest driver clock seen (ctx.arrival_s), for on_finished
        self._backlog_since: dict[str, float] = {}

    def index(self, replica: ReplicaView, block_tokens: int) -> PrefixIndex:
        """The replica's prefix index, sized to its HBM and host-tier KV capacity in blocks of `block_tokens`."""
        bt = max(1, block_tokens)
        cap = max(1, replica.kv_capacity_tokens // bt)
        host = replica.host_kv_capacity_tokens // bt
        idx = self._indexes.get(replica.replica_id)
        if idx is None:
            idx = self._indexes[replica.replica_id] = PrefixIndex(cap, host)
            self._block_tokens[replica.replica_id] = block_tokens
        elif idx.capacity_blocks != cap or idx.host_capacity_blocks != host:
            idx.resize(cap, host)
        return idx

    def index_of(self, replica_id: str) -> PrefixIndex | None:
        return self._indexes.get(replica_id)

    def _now(self, ctx: RequestContext) -> float:
        if ctx.arrival_s is None:
            return time.monotonic()
        if self._virtual_now is None or ctx.arrival_s > self._virtual_now:
            self._virtual_now = ctx.arrival_s
        return ctx.arrival_s

    def saved_tokens(self, ctx: RequestContext, hbm_blocks: int, host_blocks: int) -> float:
        """Prefill tokens a hit saves, the host-tier part net of its transfer."""
        hbm = min(ctx.prompt_tokens, hbm_blocks * ctx.block_tokens)
        host = min(ctx.prompt_tokens - hbm, host_blocks * ctx.block_tokens)
        return hbm + (1.0 - self.config.host_transfer_cost) * host

    def cost(self, ctx: RequestContext, r: ReplicaView, matched_blocks: int, now: float | None = None,
             host_blocks: int = 0, hit_weight: float | None = None) -> float:
        """The module docstring's cost(r); `hit_weight` overrides the configured one."""
        c = self.config
        saved = self.saved_tokens(ctx, matched_blocks, host_blocks)
        hw = c.hit_weight if hit_weight is None else hit_weight
        cost = c.prefill_weight * (r.queued_prefill_tokens + ctx.prompt_tokens - hw * saved)
        cost += c.decode_weight * r.active_decode_tokens + c.request_weight * r.active_requests
        if c.external_request_tokens and r.stats is not None:
            engine = r.engine_requests(c.engine_stats_max_age_s, now)
            if engine is not None and engine > r.active_requests:
                cost += c.external_request_tokens * (engine - r.active_requests)
        return cost

    def placement_cost(self, ctx: RequestContext, r: ReplicaView) -> float:
        """What placing a new session on r adds to `cost`: the live sessions it already holds and the live sibling
        sub-agents there."""
        c = self.config
        extra = c.session_tokens * self.sessions.on_replica(r.replica_id).sessions
        family, agent = session_family(ctx.session or "")
        if agent is not None:
            extra += c.sibling_tokens * self.sessions.siblings_on(family, r.replica_id)
        return extra

    def _note_backlogs(self, replicas: Sequence[ReplicaView], now: float) -> None:
        """Remember since when each replica's queued prefill has been at or above the saturation mark (as seen at
        each request: a dip between two requests goes unseen)."""
        mark = self.config.session_saturation_prefill_tokens
        for r in replicas:
            if r.queued_prefill_tokens >= mark:
                self._backlog_since.setdefault(r.replica_id, now)
            else:
                self._backlog_since.pop(r.replica_id, None)

    def session_saturated(self, r: ReplicaView, now: float | None = None) -> bool:
        """Whether a session on r may move off it (module docstring); `now` on the policy's clock (None: a backlog
        counts at once)."""
        c = self.config
        if r.saturated or r.active_requests >= c.session_saturation_active * r.max_active_requests:
            return True
        since = self._backlog_since.get(r.replica_id)
        if since is None and r.queued_prefill_tokens >= c.session_saturation_prefill_tokens:
            since = now  # not noted yet (a direct call): held since now
        return since is not None and (now is None or now - since >= c.session_saturation_s)

    def select(self, ctx: RequestContext, replicas: Sequence[ReplicaView]) -> RoutingDecision:
        cands, spilled_from = pool_candidates(ctx, replicas, self.config)
        cands = _open(cands)
        self._turn += 1
        n = len(cands)
        session = ctx.session
        st = None
        now = self._now(ctx)
        self._note_backlogs(cands, now)
        if session is not None:
            self.sessions.expire(now)
            st = self.sessions.get(session)
        matches = [self.index(r, ctx.block_tokens).match_tiers(ctx.block_hashes) for r in cands]
        home = None
        if st is not None:
            home = next((i for i, r in enumerate(cands) if r.replica_id == st.replica_id and sum(matches[i])), None)
        if home is not None and not self.session_saturated(cands[home], now):
            chosen, reason = home, "session"
        else:
            # Placing (or moving) a session: its later turns follow it wherever it goes, so a hit counts for the
            # prefill it saves now (placement_hit_weight), not for the locality it keeps (hit_weight).
            hw = self.config.placement_hit_weight if session is not None else self.config.hit_weight
            scored = []
            for i, r in enumerate(cands):
                cost = self.cost(ctx, r, matches[i][0], host_blocks=matches[i][1], hit_weight=hw)
                if session is not None and i != home:
                    cost += self.placement_cost(ctx, r)
                scored.append((cost, r.active_requests, (i - self._turn) % n, i))
            if home is not None:  # saturated: move to the cheapest unsaturated replica if that beats waiting
                others = [s for s in scored if s[3] != home and not self.session_saturated(cands[s[3]], now)]
                best = min(others) if others else scored[home]
                chosen, reason = (best[3], "session_move") if best[0] < scored[home][0] else (home, "session")
            else:
                chosen = min(scored)[3]
                total = [h + g for h, g in matches]
                reason = ("prefix" if total[chosen] > min(total)
                          else ("load_balance" if total[chosen] < max(total) else "least_load"))
                if n == 1:
                    reason = "only_choice" if len(replicas) == 1 else reason
        rid = cands[chosen].replica_id
        spilled = spilled_from is not None and rid not in spilled_from
        if spilled:
            reason = "pool_spill"
        return RoutingDecision(rid, reason, matched_blocks=sum(matches[chosen]), spilled=spilled)

    def on_routed(self, ctx: RequestContext, decision: RoutingDecision) -> None:
        idx = self._indexes.get(decision.replica_id)
        if idx is not None:
            idx.insert(ctx.block_hashes)
        if ctx.session is not None:
            self.sessions.routed(ctx.session, decision.replica_id, ctx.prompt_tokens + ctx.max_tokens,
                                 self._now(ctx))

    def on_finished(self, ctx: RequestContext, replica_id: str, ok: bool) -> None:
        if ctx.session is None:
            return
        now = self._virtual_now if ctx.arrival_s is not None and self._virtual_now is not None else time.monotonic()
        self.sessions.finished(ctx.session, now)
        if ok:
            idx = self._indexes.get(replica_id)
            if idx is not None:  # the engine frees the chain now: it is most recent in its LRU from here
                idx.insert(ctx.block_hashes)

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
        self._backlog_since.pop(replica_id, None)
        self._block_tokens.pop(replica_id, None)
        self._evict_residual.pop(replica_id, None)
        self._indexes.pop(replica_id, None)
        self.sessions.drop_replica(replica_id)
