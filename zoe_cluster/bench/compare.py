"""Comparing two reports of the same workload cell by cell: B/A ratios of each measured quantity.

Cells are matched by their key (prefill: input length and target hit rate; decode: concurrency; trace: the
whole run); cells present in only one report are listed as unmatched. For latencies lower is better, for
throughputs higher is better, and `speedup` is always oriented so that > 1 means B is better than A (the
seed's "ZOE vs baseline" speedups put the baseline as A)."""

from __future__ import annotations

from typing import Any

from zoe_cluster.bench.report import BenchReport
from zoe_cluster.bench.sizes import format_tokens

# (metric, higher is better) per workload kind.
METRICS: dict[str, list[tuple[str, bool]]] = {
    "prefill": [("ttft_s", False)],
    "decode": [("per_user_tok_s", True), ("per_node_tok_s", True)],
    "trace": [("ttft_s", False), ("e2e_s", False), ("output_tok_s", True)],
}


def _key_and_label(kind: str, row: dict[str, Any]) -> tuple[Any, str]:
    if kind == "prefill":
        label = f"{format_tokens(row['input_len'])} @ {row['hit_rate_target']:.0%}"
        return (row["input_len"], row["hit_rate_target"]), label
    if kind == "decode":
        return row["concurrency"], f"C={row['concurrency']}"
    return "all", "trace"


def _mean_std(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, dict):
        return value.get("mean"), value.get("std")
    return (float(value), None) if value is not None else (None, None)


def compare_reports(a: BenchReport, b: BenchReport) -> tuple[list[dict], list[str]]:
    """(cells, unmatched cell labels). Each cell: cell, metric, a_mean, a_std, b_mean, b_std, ratio (B/A),
    speedup (> 1 when B is better). Raises ValueError when the reports are of different workloads."""
    if a.kind != b.kind:
        raise ValueError(f"cannot compare a {a.kind} report with a {b.kind} report")
    a_rows = {(_key_and_label(a.kind, r)[0]): r for r in a.rows}
    b_rows = {(_key_and_label(b.kind, r)[0]): r for r in b.rows}
    cells, unmatched = [], []
    for key, row_a in a_rows.items():
        label = _key_and_label(a.kind, row_a)[1]
        if key not in b_rows:
            unmatched.append(f"{label} (only in A)")
            continue
        for metric, higher_better in METRICS[a.kind]:
            a_mean, a_std = _mean_std(row_a.get(metric))
            b_mean, b_std = _mean_std(b_rows[key].get(metric))
            if a_mean is None or b_mean is None:
                continue
            ratio = b_mean / a_mean if a_mean else None
            speedup = None
            if ratio:
                speedup = ratio if higher_better else 1.0 / ratio
            cells.append(
                dict(cell=label, metric=metric, a_mean=a_mean, a_std=a_std, b_mean=b_mean, b_std=b_std,
                     ratio=ratio, speedup=speedup, higher_is_better=higher_better)
            )  # fmt: skip
    unmatched += [f"{_key_and_label(b.kind, r)[1]} (only in B)" for k, r in b_rows.items() if k not in a_rows]
    return cells, unmatched
