"""`LoadLedger`: the load bookkeeping the live router and the replay share. A request's life moves its replica's
counts and gives them back exactly, a request that ends before its first token gives back its queued prefill, the
policy hears of both ends, and per-class counts follow the class-aware policy's own naming of classes."""

from __future__ import annotations

from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.accounting import LoadLedger


def _ctx(rid: str, blocks: int, slo_class: str | None = None):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    ctx = context_from_trace(rid, "m", list(range(blocks)), blocks * 512, 16, block_tokens=512)
    return replace(ctx, slo_class=slo_class)


def test_a_request_life_moves_the_view_and_gives_everything_back() -> None:
    pol = get_policy("slo", classes={"interactive": {"a": 4}}, default_class="standard")
    views = [ReplicaView("r/0/0", "sim://0", variant="a"), ReplicaView("r/1/0", "sim://1", variant="a")]
    ledger = LoadLedger(pol)
    ctx = _ctx("x", 4, "interactive")
    d = pol.select(ctx, views)
    view = next(v for v in views if v.replica_id == d.replica_id)
    ledger.admit(ctx, d, view, 512)
    assert (view.active_requests, view.queued_prefill_tokens, view.active_decode_tokens) == (1, 3 * 512, 0)
    assert pol.active_by_class(view.replica_id) == {"interactive": 1}
    ledger.prefill_done(ctx, view, 512)
    assert (view.queued_prefill_tokens, view.active_decode_tokens) == (0, 4 * 512 + 16)
    ledger.release(ctx, view, 512, prefilled=True, ok=True)
    assert (view.active_requests, view.queued_prefill_tokens, view.active_decode_tokens) == (0, 0, 0)
    assert pol.active_by_class(view.replica_id) == {}
    assert ledger.in_flight_by_class == {"interactive": 0}
    assert ledger.prefill_tokens_by_class == {"interactive": 3 * 512}  # cumulative


def test_an_unprefilled_release_returns_the_queued_prefill_and_classes_follow_the_policy() -> None:
    pol = get_policy("slo", classes={"interactive": {"a": 4}}, default_class="standard")
    view = ReplicaView("r/0/0", "sim://0", variant="a")
    ledger = LoadLedger(pol)
    a, b = _ctx("a", 2), _ctx("b", 3, "no-such-class")  # both are the policy's default class
    for ctx in (a, b):
        ledger.admit(ctx, pol.select(ctx, [view]), view, 0)
    assert ledger.in_flight_by_class == {"standard": 2}
    assert view.queued_prefill_tokens == 5 * 512
    ledger.release(b, view, 0, prefilled=False, ok=False)
    assert view.queued_prefill_tokens == 2 * 512 and view.active_requests == 1
    assert ledger.in_flight_by_class == {"standard": 1}
    assert ledger.prefill_tokens_by_class == {"standard": 5 * 512}


def test_a_policy_without_classes_counts_the_class_each_request_names() -> None:
    ledger = LoadLedger(get_policy("round_robin"))
    view = ReplicaView("r/0/0", "sim://0")
    for ctx in (_ctx("a", 1), _ctx("b", 1, "batch")):
        ledger.admit(ctx, ledger.policy.select(ctx, [view]), view, 0)
    assert ledger.in_flight_by_class == {"": 1, "batch": 1}


def test_the_report_is_the_ledgers_count_and_reports_add_up() -> None:
    """`report` is what `GET /admin/load` answers and the switcher reads: every view's in-flight count (idle ones at
    0) and the per-class counts; the controller adds several routers' reports key by key."""
    from zoe_cluster.routing.load_report import LoadReport

    pol = get_policy("slo", classes={"interactive": {"a": 4}}, default_class="standard")
    views = [ReplicaView("r/0/0", "sim://0", variant="a"), ReplicaView("r/1/0", "sim://1", variant="a")]
    ledger = LoadLedger(pol)
    for ctx in (_ctx("x", 4, "interactive"), _ctx("y", 2)):
        ledger.admit(ctx, pol.select(ctx, views[:1]), views[0], 512)
    report = ledger.report(views)
    assert report == LoadReport(in_flight={"r/0/0": 2, "r/1/0": 0},
                                in_flight_by_class={"interactive": 1, "standard": 1},
                                prefill_tokens_by_class={"interactive": 3 * 512, "standard": 512})
    assert LoadReport.model_validate_json(report.model_dump_json()) == report
    other = LoadReport(in_flight={"r/1/0": 3}, in_flight_by_class={"standard": 3}, prefill_tokens_by_class={})
    assert LoadReport.summed([report, other]) == LoadReport(
        in_flight={"r/0/0": 2, "r/1/0": 3}, in_flight_by_class={"interactive": 1, "standard": 4},
        prefill_tokens_by_class={"interactive": 3 * 512, "standard": 512})
    assert LoadReport.summed([]) == LoadReport()
