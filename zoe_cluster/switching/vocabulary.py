"""The switching vocabulary: its configuration, service classes, a decision's inputs and outputs (the fleet's load
is `routing.load_report.LoadReport`, what the routers count).

`decide` (per replica), `mix` (mixed fleets), `classes` (per-class limits), the actuator, the deployment spec and
the replay all speak these types; this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zoe_cluster.replica_state import ReplicaState

__all__ = ["ReplicaObservation", "ServiceClass", "SwitchConfig", "SwitchDecision"]


class ServiceClass(BaseModel):
    """One service class and its objective (a request meets it when TTFT <= ttft_s and ITL <= itl_s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Class name, as requests send it (`x-zoe-slo` header).")
    ttft_s: float = Field(gt=0, description="Time-to-first-token objective, seconds.")
    itl_s: float = Field(gt=0, description="Inter-token latency objective (time per output token), seconds.")


class SwitchConfig(BaseModel):
    """Switching settings of a deployment (validated; part of the deployment spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=True, description="Let the controller swap variants by itself.")
    candidates: list[str] = Field(
        default_factory=list,
        description="Variants the switcher may choose among; empty = every non-speculative variant of the "
        "replica's engine with a decode-by-concurrency profile.",
    )
    window_s: float = Field(default=300.0, gt=0, description="Sliding window of the concurrency estimate, seconds.")
    interval_s: float = Field(default=30.0, gt=0, description="How often the actuator evaluates, seconds.")
    dwell_s: float = Field(default=1800.0, ge=0, description="Least time between two swaps of one replica, s.")
    horizon_s: float = Field(default=7200.0, gt=0, description="Time over which a swap's gain is counted, s.")
    hysteresis: float = Field(default=0.02, ge=0, description="Least relative throughput gain that justifies a swap.")
    drain_s: float = Field(default=60.0, ge=0, description="Expected drain time of a replica before it stops, s.")
    min_ready_fraction: float = Field(default=0.5, ge=0, le=1, description="Never fewer replicas ready than this.")
    max_concurrent_swaps: int = Field(default=1, ge=1, description="Swaps in flight at once (rolling budget).")
    load_time_scale: float = Field(
        default=1.0, gt=0, description="Multiplier on the profile's weights load time (the sim's time scale)."
    )

    classes: list[ServiceClass] = Field(
        default_factory=list,
        description="Service classes with their objectives, tightest first; when set and the driver reports "
        "in-flight requests per class, the switcher targets a mix of variants (`switching.mix`).",
    )
    slo_headroom: float = Field(
        default=0.95, gt=0, le=1,
        description="The router's per-class limits keep a replica's predicted ITL at most this share of the "
        "class's objective (margin for prefill interference and load swings).",
    )

    @model_validator(mode="after")
    def _horizon_covers_dwell(self) -> "SwitchConfig":
        if self.horizon_s < self.interval_s:
            raise ValueError("horizon_s must be at least interval_s")
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"classes: duplicate names in {names}")
        if self.classes and not 2 <= len(self.candidates) <= 4:
            raise ValueError("classes: name 2 to 4 candidates (the mix search covers every split of the replicas "
                             "over them)")
        return self


@dataclass(frozen=True)
class ReplicaObservation:
    index: int
    variant: str
    state: ReplicaState
    concurrency: float
    """Mean concurrent requests on this replica over the window (router's counts)."""
    last_swap_at: float | None = None
    """When this replica last finished a swap (None: never swapped)."""


@dataclass(frozen=True)
class SwitchDecision:
    replica: int
    action: Literal["swap", "hold"]
    variant: str
    """Target variant for a swap; the current variant for a hold."""
    reason: str
    predicted_tok_s_current: float = 0.0
    predicted_tok_s_target: float = 0.0
    gain_tokens: float = 0.0
    cost_tokens: float = 0.0
