"""The load a router counts, as one typed report: what `GET /admin/load` answers and what the recipe switcher reads.

A router's `routing.accounting.LoadLedger` is the single source (`LoadLedger.report`): it moves every replica's
in-flight count and counts requests in flight and uncached prompt tokens per service class, for every policy.
The deployment controller reads the report of its own router (`cluster.router_link.RouterLink.load`) and of every
router pod of a Helm release (`k8s.routers.MembershipFanout.load`), and `LoadReport.summed` adds them into the
fleet's load (`cluster.fleet_load`), which `switching.loop.SwitchLoop` hands to the actuator; `zoe sim replay`'s
fleet reads the same ledger.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field


class LoadReport(BaseModel):
    """The load counted by one router, or by several summed, at one moment."""

    model_config = ConfigDict(frozen=True)

    in_flight: dict[str, int] = Field(
        default_factory=dict, description="Requests in flight per replica id ('deployment/index/generation'), "
        "every replica of the router's membership (0 when idle).")
    in_flight_by_class: dict[str, int] = Field(
        default_factory=dict, description="Requests in flight per service class, as the router's policy names the "
        "class (the class-aware `slo` policy maps unknown or missing classes to its default class; other policies "
        "count the `x-zoe-slo` header's class, '' for none). A class counted once stays, at 0 when idle.")
    prefill_tokens_by_class: dict[str, int] = Field(
        default_factory=dict, description="Prompt tokens routed per service class that the router expected to miss "
        "the replica's prefix cache, cumulative since the router started (the switcher turns it into a rate).")

    @classmethod
    def summed(cls, reports: Iterable[LoadReport]) -> LoadReport:
        """Several routers' reports added key by key (each router counts only the traffic it routed)."""
        totals: dict[str, dict[str, int]] = {name: {} for name in cls.model_fields}
        for report in reports:
            for name, total in totals.items():
                for key, n in getattr(report, name).items():
                    total[key] = total.get(key, 0) + n
        return cls(**totals)
