"""Several routers behind one front: does the prefix hit rate hold when N routers each keep their own index or share it?

    python bench/router/multi_router.py [--trace third_party/traces/mooncake_conversation_trace.jsonl]

For 4 and 8 GLM-5.3 replicas under the `prefix` policy, replays the Mooncake conversation trace with one router,
and with `--routers` routers (default 4) behind each front of `routing.router_fleet` (FRONTS: "random", a plain
Kubernetes Service; "affinity", a consistent hash of the session key, else of the first prompt block; and
"affinity-2blocks", the same keyed on the first two blocks, since every prompt of this trace opens with the same
block), and behind a random front with the routers sharing their prefix-index inserts and session routings every
T seconds of the replay's clock ("random-share-Ts", `routing.picture_sharing`, for each T of --share-s). Each run
is what `zoe sim replay TRACE --model glm-5.3 --replicas R --policy prefix --routers N --router-front F
[--router-affinity-blocks 2] [--router-share-s T] --json` does, run in-process. With --sessions S (default 16; 0
skips it) it does the same on the agentic session files (`zoe sim replay DIR --sessions S`, closed loop), whose
requests carry session keys.

Writes bench/router/multi_router.json (every run's command, hit rate, TTFT p50/p90 and requests per router, and
per configuration the ratio of the fleet's hit rate to one router's; the target is >= 0.98) and multi_router.png
(those ratios).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TARGET_RATIO = 0.98


FRONTS = (("random", "random", 1, None), ("affinity", "affinity", 1, None), ("affinity-2blocks", "affinity", 2, None))
"""(label, --router-front, --router-affinity-blocks, --router-share-s) of each fleet measured without sharing."""


def _fronts(share_s: list[float]) -> list[tuple[str, str, int, float | None]]:
    return [*FRONTS, *((f"random-share-{t:g}s", "random", 1, t) for t in share_s)]


def _flags(routers: int, front: str, blocks: int, share_s: float | None) -> str:
    flags = f" --routers {routers} --router-front {front}"
    flags += f" --router-affinity-blocks {blocks}" if blocks > 1 else ""
    return flags + (f" --router-share-s {share_s:g}" if share_s is not None else "")


def _mooncake_run(recipe: Any, variant: str, rows: list[Any], replicas: int, routers: int, label: str, front: str,
                  blocks: int, share_s: float | None, trace: str) -> dict[str, Any]:
    from zoe_cluster.routing.router_fleet import fleet_factory
    from zoe_cluster.sim.replay import SimReplayConfig, replay

    cmd = f"zoe sim replay {trace} --model {recipe.name} --replicas {replicas} --policy prefix"
    if routers == 1:
        res = replay(SimReplayConfig(recipe, variant, replicas, "prefix"), rows)
        per_router = [res.requests]
    else:
        cmd += _flags(routers, front, blocks, share_s)
        fleet = fleet_factory(routers, front, affinity_blocks=blocks, share_every_s=share_s)
        res = replay(SimReplayConfig(recipe, variant, replicas, fleet), rows)
        per_router = None  # the replay does not hand back its policy; see _front_split
    return {"command": cmd + " --json", "source": "mooncake", "replicas": replicas, "routers": routers,
            "front": label if routers > 1 else None, "prefix_hit_rate": res.prefix_hit_rate,
            "ttft_p50_s": res.ttft_p50_s, "ttft_p90_s": res.ttft_p90_s, "completed": res.completed,
            "requests_per_router": per_router, "wall_s": round(res.wall_s, 2)}


def _front_split(rows: list[Any], routers: int, front: str, blocks: int, model: str) -> list[int]:
    """Requests each router receives from `front` (the same draw the replay makes, replayed on the contexts)."""
    from zoe_cluster.routing import context_from_trace
    from zoe_cluster.routing.router_fleet import RouterFleet, RouterFleetConfig

    fleet = RouterFleet(RouterFleetConfig(routers=routers, front=front, affinity_blocks=blocks))
    counts = [0] * routers
    for i, r in enumerate(rows):
        counts[fleet.router_for(context_from_trace(str(i), model, r.hash_ids, r.input_tokens, r.output_tokens))] += 1
    return counts


def _sessions_run(path: str, sessions: int, replicas: int, routers: int, label: str, front: str,
                  blocks: int, share_s: float | None) -> dict[str, Any]:
    from zoe_cluster.agentic.replay import run_closed_loop
    from zoe_cluster.routing.router_fleet import fleet_factory

    cmd = f"zoe sim replay {path} --sessions {sessions} --model glm-5.3 --replicas {replicas} --policy prefix"
    if routers == 1:
        rep = run_closed_loop(path, sessions, replicas, "prefix")
    else:
        cmd += _flags(routers, front, blocks, share_s)
        rep = run_closed_loop(path, sessions, replicas,
                              fleet_factory(routers, front, affinity_blocks=blocks, share_every_s=share_s))
    return {"command": cmd + " --json", "source": "agentic", "replicas": replicas, "routers": routers,
            "front": label if routers > 1 else None, "prefix_hit_rate": rep["prefix_hit_rate"],
            "wall_s": round(rep["wall_s"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="third_party/traces/mooncake_conversation_trace.jsonl")
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", default="4,8")
    ap.add_argument("--routers", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=16, help="Live agentic sessions; 0 skips the agentic runs.")
    ap.add_argument("--sessions-path", default="/work/shared/traces/agentic")
    ap.add_argument("--share-s", default="1,5,30",
                    help="Sharing periods (s of the replay's clock) measured behind a random front, comma-separated.")
    ap.add_argument("--out", default=str(HERE / "multi_router.json"))
    args = ap.parse_args()
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim.replay import load_mooncake

    recipe = RecipeRegistry.default().get(args.model)
    variant = recipe.default_variant
    rows = load_mooncake(REPO / args.trace if not Path(args.trace).is_absolute() else args.trace)
    fronts = _fronts([float(t) for t in args.share_s.split(",") if t.strip()])
    runs: list[dict[str, Any]] = []
    for n in (int(x) for x in args.replicas.split(",")):
        first = len(runs)
        runs.append(_mooncake_run(recipe, variant, rows, n, 1, "", "", 1, None, args.trace))
        for label, front, blocks, share_s in fronts:
            run = _mooncake_run(recipe, variant, rows, n, args.routers, label, front, blocks, share_s, args.trace)
            run["requests_per_router"] = _front_split(rows, args.routers, front, blocks, recipe.name)
            runs.append(run)
        if args.sessions > 0:
            runs.append(_sessions_run(args.sessions_path, args.sessions, n, 1, "", "", 1, None))
            runs += [_sessions_run(args.sessions_path, args.sessions, n, args.routers, *f) for f in fronts]
        for r in runs[first:]:
            print(f"{r['source']:8} replicas={r['replicas']} routers={r['routers']} front={r['front']}: "
                  f"hit {r['prefix_hit_rate']:.4f}", flush=True)
    summary = []
    for r in runs:
        if r["routers"] == 1:
            continue
        base = next(b for b in runs if b["routers"] == 1 and b["source"] == r["source"]
                    and b["replicas"] == r["replicas"])
        ratio = r["prefix_hit_rate"] / base["prefix_hit_rate"] if base["prefix_hit_rate"] else float("nan")
        summary.append({"source": r["source"], "replicas": r["replicas"], "routers": r["routers"], "front": r["front"],
                        "hit_rate_one_router": round(base["prefix_hit_rate"], 4),
                        "hit_rate_fleet": round(r["prefix_hit_rate"], 4), "ratio": round(ratio, 4),
                        "holds_target": ratio >= TARGET_RATIO})
    out = {"command": " ".join(["python bench/router/multi_router.py", *sys.argv[1:]]), "model": args.model,
           "variant": variant,
           "target_ratio": TARGET_RATIO, "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    plot(summary, Path(args.out).with_suffix(".png"), args.routers)
    for s in summary:
        print(json.dumps(s))


def plot(summary: list[dict[str, Any]], path: Path, routers: int) -> None:
    """Grouped bars: per trace and replica count, each front's hit rate over one router's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((s["source"], s["replicas"]) for s in summary))
    fronts = list(dict.fromkeys(s["front"] for s in summary))
    width = 0.8 / len(fronts)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for k, front in enumerate(fronts):
        xs, ys = [], []
        for g, (src, n) in enumerate(groups):
            row = next((s for s in summary if (s["source"], s["replicas"], s["front"]) == (src, n, front)), None)
            if row is not None:
                xs.append(g + (k - (len(fronts) - 1) / 2) * width)
                ys.append(row["ratio"])
        ax.bar(xs, ys, width, label=front)
    ax.axhline(TARGET_RATIO, color="k", ls="--", lw=1, label=f"target {TARGET_RATIO}")
    ax.set_xticks(range(len(groups)), [f"{'Mooncake conv.' if s == 'mooncake' else 'agentic'}\n{n} replicas"
                                       for s, n in groups])
    ax.set_ylim(0.5, 1.05)
    ax.set_ylabel(f"prefix hit rate, {routers} routers / 1 router")
    ax.set_title(f"{routers} routers behind one front (zoe sim replay --routers {routers})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
