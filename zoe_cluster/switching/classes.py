"""Service classes: per-class latency objectives, and what they imply for each variant.

A class is a TTFT and an inter-token-latency (ITL) objective that a share of the traffic asks for. From a
variant's measured decode profile (seed table A8 via `predict.replica_tok_s`) the per-user ITL of a replica holding n
requests is n / T_v(n); `class_limit` is the largest n whose predicted ITL stays within `headroom` x the
objective. Those limits feed the router's `slo` policy (`slo_policy_config`) and the mix decision
(`switching.mix`), so the router and the switcher agree on which replica can serve which class.
"""

from __future__ import annotations

from zoe_cluster.recipes import Recipe
from zoe_cluster.switching.predict import predicted_itl_s
from zoe_cluster.switching.vocabulary import ServiceClass

__all__ = ["ServiceClass", "class_limit", "class_limits", "predicted_itl_s", "slo_policy_config"]


def class_limit(recipe: Recipe, variant: str, itl_s: float, headroom: float = 0.95) -> int:
    """Most requests a replica of `variant` may hold while its predicted ITL stays <= headroom * itl_s (0: none).

    ITL grows with the batch (seed table A8), so the first n past the objective ends the search."""
    cap = recipe.variant(variant).max_num_seqs
    n = 0
    while n < cap and predicted_itl_s(recipe, variant, n + 1) <= headroom * itl_s:
        n += 1
    return n


def class_limits(recipe: Recipe, classes: list[ServiceClass], variants: list[str],
                 headroom: float = 0.95) -> dict[str, dict[str, int]]:
    """Class -> {variant: limit} for the variants that can serve the class at all, the variant that holds the
    most requests of the class first (the router's order of preference)."""
    out: dict[str, dict[str, int]] = {}
    for c in classes:
        limits = {v: class_limit(recipe, v, c.itl_s, headroom) for v in variants}
        out[c.name] = {v: n for v, n in sorted(limits.items(), key=lambda kv: -kv[1]) if n > 0}
    return out


def slo_policy_config(recipe: Recipe, classes: list[ServiceClass], variants: list[str], headroom: float = 0.95,
                      default_class: str | None = None, inner: str = "prefix") -> dict:
    """Options of the router's `slo` policy (`get_policy("slo", **options)`) for these classes and variants."""
    return {"inner": inner, "classes": class_limits(recipe, classes, variants, headroom),
            "default_class": default_class or classes[-1].name}
