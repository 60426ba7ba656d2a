"""Concurrency sweep on the virtual clock, to and past saturation: the 32 shared agentic sessions closed-loop on
simulated GLM-5.3 replicas, throughput per GPU against p90 interactivity, and the throughput ratio of `prefix` over
each other policy at equal p90 interactivity (read off the curves by linear interpolation).

    python bench/agentic/sweep.py --jobs 2             # writes bench/agentic/sweep.json and sweep.png
    python bench/agentic/sweep.py --plot-only          # redraw sweep.png and the ratios from sweep.json
    python bench/agentic/sweep.py --policies prefix --sessions 8,32 --out /tmp/s.json

Each point is `zoe sim replay ../shared/traces/agentic --sessions N --model glm-5.3 --replicas R --policy P
--think-cap-s C --json` (the in-process replay of `policies.run_one`, which also sets vLLM's
`--long-prefill-token-threshold` on the variant when asked); sessions beyond the 32 files replay them again as new
users. Every point records each replica's busy time, so the hot-spotting of a policy (its busiest replica over the
mean) is read next to the curves.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from policies import run_one  # noqa: E402

KEEP = ("live_sessions", "total_sessions", "requests", "completed", "dropped", "errors", "prefix_hit_rate",
        "reuse_ceiling", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_floor_p90_s", "itl_p50_s", "itl_p90_s",
        "e2e_p90_s", "output_tok_s", "output_tok_s_per_gpu", "tok_s_per_user_p90", "gpus", "span_s", "preemptions",
        "wall_s")


def point(row: dict[str, Any]) -> dict[str, Any]:
    """The kept report fields of one run, with its prefill load and the busy share of each replica."""
    rep = row["report"]
    busy = [p["busy_s"] / rep["span_s"] for p in rep.get("per_replica", [])] if rep["span_s"] else []
    return {**{k: rep.get(k) for k in KEEP}, "prefill_load": row["prefill_load"],
            "replica_busy": [round(b, 4) for b in busy],
            "busiest_over_mean": max(busy) / (sum(busy) / len(busy)) if busy and sum(busy) else None}


def curve(points: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(p90 tok/s per user, tok/s per GPU) of a sweep, in order of rising concurrency."""
    return [(p["tok_s_per_user_p90"], p["output_tok_s_per_gpu"])
            for p in sorted(points, key=lambda p: p["live_sessions"]) if p.get("tok_s_per_user_p90")]


def throughput_at(pts: list[tuple[float, float]], interactivity: float) -> float | None:
    """Throughput per GPU where a sweep's curve crosses `interactivity` (tok/s per user), interpolated linearly
    between the two points around it; the highest such throughput when it crosses more than once; None when the
    sweep never reaches that interactivity level from both sides."""
    best = None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        lo, hi = min(x0, x1), max(x0, x1)
        if lo <= interactivity <= hi and hi > lo:
            y = y0 + (y1 - y0) * (interactivity - x0) / (x1 - x0)
            best = y if best is None else max(best, y)
        elif x0 == x1 == interactivity:
            best = max(y0, y1) if best is None else max(best, y0, y1)
    return best


def ratios(series: dict[str, list[dict[str, Any]]], base: str = "prefix", steps: int = 12) -> dict[str, Any]:
    """`base`'s throughput per GPU over each other policy's, at interactivity levels spread over the range both
    sweeps cover: {policy: [{tok_s_per_user_p90, base, other, ratio}]}."""
    out: dict[str, Any] = {}
    if base not in series:
        return out
    b = curve(series[base])
    for name, pts in series.items():
        if name == base:
            continue
        o = curve(pts)
        lo = max(min(x for x, _ in b), min(x for x, _ in o))
        hi = min(max(x for x, _ in b), max(x for x, _ in o))
        rows = []
        for i in range(steps + 1):
            x = lo + (hi - lo) * i / steps
            tb, to = throughput_at(b, x), throughput_at(o, x)
            if tb and to:
                rows.append({"tok_s_per_user_p90": round(x, 2), base: round(tb, 3), name: round(to, 3),
                             "ratio": round(tb / to, 3)})
        out[name] = rows
    return out


def hash_shares(sessions_dir: str, model: str, replicas: int, levels: list[int]) -> dict[str, Any]:
    """Where `session_hash` puts the work, without running the fleet: every request of the sweep's sessions (as
    the driver releases them, think times passing instantly) goes to the replica its session key owns on the
    policy's ring (`routing.hash_ring`, the replay's replica ids), and each replica adds up the floor prefill
    time of its requests (`metrics.ttft_floor_s` less the frontend) and their output tokens. Returns, per session
    count, each replica's share over the mean."""
    from zoe_cluster.agentic.metrics import ttft_floor_s
    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.routing.hash_ring import HashRing
    from zoe_cluster.routing.policies import SessionHashConfig
    from zoe_cluster.sim.calibrate import calibrate

    recipe = RecipeRegistry.default().get(model)
    v = recipe.variant(recipe.default_variant)
    m = calibrate(recipe, recipe.default_variant).model
    ids = [f"sim/{i}/0" for i in range(replicas)]
    ring = HashRing(SessionHashConfig().points_per_replica, ids)
    out: dict[str, Any] = {}
    for live in levels:
        driver = SessionOptions(live, max_input_tokens=recipe.architecture.max_context_tokens).driver(sessions_dir)
        driver.start(0.0)
        prefill_s = dict.fromkeys(ids, 0.0)
        output = dict.fromkeys(ids, 0)
        now = 0.0
        while not driver.done:
            now = max(now, driver.next_release_s())
            call = driver.pop()
            rid = ring.lookup(call.session_key, lambda r: True)
            prefill_s[rid] += ttft_floor_s(m, v.max_num_batched_tokens, call.input_tokens,
                                           call.reusable_blocks * call.block_tokens) - m.frontend_s
            output[rid] += call.output_tokens
            driver.finished(call, now)
        mean_p, mean_o = sum(prefill_s.values()) / replicas, sum(output.values()) / replicas
        out[str(live)] = {"prefill_share": [round(prefill_s[r] / mean_p, 3) for r in ids],
                          "output_share": [round(output[r] / mean_o, 3) for r in ids]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--policies", default="prefix,session_hash,least_load")
    ap.add_argument("--sessions", default="16,64,128,256")
    ap.add_argument("--host-kv-gb", type=float, default=0.0)
    ap.add_argument("--kv-tokens", type=int, default=None,
                    help="KV tokens per replica instead of the variant's HBM (zoe sim replay --kv-tokens)")
    ap.add_argument("--think-cap-s", type=float, default=60.0)
    ap.add_argument("--ramp-up-s", type=float, default=0.0,
                    help="start the first live sessions spread evenly over this many seconds "
                         "(zoe sim replay --ramp-up-s)")
    ap.add_argument("--long-prefill-token-threshold", type=int, default=0)
    ap.add_argument("--skip", default="", help="POLICY:SESSIONS points to leave out, comma-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "sweep.json"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot and the ratios from --out")
    ap.add_argument("--hash-shares", action="store_true",
                    help="also store where session_hash's ring puts the sessions' work (session_hash_shares)")
    ap.add_argument("--add", action="store_true",
                    help="add this run's points to --out's sweep (same setup), replacing points of the same policy "
                         "and session count")
    args = ap.parse_args()
    out = Path(args.out)
    if args.plot_only:
        doc = json.loads(out.read_text())
    else:
        skip = {tuple(x.split(":")) for x in args.skip.split(",")} if args.skip else set()
        # the longest runs first, so the pool's workers finish together
        combos = [(p, int(n)) for n in sorted(args.sessions.split(","), key=int, reverse=True)
                  for p in args.policies.split(",") if (p, n) not in skip]
        series: dict[str, list[dict]] = {}
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futs = [pool.submit(run_one, args.sessions_dir, args.model, args.replicas, n, p, args.host_kv_gb,
                                kv_tokens=args.kv_tokens, long_prefill_token_threshold=args.long_prefill_token_threshold,
                                think_cap_s=args.think_cap_s, ramp_up_s=args.ramp_up_s) for p, n in combos]
            for (policy, n), f in zip(combos, futs):
                pt = point(f.result())
                series.setdefault(policy, []).append(pt)
                print(policy, n, f"{pt['output_tok_s_per_gpu']:.2f} tok/s/GPU",
                      f"{pt['tok_s_per_user_p90']:.1f} tok/s/user p90", f"TTFT p90 {pt['ttft_p90_s']:.2f} s",
                      f"busiest/mean {pt['busiest_over_mean']:.2f}", f"prefill load {pt['prefill_load']:.3f}",
                      flush=True)
        command = "python bench/agentic/sweep.py " + " ".join(sys.argv[1:])
        if args.add and out.exists():
            doc = json.loads(out.read_text())
            for policy, pts in series.items():
                mine = {p["live_sessions"] for p in pts}
                doc["series"][policy] = [p for p in doc["series"].get(policy, []) if p["live_sessions"] not in mine] + pts
            doc["commands"] = doc.get("commands", [doc.pop("command", "")]) + [command]
        else:
            doc = None
    if doc is None:
        doc = {
            "commands": [command],
            "point_command": f"zoe sim replay {args.sessions_dir} --sessions N --model {args.model} --replicas "
                             f"{args.replicas} --policy P --think-cap-s {args.think_cap_s} --host-kv-gb "
                             f"{args.host_kv_gb} --ramp-up-s {args.ramp_up_s}"
                             + (f" --kv-tokens {args.kv_tokens}" if args.kv_tokens else "") + " --json",
            "setup": {"model": args.model, "replicas": args.replicas, "host_kv_gb": args.host_kv_gb,
                      "kv_tokens_per_replica": args.kv_tokens or "the variant's HBM",
                      "think_cap_s": args.think_cap_s, "ramp_up_s": args.ramp_up_s,
                      "max_input_tokens": "the model's context",
                      "long_prefill_token_threshold": args.long_prefill_token_threshold},
            "series": series,
        }
    if args.hash_shares:
        levels = sorted({p["live_sessions"] for pts in doc["series"].values() for p in pts})
        doc["session_hash_shares"] = hash_shares(args.sessions_dir, args.model, args.replicas, levels)
    doc["ratio_at_equal_p90_interactivity"] = ratios(doc["series"])
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, out.with_suffix(".png"))
    for name, rows in doc["ratio_at_equal_p90_interactivity"].items():
        print(f"prefix over {name}:", ", ".join(f"{r['tok_s_per_user_p90']}: {r['ratio']:.2f}x" for r in rows))


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = doc["series"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for name, pts in series.items():
        pts = sorted(pts, key=lambda p: p["live_sessions"])
        xs = [p["tok_s_per_user_p90"] for p in pts]
        axes[0].plot(xs, [p["output_tok_s_per_gpu"] for p in pts], "o-", label=name)
        for p in pts:
            axes[0].annotate(str(p["live_sessions"]), (p["tok_s_per_user_p90"], p["output_tok_s_per_gpu"]),
                             textcoords="offset points", xytext=(4, 4), fontsize=7)
        live = [p["live_sessions"] for p in pts]
        axes[1].plot(live, [p["ttft_p90_s"] for p in pts], "o-", label=name)
        axes[2].plot(live, [p["busiest_over_mean"] for p in pts], "o-", label=name)
    axes[0].set_xlabel("p90 interactivity: tok/s per user (1 / ITL p90)")
    axes[0].set_ylabel("output tok/s per GPU")
    axes[1].set_xlabel("live sessions")
    axes[1].set_ylabel("TTFT p90 (s)")
    axes[1].set_yscale("log")
    axes[2].set_xlabel("live sessions")
    axes[2].set_ylabel("busiest replica's busy time / mean")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    s = doc["setup"]
    fig.suptitle(f"{s['model']}: 32 agentic sessions closed-loop on {s['replicas']} simulated replicas, think cap "
                 f"{s['think_cap_s']:.0f} s (virtual clock)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
