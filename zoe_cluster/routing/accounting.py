"""The router's load bookkeeping of a request, one implementation for the live router (`zoe_cluster.router.app`)
and the replay on the virtual clock (`zoe_cluster.sim.replay`).

Per request on the replica a policy chose, a driver calls:

    ledger.admit(ctx, decision, view, cached_tokens)                    # sent
    ledger.prefill_done(ctx, view, cached_tokens)                       # first token out
    ledger.release(ctx, view, cached_tokens, prefilled=..., ok=...)     # ended, completed or not

and the ledger tells the policy (`on_routed`, `on_finished`), moves the `ReplicaView`'s load counts (`admit`,
`prefill_done`, `finish`) and counts requests in flight and uncached prompt tokens per service class, the class
the policy says a request counts in (`Policy.class_of`; what the recipe switcher's per-class mix reads). `cached_tokens` is what the router expected the replica's prefix cache to
serve (`decision.matched_tokens(ctx)`), the same number on all three calls.

`report(views)` is the ledger's count as the typed `routing.load_report.LoadReport`: the live router answers it at
`GET /admin/load`, and the switcher reads nothing else (the policies' `describe()` is debug output).
"""

from __future__ import annotations

from collections.abc import Iterable

from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision
from zoe_cluster.routing.load_report import LoadReport
from zoe_cluster.routing.policy import Policy


class LoadLedger:
    """Load accounting of one router (or one replay) over its replicas' views."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.in_flight_by_class: dict[str, int] = {}
        """Requests in flight per class (a class seen once stays, at 0 when idle)."""
        self.prefill_tokens_by_class: dict[str, int] = {}
        """Prompt tokens routed per class that the router expected to miss the prefix cache (cumulative)."""

    def admit(self, ctx: RequestContext, decision: RoutingDecision, view: ReplicaView, cached_tokens: int) -> None:
        """`ctx` was sent to `view` (the replica `decision` chose)."""
        self.policy.on_routed(ctx, decision)
        view.admit(ctx, cached_tokens)
        cls = self.policy.class_of(ctx)
        self.in_flight_by_class[cls] = self.in_flight_by_class.get(cls, 0) + 1
        self.prefill_tokens_by_class[cls] = (self.prefill_tokens_by_class.get(cls, 0)
                                             + max(0, ctx.prompt_tokens - cached_tokens))

    def prefill_done(self, ctx: RequestContext, view: ReplicaView, cached_tokens: int) -> None:
        """`ctx`'s first token came out of `view`."""
        view.prefill_done(ctx, cached_tokens)

    def release(self, ctx: RequestContext, view: ReplicaView, cached_tokens: int, *, prefilled: bool,
                ok: bool) -> None:
        """`ctx` left `view`: completed (`ok`) or not; `prefilled` when its first token had come out."""
        view.finish(ctx, cached_tokens, prefilled=prefilled)
        cls = self.policy.class_of(ctx)
        self.in_flight_by_class[cls] = max(0, self.in_flight_by_class.get(cls, 0) - 1)
        self.policy.on_finished(ctx, view.replica_id, ok)

    def report(self, views: Iterable[ReplicaView]) -> LoadReport:
        """The load now: in flight on each of `views` (the replicas this ledger admits to) and the per-class counts."""
        return LoadReport(in_flight={v.replica_id: v.active_requests for v in views},
                          in_flight_by_class=dict(self.in_flight_by_class),
                          prefill_tokens_by_class=dict(self.prefill_tokens_by_class))
