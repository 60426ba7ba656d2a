"""Recipe switching on the simulated engine, with service classes: fixed recipes, a fixed mix, and switching.

Traffic comes in two service classes (stated up front, not fitted; `CLASSES`):
  interactive  ITL <= 20 ms (50 tok/s per user), TTFT <= 1 s: agents and coding tools whose output a program
               consumes, where per-user speed is the product; 20% of requests
  standard     ITL <= 30 ms (33 tok/s per user, several times reading speed), TTFT <= 2 s: chat; the single
               objective of the first evaluation; 80% of requests
Goodput counts the output tokens of requests that met their own class's objective.

Each scenario replays one trace through 4 simulated GLM-5.3 replicas (zoe_cluster.sim.replay), every strategy
behind the same class-aware router (`routing.slo` in front of `prefix`, limits from the profiles):
always FP8, always MXFP4, a fixed mix (the mix `switching.mix.best_mix` picks for the trace's mean per-class load),
and switching, where the live controller's `SwitchActuator` (the same `decide`, here targeting a mix from the
per-class concurrency) runs every 30 simulated seconds, starting from all-FP8. A swap is drain-first and takes the
replica away for its weights load time (recipe estimate).

    .venv/bin/python bench/switching/evaluate.py                    # results.json, switching_day.png, ...
    .venv/bin/python bench/switching/evaluate.py --sensitivity      # sensitivity.json, switching_sensitivity.png
    .venv/bin/python bench/switching/evaluate.py --single-objective # the first evaluation (one objective, 2 replicas)

Scenarios: a day-shaped load (concurrency 2 -> 128 -> 4 over 8 hours across 4 replicas, i.e. up to 32 per
replica, the top of seed table A8) and the Azure LLM conversation trace (third_party/traces) with timestamps
compressed 1.5x. The sensitivity sweep replays the day for other interactive shares and objectives.
"""

from __future__ import annotations

import argparse
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
from zoe_cluster.switching.classes import ServiceClass, slo_policy_config  # noqa: E402
from zoe_cluster.switching.mix import best_mix  # noqa: E402
from zoe_cluster.switching.workload import day_shaped_rows, ramp, with_classes  # noqa: E402

from single_objective import main as single_objective, max_swaps_per_window  # noqa: E402  (this folder)

OUT = Path(__file__).resolve().parent
TRACES = Path(__file__).resolve().parents[2] / "third_party" / "traces"
H = 3600.0
TICK_S = 30.0
A, B = "fp8-tp8-nightly", "mxfp4-tp8"
REPLICAS = 4
INTERACTIVE_SHARE = 0.2
CLASSES = [ServiceClass(name="interactive", ttft_s=1.0, itl_s=0.020),
           ServiceClass(name="standard", ttft_s=2.0, itl_s=0.030)]
SHARE_SWEEP = [0.1, 0.2, 0.35, 0.5]
ITL_SWEEP_MS = [18, 20, 22, 25]
DAY = [(0, 2), (1.5 * H, 4), (3 * H, 128), (5 * H, 128), (6.5 * H, 8), (8 * H, 4)]
DAY_PHASES = {"low (0-1.5 h)": (0, 1.5 * H), "ramp up (1.5-3 h)": (1.5 * H, 3 * H), "peak (3-5 h)": (3 * H, 5 * H),
              "ramp down (5-6.5 h)": (5 * H, 6.5 * H), "evening (6.5-8 h)": (6.5 * H, 8 * H)}


def switch_config(classes: list[ServiceClass]) -> SwitchConfig:
    return SwitchConfig(candidates=[A, B], window_s=300, interval_s=TICK_S, dwell_s=1800, horizon_s=7200,
                        drain_s=60, classes=classes)


def class_goodput(result: ReplayResult, classes: list[ServiceClass], t0: float = 0.0,
                  t1: float = math.inf) -> dict[str, float]:
    """Output tok/s within each class's objective (requests arriving in [t0, t1)), over the whole run's span."""
    obj = {c.name: c for c in classes}
    good = {c.name: 0 for c in classes}
    for arr, ttft, tpot, out, _, cls in result.request_log:
        c = obj.get(cls or classes[-1].name)
        if c is not None and t0 <= arr < t1 and ttft <= c.ttft_s and tpot <= c.itl_s:
            good[c.name] += out
    span = result.simulated_s
    return {k: v / span if span > 0 else 0.0 for k, v in good.items()}


def class_tpot_ms(result: ReplayResult, cls: str, q: float = 0.5) -> float:
    vals = sorted(tpot for _, _, tpot, out, _, c in result.request_log if c == cls and out > 1)
    return 1000 * vals[int(q * (len(vals) - 1))] if vals else math.nan


def mean_demand(result: ReplayResult) -> dict[str, float]:
    """Time-average in-flight requests per class over a run's controller ticks."""
    rows = result.timeline
    names = {c for row in rows for c in row["in_flight_by_class"]}
    return {c: sum(row["in_flight_by_class"].get(c, 0.0) for row in rows) / max(1, len(rows)) for c in names}


def run(recipe, rows, variants, cfg, policy_options, controlled):
    holder: dict = {}

    def ctl(fleet):
        if "actuator" not in holder:
            holder["actuator"] = SwitchActuator(recipe, cfg, fleet, clock=lambda: fleet.now)
        holder["actuator"].step()

    t = time.perf_counter()
    config = SimReplayConfig(recipe, variants[0], len(variants), "slo", policy_options=policy_options,
                             variants=variants, tick_s=TICK_S,
                             controller=ctl if controlled else (lambda fleet: None), log_requests=True)
    res = replay(config, rows)
    swaps = [{"t_s": r.at, "replica": r.decision.replica, "variant": r.decision.variant, "reason": r.decision.reason}
             for r in holder["actuator"].history] if controlled else []
    return res, swaps, time.perf_counter() - t


def run_strategies(recipe, rows, classes, progress, task) -> tuple[dict, dict]:
    """always A, always B, the fixed mix for the mean load (from the always-A run), switching."""
    cfg = switch_config(classes)
    pol = slo_policy_config(recipe, classes, [A, B], cfg.slo_headroom)
    runs = {}
    runs[f"always {A}"] = run(recipe, rows, [A] * REPLICAS, cfg, pol, False)
    progress.advance(task)
    runs[f"always {B}"] = run(recipe, rows, [B] * REPLICAS, cfg, pol, False)
    progress.advance(task)
    demand = mean_demand(runs[f"always {A}"][0])
    mix, _, _ = best_mix(recipe, [A, B], REPLICAS, demand, cfg)
    if mix[A] in (0, REPLICAS):  # the mean-load optimum is a pure fleet: show the closest real mix instead
        mix = {A: 1, B: REPLICAS - 1} if mix[B] else {A: REPLICAS - 1, B: 1}
    fixed = [v for v, k in mix.items() for _ in range(k)]
    runs[f"fixed mix {mix[A]} {A} + {mix[B]} {B}"] = run(recipe, rows, fixed, cfg, pol, False)
    progress.advance(task)
    runs["switching"] = run(recipe, rows, [A] * REPLICAS, cfg, pol, True)
    progress.advance(task)
    meta = {"policy_options": pol, "mean_demand": {k: round(v, 2) for k, v in demand.items()}, "fixed_mix": mix}
    return runs, meta


def summarize(runs, classes, phases, dwell_s):
    out = {}
    for name, (res, swaps, wall) in runs.items():
        by_class = class_goodput(res, classes)
        out[name] = {
            "requests": res.requests, "completed": res.completed, "dropped": res.dropped, "swaps": res.swaps,
            "output_tok_s": round(res.output_tok_s, 2),
            "goodput_tok_s": round(sum(by_class.values()), 2),
            "goodput_by_class_tok_s": {k: round(v, 2) for k, v in by_class.items()},
            "goodput_by_phase_tok_s": {p: round(sum(class_goodput(res, classes, t0, t1).values()), 2)
                                       for p, (t0, t1) in phases.items()},
            "itl_p50_ms_by_class": {c.name: round(class_tpot_ms(res, c.name), 2) for c in classes},
            "itl_p90_ms_by_class": {c.name: round(class_tpot_ms(res, c.name, 0.9), 2) for c in classes},
            "ttft_p50_s": round(res.ttft_p50_s, 3), "ttft_p90_s": round(res.ttft_p90_s, 3),
            "tpot_p50_ms": round(1000 * res.tpot_p50_s, 2), "tpot_p90_ms": round(1000 * res.tpot_p90_s, 2),
            "prefix_hit_rate": round(res.prefix_hit_rate, 4), "routing_reasons": res.routing_reasons,
            "max_swaps_per_replica_per_dwell_window": max_swaps_per_window(swaps, dwell_s),
            "swap_decisions": swaps, "wall_s": round(wall, 2),
        }
    return out


def plot_timeline(runs, target, title, path, bin_s=600.0):
    sw = runs["switching"][0]
    t = [row["t_s"] / H for row in sw.timeline]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9.5), sharex=True)
    ax = axes[0]
    for c in (x.name for x in CLASSES):
        ax.plot(t, [row["in_flight_by_class"].get(c, 0) for row in sw.timeline], lw=1, label=f"{c} in flight")
    if target is not None:
        ax.plot(t, [target(x * H) for x in t], "k--", lw=1, label="target concurrency (all classes)")
    ax.set_ylabel("requests in flight (switching run)")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    stacks = [[sum(1 for v, s in zip(row["variants"], row["states"]) if v == name and s == "ready")
               for row in sw.timeline] for name in (A, B)]
    away = [sum(1 for s in row["states"] if s != "ready") for row in sw.timeline]
    ax.stackplot(t, *stacks, away, labels=[f"{A} (ready)", f"{B} (ready)", "draining / loading"],
                 colors=["tab:blue", "tab:orange", "tab:grey"], alpha=0.8)
    ax.set_ylim(0, REPLICAS)
    ax.set_ylabel("replicas (switching run)")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    for name, (res, _, _) in runs.items():
        bins: dict[int, int] = {}
        obj = {c.name: c for c in CLASSES}
        for arr, ttft, tpot, out, _, cls in res.request_log:
            c = obj[cls or CLASSES[-1].name]
            if ttft <= c.ttft_s and tpot <= c.itl_s:
                bins[int(arr // bin_s)] = bins.get(int(arr // bin_s), 0) + out
        xs = sorted(bins)
        ax.plot([(x + 0.5) * bin_s / H for x in xs], [bins[x] / bin_s for x in xs], lw=1.2, label=name)
    ax.set_ylabel(f"goodput, tok/s ({bin_s / 60:g}-min bins, by arrival)")
    ax.set_xlabel("simulated hours")
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def day_rows(recipe, share):
    return day_shaped_rows(recipe, A, ramp(DAY), 8 * H, replicas=REPLICAS, input_blocks=(1, 2), history_blocks=4,
                           output_tokens=(512, 1536),
                           class_shares={"interactive": share, "standard": 1 - share})


def print_tables(console, results):
    for scenario, summary in results.items():
        t = Table(title=scenario)
        for col in ("strategy", "tok/s", "goodput", "interactive / standard", "ITL p50 int/std ms", "TTFT p90 s",
                    "dropped", "swaps"):
            t.add_column(col)
        for name, s in summary.items():
            g, itl = s["goodput_by_class_tok_s"], s["itl_p50_ms_by_class"]
            t.add_row(name, f"{s['output_tok_s']:.1f}", f"{s['goodput_tok_s']:.1f}",
                      f"{g['interactive']:.1f} / {g['standard']:.1f}", f"{itl['interactive']:.1f} / {itl['standard']:.1f}",
                      f"{s['ttft_p90_s']:.2f}", str(s["dropped"]), str(s["swaps"]))
        console.print(t)


def main_classes(console) -> None:
    glm = RecipeRegistry.default().get("glm-5.3")
    shares = {"interactive": INTERACTIVE_SHARE, "standard": 1 - INTERACTIVE_SHARE}
    day = day_rows(glm, INTERACTIVE_SHARE)
    azure_raw = load_azure(TRACES / "azure2023_conv.csv")
    compress = 1.5
    azure = with_classes(rows_from(
        (r.arrival_s / compress, r.input_len, max(1, r.output_len),
         tuple(range(10_000_000 + 1000 * r.index, 10_000_000 + 1000 * r.index + max(1, r.input_len // 512))))
        for r in azure_raw), shares, seed=7)
    results, meta = {}, {}
    with Progress(console=console) as progress:
        task = progress.add_task("replaying 2 scenarios x 4 strategies", total=8)
        day_runs, meta["day"] = run_strategies(glm, day, CLASSES, progress, task)
        azure_runs, meta["azure"] = run_strategies(glm, azure, CLASSES, progress, task)
    dwell = switch_config(CLASSES).dwell_s
    results["day"] = summarize(day_runs, CLASSES, DAY_PHASES, dwell)
    results["azure conv x1.5"] = summarize(azure_runs, CLASSES, {"whole trace": (0, math.inf)}, dwell)
    plot_timeline(day_runs, ramp(DAY), f"GLM-5.3, {REPLICAS} simulated replicas, day-shaped load, "
                  f"{INTERACTIVE_SHARE:.0%} interactive: switching toward a mix", OUT / "switching_day.png")
    plot_timeline(azure_runs, None, f"GLM-5.3, {REPLICAS} simulated replicas, Azure conversation trace x1.5, "
                  f"{INTERACTIVE_SHARE:.0%} interactive", OUT / "switching_azure.png", bin_s=120.0)
    doc = {
        "command": "python bench/switching/evaluate.py",
        "python": sys.version.split()[0], "machine": platform.machine(), "replicas": REPLICAS,
        "classes": [c.model_dump() for c in CLASSES], "class_shares": shares,
        "config": switch_config(CLASSES).model_dump(), "scenarios": results, "strategy_inputs": meta,
        "notes": "simulated engine calibrated to seed tables A5/A7/A8; weights load times are recipe estimates; "
                 "goodput = output tokens of requests within their own class's TTFT and ITL objective, per second",
    }
    (OUT / "results.json").write_text(json.dumps(doc, indent=1))
    print_tables(console, results)


def main_sensitivity(console) -> None:
    """The day replayed at other interactive shares (objective 20 ms) and other interactive objectives (20%)."""
    glm = RecipeRegistry.default().get("glm-5.3")
    points = [("share", s, s, 20) for s in SHARE_SWEEP] + \
             [("itl_ms", ms, INTERACTIVE_SHARE, ms) for ms in ITL_SWEEP_MS if ms != 20]
    out: dict = {"share": {}, "itl_ms": {}}
    with Progress(console=console) as progress:
        task = progress.add_task("sensitivity: day x 4 strategies", total=4 * len(points))
        for axis, x, share, ms in points:
            classes = [CLASSES[0].model_copy(update={"itl_s": ms / 1000}), CLASSES[1]]
            runs, meta = run_strategies(glm, day_rows(glm, share), classes, progress, task)
            out[axis][str(x)] = {name: {"goodput_tok_s": round(sum(class_goodput(r, classes).values()), 2),
                                        "goodput_by_class_tok_s": {k: round(v, 2) for k, v in
                                                                   class_goodput(r, classes).items()},
                                        "swaps": r.swaps, "dropped": r.dropped}
                                 for name, (r, _, _) in runs.items()}
            out[axis][str(x)]["fixed_mix"] = meta["fixed_mix"]
    out["itl_ms"]["20"] = out["share"][str(INTERACTIVE_SHARE)]
    doc = {"command": "python bench/switching/evaluate.py --sensitivity", "replicas": REPLICAS,
           "classes": [c.model_dump() for c in CLASSES], "sweeps": out}
    (OUT / "sensitivity.json").write_text(json.dumps(doc, indent=1))
    plot_sensitivity(out, OUT / "switching_sensitivity.png")


def plot_sensitivity(sweeps: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.3))
    for ax, axis, label in ((axes[0], "share", "interactive share of requests (objective 20 ms)"),
                            (axes[1], "itl_ms", f"interactive ITL objective, ms ({INTERACTIVE_SHARE:.0%} interactive)")):
        xs = sorted(sweeps[axis], key=float)
        # the fixed mix differs between points (best for each point's mean load): one line for all of them
        pick = lambda point, key: next(v for n, v in point.items() if n.startswith(key))  # noqa: E731
        for key, label_name in ((f"always {A}", f"always {A}"), (f"always {B}", f"always {B}"),
                                ("fixed mix", "fixed mix (best for the mean load)"), ("switching", "switching")):
            ax.plot([float(x) for x in xs], [pick(sweeps[axis][x], key)["goodput_tok_s"] for x in xs], marker="o",
                    ms=3, label=label_name)
        ax.set_xlabel(label)
        ax.set_ylabel("goodput over the day, tok/s")
        ax.legend(fontsize=8)
    fig.suptitle(f"GLM-5.3, {REPLICAS} simulated replicas, day-shaped load: goodput sensitivity")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sensitivity", action="store_true",
                    help="instead, sweep the interactive share and objective on the day (about 15 minutes)")
    ap.add_argument("--single-objective", action="store_true",
                    help="run the first evaluation (one objective for all traffic, 2 replicas) instead")
    args = ap.parse_args()
    console = Console()
    if args.single_objective:
        single_objective(console)  # the first evaluation, kept for comparison
        return
    if args.sensitivity:
        main_sensitivity(console)
    else:
        main_classes(console)


if __name__ == "__main__":
    main()
