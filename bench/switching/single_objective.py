"""The first switching evaluation (one objective for all traffic): always-FP8 vs always-MXFP4 vs switching.

Kept for comparison with the service-class evaluation in `evaluate.py`; run it with
`.venv/bin/python bench/switching/evaluate.py --single-objective`.


Each scenario replays one trace through simulated GLM-5.3 replicas (zoe_cluster.sim.replay) three times: every
replica fixed on variant A, every replica fixed on variant B, and switching, where the live controller's
`SwitchActuator` (calling the same `decide`) runs every 30 simulated seconds against the replay's fleet. A swap is
drain-first and takes the replica away for its weights load time (recipe profile, an estimate: see recipes/).

    .venv/bin/python bench/switching/evaluate.py --single-objective   # results_single_objective.json, *.png

Scenarios: a day-shaped load (concurrency 1 -> 64 -> 2 across two replicas, chat sessions with a shared system
prompt) and the Azure LLM conversation trace (third_party/traces) with timestamps compressed 1.5x to raise its
concurrency. Goodput counts output tokens of requests whose TTFT and time per output token (ITL) met the SLO.
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402
from rich.table import Table  # noqa: E402

from zoe_cluster.bench.traces import load_azure  # noqa: E402
from zoe_cluster.recipes import RecipeRegistry  # noqa: E402
from zoe_cluster.sim.replay import ReplayResult, SimReplayConfig, replay, rows_from  # noqa: E402
from zoe_cluster.switching import SwitchConfig  # noqa: E402
from zoe_cluster.switching.actuator import SwitchActuator  # noqa: E402
from zoe_cluster.switching.workload import day_shaped_rows, ramp  # noqa: E402

OUT = Path(__file__).resolve().parent
TRACES = Path(__file__).resolve().parents[2] / "third_party" / "traces"
H = 3600.0
SLO_TTFT_S = 2.0
SLO_TPOT_S = 0.030
TPOT_SWEEP_MS = [16, 18, 20, 22, 24, 26, 28, 30, 35, 40]
TICK_S = 30.0


def goodput(result: ReplayResult, ttft_slo: float, tpot_slo: float) -> float:
    good = sum(out for _, ttft, tpot, out, *_ in result.request_log if ttft <= ttft_slo and tpot <= tpot_slo)
    return good / result.simulated_s if result.simulated_s > 0 else 0.0


def phase_tpot_ms(result: ReplayResult, t0: float, t1: float) -> float:
    vals = sorted(tpot for arr, _, tpot, out, *_ in result.request_log if t0 <= arr < t1 and out > 1)
    return 1000 * vals[len(vals) // 2] if vals else math.nan


def run_three(recipe, rows, replicas, a, b, cfg, label, progress, task):
    runs = {}
    for name, variants, controlled in ((f"always {a}", [a] * replicas, False),
                                       (f"always {b}", [b] * replicas, False),
                                       ("switching", [a] * replicas, True)):
        holder: dict = {}

        def ctl(fleet, holder=holder):
            if "actuator" not in holder:
                holder["actuator"] = SwitchActuator(recipe, cfg, fleet, clock=lambda: fleet.now)
            holder["actuator"].step()

        t = time.perf_counter()
        res = replay(SimReplayConfig(recipe, a, replicas, "prefix", variants=variants, tick_s=TICK_S,
                                     controller=ctl if controlled else (lambda fleet: None), slo_ttft_s=SLO_TTFT_S,
                                     slo_tpot_s=SLO_TPOT_S, log_requests=True), rows)
        decisions = [
            {"t_s": r.at, "replica": r.decision.replica, "action": r.decision.action, "variant": r.decision.variant,
             "reason": r.decision.reason}
            for r in holder["actuator"].history if r.decision.action == "swap"
        ] if controlled else []
        runs[name] = (res, decisions, time.perf_counter() - t)
        progress.advance(task)
    return runs


def summarize(runs, phases):
    out = {}
    for name, (res, decisions, wall) in runs.items():
        out[name] = {
            "requests": res.requests, "completed": res.completed, "dropped": res.dropped, "swaps": res.swaps,
            "output_tok_s": round(res.output_tok_s, 2),
            "goodput_tok_s": round(goodput(res, SLO_TTFT_S, SLO_TPOT_S), 2),
            "ttft_p50_s": round(res.ttft_p50_s, 3), "ttft_p90_s": round(res.ttft_p90_s, 3),
            "tpot_p50_ms": round(1000 * res.tpot_p50_s, 2), "tpot_p90_ms": round(1000 * res.tpot_p90_s, 2),
            "prefix_hit_rate": round(res.prefix_hit_rate, 4), "preemptions": res.preemptions,
            "goodput_by_tpot_slo_ms": {ms: round(goodput(res, SLO_TTFT_S, ms / 1000), 2) for ms in TPOT_SWEEP_MS},
            "tpot_p50_ms_by_phase": {p: round(phase_tpot_ms(res, t0, t1), 2) for p, (t0, t1) in phases.items()},
            "swap_decisions": decisions, "wall_s": round(wall, 2),
        }
    return out


def max_swaps_per_window(decisions, dwell_s):
    worst = 0
    for d in decisions:
        same = [e for e in decisions if e["replica"] == d["replica"] and 0 <= e["t_s"] - d["t_s"] < dwell_s]
        worst = max(worst, len(same))
    return worst


def plot_timeline(runs, target, title, path, replicas):
    sw = runs["switching"][0]
    t = [row["t_s"] / H for row in sw.timeline]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ax = axes[0]
    ax.plot(t, [row["in_flight"] for row in sw.timeline], lw=1, label="requests in flight (switching run)")
    if target is not None:
        ax.plot(t, [target(x * H) for x in t], "k--", lw=1, label="target concurrency")
    ax.set_ylabel("concurrency")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    names = sorted({v for row in sw.timeline for v in row["variants"]})
    stacks = []
    for name in names:
        stacks.append([sum(1 for v, s in zip(row["variants"], row["states"]) if v == name and s == "ready")
                       for row in sw.timeline])
    away = [sum(1 for s in row["states"] if s != "ready") for row in sw.timeline]
    ax.stackplot(t, *stacks, away, labels=[f"{n} (ready)" for n in names] + ["draining / loading"],
                 colors=["tab:blue", "tab:orange", "tab:grey"][: len(names) + 1], alpha=0.8)
    ax.set_ylim(0, replicas)
    ax.set_ylabel("replicas")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    for name, (res, _, _) in runs.items():
        bins: dict[int, list[float]] = {}
        for arr, _, tpot, out, *_ in res.request_log:
            if out > 1:
                bins.setdefault(int(arr // 600), []).append(tpot)
        xs = sorted(bins)
        ax.plot([(x + 0.5) / 6 for x in xs], [1000 * sorted(bins[x])[len(bins[x]) // 2] for x in xs], lw=1.2,
                label=name)
    ax.set_ylabel("ITL p50, ms/token (10-min bins)")
    ax.set_xlabel("simulated hours")
    ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_goodput(summaries, path):
    fig, axes = plt.subplots(1, len(summaries), figsize=(6 * len(summaries), 4.2))
    for ax, (scenario, summary) in zip(axes, summaries.items()):
        for name, s in summary.items():
            ys = [s["goodput_by_tpot_slo_ms"][ms] for ms in TPOT_SWEEP_MS]
            ax.plot(TPOT_SWEEP_MS, ys, marker="o", ms=3, label=name)
        ax.set_title(f"{scenario}: goodput (TTFT <= {SLO_TTFT_S:g} s)")
        ax.set_xlabel("ITL objective (ms per output token)")
        ax.set_ylabel("goodput, output tok/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(console: Console) -> None:
    glm = RecipeRegistry.default().get("glm-5.3")
    cfg = SwitchConfig(candidates=["fp8-tp8-nightly", "mxfp4-tp8"], window_s=300, interval_s=TICK_S, dwell_s=1800,
                       horizon_s=7200, drain_s=60)
    cfg_fused = cfg.model_copy(update={"candidates": ["fp8-tp8-fused-moe", "mxfp4-tp8"]})
    target = ramp([(0, 1), (1.5 * H, 2), (3 * H, 64), (5 * H, 64), (6.5 * H, 4), (8 * H, 2)])
    day = day_shaped_rows(glm, "fp8-tp8-nightly", target, 8 * H, replicas=2, input_blocks=(1, 2),
                          history_blocks=4, output_tokens=(512, 1536))
    azure_raw = load_azure(TRACES / "azure2023_conv.csv")
    compress = 1.5  # about 20 requests in flight per replica: inside seed table A8's measured range (1-32)
    azure = rows_from((r.arrival_s / compress, r.input_len, max(1, r.output_len),
                       tuple(range(10_000_000 + 1000 * r.index, 10_000_000 + 1000 * r.index + max(1, r.input_len // 512))))
                      for r in azure_raw)
    day_phases = {"low (0-1.5 h)": (0, 1.5 * H), "peak (3-5 h)": (3 * H, 5 * H), "evening (6.5-8 h)": (6.5 * H, 8 * H)}
    span = azure[-1].arrival_s
    azure_phases = {"whole trace": (0, span + 1)}
    results: dict = {}
    with Progress(console=console) as progress:
        task = progress.add_task("replaying 3 scenarios x 3 strategies", total=9)
        day_runs = run_three(glm, day, 2, "fp8-tp8-nightly", "mxfp4-tp8", cfg, "day", progress, task)
        fused_runs = run_three(glm, day, 2, "fp8-tp8-fused-moe", "mxfp4-tp8", cfg_fused, "day-fused", progress, task)
        azure_runs = run_three(glm, azure, 2, "fp8-tp8-nightly", "mxfp4-tp8", cfg, "azure", progress, task)
    results["day: fp8-tp8-nightly vs mxfp4-tp8"] = summarize(day_runs, day_phases)
    results["day: fp8-tp8-fused-moe vs mxfp4-tp8"] = summarize(fused_runs, day_phases)
    results["azure conv x1.5: fp8-tp8-nightly vs mxfp4-tp8"] = summarize(azure_runs, azure_phases)
    for scenario, summary in results.items():
        sw = summary["switching"]
        sw["max_swaps_per_replica_per_dwell_window"] = max_swaps_per_window(sw["swap_decisions"], cfg.dwell_s)
    plot_timeline(day_runs, target, "GLM-5.3, 2 simulated replicas: day-shaped load, switching FP8 <-> MXFP4",
                  OUT / "single_objective_day.png", 2)
    plot_timeline(azure_runs, None, "GLM-5.3, 2 simulated replicas: Azure conversation trace, 1.5x compressed",
                  OUT / "single_objective_azure.png", 2)
    plot_goodput({k.split(":")[0] + ": " + k.split(": ")[1].split(" vs ")[0]: v for k, v in results.items()},
                 OUT / "single_objective_goodput.png")
    doc = {
        "command": "python bench/switching/evaluate.py --single-objective",
        "python": sys.version.split()[0], "machine": platform.machine(),
        "slo": {"ttft_s": SLO_TTFT_S, "tpot_s": SLO_TPOT_S},
        "config": cfg.model_dump(), "scenarios": results,
        "notes": "simulated engine calibrated to seed tables A5/A7/A8; weights load times are recipe estimates",
    }
    (OUT / "results_single_objective.json").write_text(json.dumps(doc, indent=1))
    for scenario, summary in results.items():
        t = Table(title=scenario)
        for col in ("strategy", "tok/s", f"goodput (ITL<={SLO_TPOT_S * 1000:g}ms)", "TTFT p50/p90 s",
                    "ITL p50/p90 ms", "ITL p50 by phase (ms)", "dropped", "swaps"):
            t.add_column(col)
        for name, s in summary.items():
            t.add_row(name, f"{s['output_tok_s']:.1f}", f"{s['goodput_tok_s']:.1f}",
                      f"{s['ttft_p50_s']:.2f}/{s['ttft_p90_s']:.2f}", f"{s['tpot_p50_ms']:.1f}/{s['tpot_p90_ms']:.1f}",
                      ", ".join(f"{v:.1f}" for v in s["tpot_p50_ms_by_phase"].values()), str(s["dropped"]),
                      str(s["swaps"]))
        console.print(t)

