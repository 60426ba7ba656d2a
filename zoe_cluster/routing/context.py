"""What a routing decision looks at: the request (`RequestContext`), the replicas (`ReplicaView`), and what it
returns (`RoutingDecision`).

The driver (the live router in `zoe_cluster.router`, or `zoe sim replay`) builds one `RequestContext` per
request, keeps one `ReplicaView` per replica and updates its load counts through `admit` / `prefill_done` /
`finish`; policies only read them. Replica ids are "deployment/index/generation" (DESIGN.md: a swap to a new
variant is a new generation, so two engines' caches never share an id).

Building a context:

- live requests: `context_from_openai(endpoint, body, request_id=..., session_header=...)` hashes the prompt
  (or the rendered chat messages) as documented in `zoe_cluster.routing.hashing`;
- traces: `context_from_trace(request_id, model, hash_ids, input_tokens, output_tokens)` uses the trace's block
  ids with `block_tokens=512` (Mooncake).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from zoe_cluster.engines.base import EngineStats
from zoe_cluster.routing.hashing import (
    DEFAULT_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    TextChain,
    chain_hashes,
    estimate_tokens,
    hash_text,
    hash_token_ids,
    render_message,
    render_tools,
)

DEFAULT_MAX_TOKENS = 256
"""Output tokens assumed when a request does not say (`max_tokens` / `max_completion_tokens` absent)."""


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One request as every policy sees it; computed once per request."""

    request_id: str
    model: str
    block_hashes: tuple[int, ...]
    """Chain hashes of the prompt's full blocks (`routing.hashing`), first block first."""
    prompt_tokens: int
    """Prompt length, tokens (estimated from text, exact for token-id prompts and traces)."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Output tokens the request may generate (its `max_tokens`, or DEFAULT_MAX_TOKENS)."""
    session: str | None = None
    """Session key (`x-session-id` header, else the OpenAI `user` field): an affinity hint."""
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    """Tokens per block of `block_hashes`."""
    slo_class: str | None = None
    """Service class of the request (`x-zoe-slo` header), for class-aware routing (`routing.slo`); None: default."""
    arrival_s: float | None = None
    """When the request arrived on the driver's clock, seconds (`zoe sim replay`'s virtual clock); None: policies
    that keep time (session pauses) read `time.monotonic()`."""

    @property
    def prefix_blocks(self) -> int:
        return len(self.block_hashes)


@dataclass(slots=True)
class ReplicaView:
    """A replica as the router sees it. Identity and placement come from membership; load counts are the
    router's own (updated by the driver); `stats` is the engine's last /metrics scrape (with its timestamp)."""

    replica_id: str
    """"deployment/index/generation"."""
    url: str
    """Base URL of the engine's OpenAI server, e.g. http://10.0.0.5:8000 (no trailing /v1)."""
    pool: str = "default"
    """Context pool: "long" marks replicas meant for long prompts (see `routing.pools`)."""
    variant: str = ""
    healthy: bool = True
    draining: bool = False
    kv_capacity_tokens: int = 1_000_000
    """KV-cache capacity of the replica, tokens; the prefix index keeps kv_capacity_tokens // block_tokens
    blocks for it, so the router forgets what the engine must have evicted."""
    host_kv_capacity_tokens: int = 0
    """KV tokens the replica's engine also keeps in a host-memory tier (KV offloading: vLLM's offloading
    connector, LMCache, SGLang HiCache), written through from HBM; 0 when it has none. The prefix policy's index
    keeps a set per tier (`PrefixIndex.match_tiers`) and prices a host-tier hit at its transfer cost."""
    max_active_requests: int = 256
    """Requests the replica takes at once before the router counts it as saturated (its max_num_seqs)."""
    active_requests: int = 0
    """Requests routed here and not finished."""
    queued_prefill_tokens: int = 0
    """Prompt tokens routed here whose prefill has not finished (cache hits not counted)."""
    active_decode_tokens: int = 0
    """Context tokens (prompt + expected output) of requests routed here that are past prefill."""
    stats: EngineStats | None = None
    """Last scrape of the engine's /metrics; `stats.scraped_at` says how old it is."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def routable(self) -> bool:
        return self.healthy and not self.draining

    @property
    def saturated(self) -> bool:
        return self.active_requests >= self.max_active_requests

    @property
    def cache_capacity_tokens(self) -> int:
        """Prefix-cache tokens the replica can serve hits from: HBM, or the host tier when it is larger (it holds
        a copy of what HBM holds, so the two do not add up)."""
        return max(self.kv_capacity_tokens, self.host_kv_capacity_tokens)

    def kv_capacity_blocks(self, block_tokens: int) -> int:
        """Prefix-cache capacity (`cache_capacity_tokens`) expressed in blocks of `block_tokens` tokens."""
        return max(1, self.cache_capacity_tokens // max(1, block_tokens))

    def engine_requests(self, max_age_s: float = 5.0, now: float | None = None) -> float | None:
        """running + waiting from a scrape younger than max_age_s, else None."""
        s = self.stats
        if s is None:
            return None
        now = time.time() if now is None else now
        if now - s.scraped_at > max_age_s:
            return None
        return s.running + s.waiting

    # Load accounting: the driver calls these; policies only read the counts.
    def admit(self, ctx: RequestContext, cached_tokens: int = 0) -> None:
        """A request was sent here; its prefill (minus cached tokens) is now queued."""
        self.active_requests += 1
        self.queued_prefill_tokens += max(0, ctx.prompt_tokens - cached_tokens)

    def prefill_done(self, ctx: RequestContext, cached_tokens: int = 0) -> None:
        """The request's first token arrived: its prefill leaves the queue, its context starts decoding."""
        self.queued_prefill_tokens = max(0, self.queued_prefill_tokens - max(0, ctx.prompt_tokens - cached_tokens))
        self.active_decode_tokens += ctx.prompt_tokens + ctx.max_tokens

    def finish(self, ctx: RequestContext, cached_tokens: int = 0, prefilled: bool = True) -> None:
        """The request ended (`prefilled` False when it ended before its first token)."""
        self.active_requests = max(0, self.active_requests - 1)
        if prefilled:
            self.active_decode_tokens = max(0, self.active_decode_tokens - (ctx.prompt_tokens + ctx.max_tokens))
        else:
            self.queued_prefill_tokens = max(
                0, self.queued_prefill_tokens - max(0, ctx.prompt_tokens - cached_tokens)
            )


RoutingReason = Literal[
    "round_robin", "least_load", "prefix", "session", "session_move", "session_hash", "pool_spill", "load_balance",
    "only_choice", "probe"
]


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Where a request goes and why."""

    replica_id: str
    reason: str
    """Why this replica: one of RoutingReason (a metric label, so a small fixed set)."""
    matched_blocks: int = 0
    """Leading prompt blocks the policy believes the replica has cached."""
    spilled: bool = False
    """True when the request left its context pool (pool empty or saturated)."""

    def matched_tokens(self, ctx: RequestContext) -> int:
        return min(ctx.prompt_tokens, self.matched_blocks * ctx.block_tokens)


class BadRequest(ValueError):
    """The request body cannot be routed (the router answers 400 with this message)."""


def _int_field(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadRequest(f"'{name}' must be a non-negative integer")
    return v


def context_from_openai(
    endpoint: Literal["completions", "chat"],
    body: dict[str, Any],
    *,
    request_id: str,
    session_header: str | None = None,
    slo_class: str | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    chat_prompt: TextChain | None = None,
) -> RequestContext:
    """Build the context of an OpenAI /v1/completions ("completions") or /v1/chat/completions ("chat") body.

    `chat_prompt`: the chat prompt's chain when the caller already has it (`routing.chat_prefix`, which parsed
    the body and left `messages` out of it); `block_tokens` must then be the chain's.

    Raises BadRequest naming the field when the body is not a valid request of that kind."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a string")
    if endpoint == "chat" and chat_prompt is not None:
        hashes, tokens = chat_prompt.hashes, chat_prompt.tokens
    elif endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("'tools' must be a list")
        try:
            chain = TextChain(block_tokens).extend(
                [render_tools(tools), *(render_message(i, m) for i, m in enumerate(messages))]
            )
        except ValueError as e:
            raise BadRequest(str(e)) from None
        hashes, tokens = chain.hashes, chain.tokens
    else:
        prompt = body.get("prompt")
        hashes, tokens = _hash_prompt(prompt, block_tokens)
    max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    user = body.get("user")
    session = session_header or (user if isinstance(user, str) and user else None)
    return RequestContext(
        request_id=request_id,
        model=model,
        block_hashes=tuple(hashes),
        prompt_tokens=tokens,
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        session=session,
        block_tokens=block_tokens,
        slo_class=slo_class,
    )


def _hash_prompt(prompt: Any, block_tokens: int) -> tuple[list[int], int]:
    if isinstance(prompt, str):
        return hash_text(prompt, block_tokens), estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return hash_token_ids(prompt, block_tokens), len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        # A batch of prompts: locality follows the first; the load is all of them.
        return hash_text(prompt[0], block_tokens), sum(estimate_tokens(p) for p in prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt) and all(
        isinstance(t, int) and not isinstance(t, bool) for p in prompt for t in p
    ):  # a batch of token-id prompts, as vLLM accepts: locality follows the first
        return hash_token_ids(prompt[0], block_tokens), sum(len(p) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids")


def context_from_trace(
    request_id: str,
    model: str,
    hash_ids: Sequence[int],
    input_tokens: int,
    output_tokens: int,
    session: str | None = None,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    arrival_s: float | None = None,
) -> RequestContext:
    """Context of one trace request (Mooncake: `hash_ids`, `input_length`, `output_length`).

    The last hash id usually covers a partial block; it is kept (the trace marks it reusable only when another
    request repeats it, which makes it a full block in practice)."""
    return RequestContext(
        request_id=request_id,
        model=model,
        block_hashes=tuple(chain_hashes(hash_ids)),
        prompt_tokens=input_tokens,
        max_tokens=output_tokens,
        session=session,
        block_tokens=block_tokens,
        arrival_s=arrival_s,
    )
