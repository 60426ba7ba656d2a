"""Routers that share one picture: each takes the chains its peers inserted into their prefix indexes and the
sessions they routed.

In approximate mode a router learns where prefixes are only from its own decisions: the chain hashes of every
prompt it sends to a replica go into that replica's `PrefixIndex`. Behind a front that spreads requests over
several routers with no regard to content (a plain Kubernetes Service), each router would see a share of every
conversation and route its next turn by load. Sharing closes that gap: every `share_every_s` each router asks each
peer for the chains the peer inserted since the last ask (`picture_delta`, per replica from the index's numbered
log, `PrefixIndex.inserted_since`) and adds them to its own index of the replica (`apply_picture_delta`,
`PrefixIndex.absorb`, which does not log them again: each router publishes only its own decisions, and every
router asks every peer). A router's picture then lags its peers' decisions by at most one period, and its indexes
hold what one router routing every request would hold, in a slightly different recency order.

Session tables are shared the same way (`session_delta`, `apply_session_delta`; `SessionTable.routed_since` and
`absorb`): each live session's latest routing by the peer, with how long ago it was active (an age, not a time:
routers' clocks differ), binds the session to the peer's replica here unless this router routed it more recently
or has a request of it in flight. A router that meets a session's next turn then keeps its affinity as the router
that placed it would, instead of placing it anew. Load stays each router's own (every router observes it from the
engines). Precise mode shares the same way: the engines' KV events correct how much of a replica's index is held,
not which blocks, so each router still learns placement from its own decisions.

What a peer answers is bounded: per replica, at most the index's capacity in blocks (its log is trimmed to that),
and one entry per live session (at most the table's `max_sessions`).

The same functions serve `zoe sim replay --routers N` (`routing.router_fleet`, on the replay's clock) and the live
router (`router.picture_sharing`, over `POST /admin/picture/delta`).

    delta = picture_delta(peer_policy, cursors)                 # {replica_id: (next_seq, [chain, ...])}
    apply_picture_delta(my_policy, views_by_id, block_tokens, delta, cursors)   # advances cursors
    sd = session_delta(peer_policy, session_cursor, now)        # (next_seq, [(session, replica, tokens, age_s)])
    apply_session_delta(my_policy, views_by_id, sd, now); session_cursor = sd[0]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zoe_cluster.routing.context import ReplicaView
from zoe_cluster.routing.sessions import SessionTable

Delta = dict[str, tuple[int, list[Sequence[int]]]]
"""Per replica id: (the number to ask from next time, the chains inserted since the number asked, oldest first)."""
SessionDelta = tuple[int, list[tuple[str, str, int, float]]]
"""(the number to ask from next time, [(session, replica id, context tokens, seconds since active), ...] oldest
first): `SessionTable.routed_since`."""


def _through_wrappers(policy: Any, holds: Any) -> Any:
    seen = 0
    while policy is not None and seen < 8:
        if holds(policy):
            return policy
        policy, seen = getattr(policy, "inner", None), seen + 1
    return None


def indexing_policy(policy: Any) -> Any:
    """The policy that keeps prefix indexes (`index_of` and `index`), looking through wrappers (`inner`); None if
    none does (such a policy has no picture to share)."""
    return _through_wrappers(policy, lambda p: hasattr(p, "index_of") and hasattr(p, "index"))


def session_table(policy: Any) -> SessionTable | None:
    """The `SessionTable` of `policy` (its `sessions`), looking through wrappers; None if it keeps none."""
    pol = _through_wrappers(policy, lambda p: isinstance(getattr(p, "sessions", None), SessionTable))
    return pol.sessions if pol is not None else None


def picture_delta(policy: Any, since: Mapping[str, int], replica_ids: Iterable[str] | None = None) -> Delta:
    """What `policy` inserted into its prefix indexes since `since` (per replica id; a replica not in it: since
    the start of the index's log), for `replica_ids` (default: every replica in `since`)."""
    pol = indexing_policy(policy)
    out: Delta = {}
    if pol is None:
        return out
    for rid in (since if replica_ids is None else replica_ids):
        idx = pol.index_of(rid)
        if idx is None:
            continue
        chains = idx.inserted_since(since.get(rid, 0))
        out[rid] = (idx.next_seq, chains)
    return out


def apply_picture_delta(policy: Any, views: Mapping[str, ReplicaView], block_tokens: int, delta: Delta,
                        cursors: dict[str, int] | None = None) -> int:
    """Add a peer's `delta` to `policy`'s prefix indexes of the replicas in `views` (others are not members here:
    skipped), and move `cursors` (the numbers to ask that peer from next) past it. Returns the chains added."""
    pol = indexing_policy(policy)
    added = 0
    for rid, (next_seq, chains) in delta.items():
        view = views.get(rid)
        if view is None:
            continue
        if cursors is not None:
            cursors[rid] = next_seq
        if pol is None or not chains:
            continue
        pol.index(view, block_tokens).absorb(chains)
        added += len(chains)
    return added


def session_delta(policy: Any, since: int, now: float) -> SessionDelta:
    """The live sessions `policy` routed at number `since` or later (its session table's numbering), aged at `now` on
    `policy`'s clock; (`since`, []) for a policy without a session table."""
    table = session_table(policy)
    if table is None:
        return since, []
    return table.next_seq, table.routed_since(since, now)


def apply_session_delta(policy: Any, views: Mapping[str, ReplicaView], delta: SessionDelta, now: float) -> int:
    """Bind a peer's `delta` in `policy`'s session table at `now` on its clock, for sessions on replicas in `views`
    (others are not members here: skipped). Returns the sessions bound; the caller's cursor becomes `delta[0]`."""
    table = session_table(policy)
    if table is None:
        return 0
    return table.absorb([e for e in delta[1] if e[1] in views], now)
