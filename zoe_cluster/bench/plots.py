"""PNG plots of bench reports, drawn like the seed's serving figures: TTFT by input length with one line per
hit rate and mean +/- std error bars (Fig. 13/14), decode tok/s per user and per node by concurrency as bars
with std error bars (Fig. 15-17), trace latency distributions, and two reports side by side (`compare`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from zoe_cluster.bench.report import BenchReport  # noqa: E402
from zoe_cluster.bench.sizes import format_tokens  # noqa: E402

COLORS = ["#1f4e79", "#c55a11", "#548235", "#7030a0", "#bf9000", "#2e75b6"]


def _mean_std(summary: dict | None) -> tuple[float, float]:
    if not summary or summary.get("mean") is None:
        return float("nan"), 0.0
    return float(summary["mean"]), float(summary.get("std") or 0.0)


def _log_y_if_positive(ax, values) -> None:
    """Log y axis when there is data to put on it (a sweep where every request failed has none)."""
    if any(v == v and v > 0 for v in values):
        ax.set_yscale("log")


def _finish(fig, path: str | Path, title: str) -> Path:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_prefill(report: BenchReport, path: str | Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    hit_rates = sorted({row["hit_rate_target"] for row in report.rows})
    lengths = sorted({row["input_len"] for row in report.rows})
    for i, h in enumerate(hit_rates):
        rows = sorted((r for r in report.rows if r["hit_rate_target"] == h), key=lambda r: r["input_len"])
        xs = [r["input_len"] for r in rows]
        ms = [_mean_std(r["ttft_s"]) for r in rows]
        seen = [r.get("engine_hit_rate") for r in rows if r.get("engine_hit_rate") is not None]
        label = f"{h:.0%} hit rate" + (f" (engine saw {np.mean(seen):.0%})" if seen else "")
        ax.errorbar(xs, [m for m, _ in ms], yerr=[s for _, s in ms], marker="o", capsize=3, color=COLORS[i % 6],
                    label=label)  # fmt: skip
    ax.set_xscale("log", base=2)
    _log_y_if_positive(ax, [_mean_std(r["ttft_s"])[0] for r in report.rows])
    ax.set_xticks(lengths, [format_tokens(n) for n in lengths])
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("TTFT (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    runs = report.config.get("runs")
    return _finish(fig, path, f"{report.label}: single-request TTFT, OSL=1, mean ± std over {runs} runs")


def plot_decode(report: BenchReport, path: str | Path) -> Path:
    rows = sorted(report.rows, key=lambda r: r["concurrency"])
    conc = [r["concurrency"] for r in rows]
    x = np.arange(len(conc))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title, color in (
        (axes[0], "per_user_tok_s", "per-user tok/s", COLORS[0]),
        (axes[1], "per_node_tok_s", "per-node tok/s", COLORS[1]),
    ):
        ms = [_mean_std(r[key]) for r in rows]
        ax.bar(x, [m for m, _ in ms], yerr=[s for _, s in ms], capsize=3, color=color)
        for xi, (m, _) in zip(x, ms):
            if m == m:
                ax.annotate(f"{m:.0f}", (xi, m), ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")  # fmt: skip
        ax.set_xticks(x, [str(c) for c in conc])
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(title)
        ax.grid(True, axis="y", alpha=0.3)
    cfg = report.config
    return _finish(
        fig, path,
        f"{report.label}: decode, prompt {cfg.get('prompt_label')}, OSL={cfg.get('output_len')}, "
        f"mean ± std over {cfg.get('runs')} runs",
    )  # fmt: skip


def plot_trace(report: BenchReport, path: str | Path) -> Path:
    recs = [r for r in report.requests if r.get("ok")]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, name in ((axes[0], "ttft_s", "TTFT (s)"), (axes[1], "e2e_s", "end-to-end (s)")):
        vals = np.sort([r[key] for r in recs if r.get(key) is not None])
        if len(vals):
            ax.plot(vals, np.arange(1, len(vals) + 1) / len(vals), color=COLORS[0])
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
    pts = [(r["sent_s"], r["ttft_s"]) for r in recs if r.get("ttft_s") is not None]
    if pts:
        axes[2].scatter(*zip(*pts), s=4, color=COLORS[1])
    axes[2].set_xlabel("time sent (s)")
    axes[2].set_ylabel("TTFT (s)")
    axes[2].grid(True, alpha=0.3)
    row = report.rows[0]
    hit = row.get("engine_hit_rate")
    return _finish(
        fig, path,
        f"{report.label}: trace {report.config.get('trace_name')}, {row['completed']}/{row['requests']} requests, "
        f"engine hit rate {'n/a' if hit is None else f'{hit:.1%}'}",
    )  # fmt: skip


def plot_report(report: BenchReport, path: str | Path) -> Path:
    return {"prefill": plot_prefill, "decode": plot_decode, "trace": plot_trace}[report.kind](report, path)


def plot_comparison(a: BenchReport, b: BenchReport, cells: list[dict], path: str | Path) -> Path:
    """Grouped bars of A and B per cell (mean +/- std) with the B/A ratio written above each pair."""
    metrics = sorted({c["metric"] for c in cells}, key=lambda m: [c["metric"] for c in cells].index(m))
    fig, axes = plt.subplots(len(metrics), 1, figsize=(max(7, 0.8 * len(cells) / max(len(metrics), 1) + 3),
                                                      3.4 * len(metrics)), squeeze=False)  # fmt: skip
    for ax, metric in zip(axes[:, 0], metrics):
        rows = [c for c in cells if c["metric"] == metric]
        x = np.arange(len(rows))
        w = 0.38
        ax.bar(x - w / 2, [c["a_mean"] for c in rows], w, yerr=[c["a_std"] or 0 for c in rows], capsize=2,
               color=COLORS[0], label=a.label)  # fmt: skip
        ax.bar(x + w / 2, [c["b_mean"] for c in rows], w, yerr=[c["b_std"] or 0 for c in rows], capsize=2,
               color=COLORS[1], label=b.label)  # fmt: skip
        for xi, c in zip(x, rows):
            if c["ratio"] is not None:
                top = max(c["a_mean"] + (c["a_std"] or 0), c["b_mean"] + (c["b_std"] or 0))
                ax.annotate(f"{c['ratio']:.2f}x", (xi, top), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")  # fmt: skip
        ax.set_xticks(x, [c["cell"] for c in rows], rotation=30 if len(rows) > 6 else 0, fontsize=8)
        ax.set_ylabel(metric)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        if not rows[0]["higher_is_better"] and len(rows) > 1:
            # latencies span decades across input lengths, as in the seed's Fig. 14
            _log_y_if_positive(ax, [c["a_mean"] for c in rows] + [c["b_mean"] for c in rows])
    return _finish(fig, path, f"{b.label} vs {a.label} ({a.kind}); labels are B/A")
