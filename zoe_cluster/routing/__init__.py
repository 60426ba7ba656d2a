"""Pure routing decisions shared by the live router (`zoe_cluster.router`) and `zoe sim replay`.

No I/O happens here. A driver (the proxy, or the replay loop on a virtual clock) does this per request:

    from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy

    policy = get_policy("prefix")                 # or "round_robin", "least_load", "session_hash"; tunables as kwargs
    replicas = [ReplicaView("glm/0/1", "http://h0:8000", kv_capacity_tokens=2_000_000), ...]
    ctx = context_from_trace("r1", "glm-5.3", row["hash_ids"], row["input_length"], row["output_length"])
    d = policy.select(ctx, [r for r in replicas if r.routable])   # -> RoutingDecision(replica_id, reason, ...)
    policy.on_routed(ctx, d)
    r = by_id[d.replica_id]; cached = d.matched_tokens(ctx)
    r.admit(ctx, cached)            # request sent
    r.prefill_done(ctx, cached)     # first token out
    r.finish(ctx, cached)           # done;  then policy.on_finished(ctx, r.replica_id, ok=True)

Modules: `hashing` (block hashing, chat rendering, token estimate: the one definition; `TextChain` continues a
chain), `chat_prefix` (`ChatPrefixCache`: a chat body that extends its session's last one is parsed and hashed
only past it), `context` (`RequestContext`, `ReplicaView`, `RoutingDecision`, `context_from_openai`,
`context_from_trace`), `policy`
(`Policy` base, `POLICIES` registry, `get_policy`, `policy_names`), `policies` (the built-in policies and the
prefix score), `prefix_index` (`PrefixIndex`, per-replica LRUs of block hashes, HBM and host tier), `sessions`
(`SessionTable`: each session's replica, thinking or running, its KV), `hash_ring` (`HashRing`, consistent
hashing for `session_hash`), `pools` (context-length pools
and spill-over), `kv_events` (precise mode: corrections from vLLM KV events).
"""

from zoe_cluster.routing.context import (
    BadRequest,
    ReplicaView,
    RequestContext,
    RoutingDecision,
    context_from_openai,
    context_from_trace,
)
from zoe_cluster.routing.hashing import (
    CHARS_PER_TOKEN,
    DEFAULT_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    chain_hashes,
    estimate_tokens,
    hash_text,
    hash_token_ids,
    render_chat,
)
from zoe_cluster.routing.policy import (
    DEFAULT_POLICY,
    POLICIES,
    Policy,
    PolicyConfig,
    PolicyConfigError,
    get_policy,
    policy_names,
    validate_policy_config,
)
from zoe_cluster.routing import policies as _policies  # noqa: E402,F401  (registers the built-in policies)
from zoe_cluster.routing import slo as _slo  # noqa: E402,F401  (registers the class-aware `slo` filter)
from zoe_cluster.routing.policies import LeastLoadPolicy, PrefixPolicy, RoundRobinPolicy, SessionHashPolicy
from zoe_cluster.routing.prefix_index import PrefixIndex

__all__ = [
    "BadRequest", "CHARS_PER_TOKEN", "DEFAULT_BLOCK_TOKENS", "DEFAULT_POLICY", "LeastLoadPolicy",
    "MOONCAKE_BLOCK_TOKENS", "POLICIES", "Policy", "PolicyConfig", "PolicyConfigError", "PrefixIndex",
    "PrefixPolicy", "ReplicaView", "RequestContext", "RoundRobinPolicy", "RoutingDecision", "SessionHashPolicy",
    "chain_hashes",
    "context_from_openai", "context_from_trace", "estimate_tokens", "get_policy", "hash_text", "hash_token_ids",
    "policy_names", "render_chat", "validate_policy_config",
]
