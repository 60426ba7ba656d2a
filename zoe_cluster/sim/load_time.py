"""How long a simulated replica takes to load its weights: quickly by default, or as the recipe estimates.

`fast` (the default of `zoe sim serve` and of `zoe deploy` on the simulated engine) loads in `FAST_LOAD_S`
simulated seconds, so a deployment on a laptop serves within seconds. `real` takes the variant's
`profile.weights_load_s`, the recipe's estimate of a real engine's start (minutes for these checkpoints): what a
question about the cost of restarting or swapping a replica needs. `zoe sim replay` and the switching evaluation
(bench/switching, through `sim.replay`) always model swaps with the real load time.
"""

from __future__ import annotations

from typing import Literal

from zoe_cluster.recipes import Recipe

LoadTime = Literal["fast", "real"]
LOAD_TIMES: tuple[str, ...] = LoadTime.__args__  # type: ignore[attr-defined]

FAST_LOAD_S = 2.0
"""Simulated seconds a `fast` replica spends loading: long enough to show the loading state, short for a demo."""


def real_load_s(recipe: Recipe, variant: str) -> float | None:
    """The variant's estimated weights load time in seconds (`profile.weights_load_s`), None when not given."""
    load = recipe.variant(variant).profile.weights_load_s
    return load.value if load else None


def load_s(recipe: Recipe, variant: str, load_time: LoadTime) -> float:
    """Simulated seconds from process start to ready for `load_time`; a variant without an estimate loads at once
    in `real` mode (there is nothing to model)."""
    if load_time == "fast":
        return FAST_LOAD_S
    if load_time == "real":
        return real_load_s(recipe, variant) or 0.0
    raise ValueError(f"load time must be one of {', '.join(LOAD_TIMES)}, got {load_time!r}")
