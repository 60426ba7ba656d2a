"""The agentic throughput-interactivity plot: output tok/s per GPU against p90 tok/s per user, one point per
concurrency (live sessions), one line per configuration, as InferenceX draws its Pareto fronts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from zoe_cluster.bench.plots import COLORS, _finish  # noqa: E402


def plot_sweep(series: dict[str, list[dict[str, Any]]], path: str | Path, title: str) -> Path:
    """`series` maps a label to agentic reports of one concurrency sweep (`metrics.summarize` fields with
    `live_sessions`); points without both figures are left out."""
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (label, reports) in enumerate(series.items()):
        pts = sorted((r["tok_s_per_user_p90"], r["output_tok_s_per_gpu"], r["live_sessions"]) for r in reports
                     if r.get("tok_s_per_user_p90") and r.get("output_tok_s_per_gpu"))
        if not pts:
            continue
        color = COLORS[i % len(COLORS)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label)
        for x, y, n in pts:
            ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    ax.set_xlabel("p90 interactivity: tok/s per user (1 / p90 inter-token latency)")
    ax.set_ylabel("output tok/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig, path, title)
