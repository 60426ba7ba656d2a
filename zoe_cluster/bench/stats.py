"""Summary statistics every report uses: mean, sample std, min/max and percentiles of a list of values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """`{n, mean, std, min, max, p50, p90, p95, p99}`; std is the sample std (ddof=1; 0 for one value);
    all fields but n are None for an empty list."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None, **{f"p{p}": None for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | int | None] = {
        "n": n,
        "mean": float(arr.mean()),
        "std": float(arr.std(ddof=1)) if n > 1 else 0.0,
        "min": float(arr.min()),
        "max": float(arr.max()),
    }
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out
