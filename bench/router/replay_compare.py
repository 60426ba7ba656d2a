"""prefix vs round_robin vs least_load on the Mooncake conversation trace, through `zoe sim replay` (the router's
own policy code driving N simulated GLM-5.3 replicas on the virtual clock).

    python bench/router/replay_compare.py [--trace third_party/traces/mooncake_conversation_trace.jsonl]

Runs `zoe sim replay TRACE --model glm-5.3 --replicas N --policy P --json` for N in {4, 8} and every policy
(plus `prefix` with `--kv-tokens 1000000000`, an unbounded cache per replica, as a reference for what the
replicas' finite KV capacity costs; and `prefix` and `round_robin` with `--host-kv-gb 2048`, a host-memory KV
tier per replica, reported apart: GPU-only hit rate and GPU+host hit rate; and `prefix@pooled-kv`: ONE replica
holding the whole fleet's KV, N x the per-replica capacity, a reference for what a perfect router without
duplicated blocks could hit with vLLM's LRU eviction: only its hit rate means anything, its TTFTs do not, since
one replica takes N replicas' load),
and writes bench/router/replay_compare.json (each run's exact command and result) and replay_compare.png.
The hit-rate ceiling (36.6%) is the share of reusable prefix blocks with one unbounded shared cache
(third_party/README.md).

It also computes, in-process, the zero-wait floor of TTFT p90 (`ttft_floor`): for every request, the TTFT it
would have alone on an idle replica with the prefix hits it actually got, and the p90 of that. No routing can
bring p90 below it without more hits.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CEILING = 0.366
HOST_KV_GB = 2048
"""Host memory per replica (one 8-GPU node) given to the KV tier: 2 TB of a 3 TB node (2 EPYC sockets x 12 DDR5
channels x one 128 GB RDIMM), the rest left to the OS, the engine and weight staging (docs/router.md)."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(REPO / "third_party/traces/mooncake_conversation_trace.jsonl"))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", default="4,8")
    ap.add_argument("--policies", default="prefix,round_robin,least_load")
    ap.add_argument("--out", default=str(HERE / "replay_compare.json"))
    args = ap.parse_args()
    from rich.progress import Progress

    runs = []
    combos = [(int(n), p) for n in args.replicas.split(",") for p in args.policies.split(",")]
    # a reference: the prefix policy with an unbounded KV cache per replica (what capacity, not routing, costs)
    combos += [(int(n), "prefix@unbounded-kv") for n in args.replicas.split(",")]
    # a host-memory KV tier (opt-in engine feature), for the router and for its baseline alike
    combos += [(int(n), f"{p}@host-kv") for n in args.replicas.split(",") for p in ("prefix", "round_robin")]
    # a reference: one cache holding the fleet's total KV (routing with no duplication and a shared LRU)
    combos += [(int(n), "prefix@pooled-kv") for n in args.replicas.split(",")]
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.recipes.profile import kv_capacity_tokens

    recipe = RecipeRegistry.default().get(args.model)
    per_replica_kv = kv_capacity_tokens(recipe, recipe.default_variant)
    with Progress() as progress:
        task = progress.add_task("replays", total=len(combos))
        for n, policy in combos:
            progress.update(task, description=f"{policy} x{n}")
            name, _, kv = policy.partition("@")
            extra = {"": [], "unbounded-kv": ["--kv-tokens", "1000000000"],
                     "host-kv": ["--host-kv-gb", str(HOST_KV_GB)],
                     "pooled-kv": ["--kv-tokens", str(n * per_replica_kv)]}[kv]
            replicas = 1 if kv == "pooled-kv" else n
            cmd = ["zoe", "sim", "replay", args.trace, "--model", args.model, "--replicas", str(replicas),
                   "--policy", name, "--json", *extra]
            out = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *cmd[1:]], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout
            res = json.loads(out)
            res.pop("per_replica", None)
            res["policy"], res["replicas"] = policy, n  # pooled-kv: the fleet size it stands for
            runs.append({"command": shlex.join(cmd).replace(str(REPO.parent) + "/", "../"), **res})
            progress.advance(task)
    summary = {}
    for n in sorted({r["replicas"] for r in runs}):
        rr = next(r for r in runs if r["replicas"] == n and r["policy"] == "round_robin")
        rr_host = next((r for r in runs if r["replicas"] == n and r["policy"] == "round_robin@host-kv"), None)
        summary[str(n)] = {
            r["policy"]: {
                "prefix_hit_rate": round(r["prefix_hit_rate"], 4),
                "share_of_ceiling": round(r["prefix_hit_rate"] / CEILING, 3),
                "host_hit_rate": round(r.get("host_hit_rate", 0.0), 4),
                "gpu_host_hit_rate": round(r["prefix_hit_rate"] + r.get("host_hit_rate", 0.0), 4),
                "gpu_host_share_of_ceiling": round((r["prefix_hit_rate"] + r.get("host_hit_rate", 0.0)) / CEILING, 3),
                "ttft_p50_s": round(r["ttft_p50_s"], 3),
                "ttft_p90_s": round(r["ttft_p90_s"], 3),
                "p90_vs_round_robin": round(rr["ttft_p90_s"] / r["ttft_p90_s"], 2),
                **({"p90_vs_round_robin_with_host_kv": round(rr_host["ttft_p90_s"] / r["ttft_p90_s"], 2)}
                   if rr_host and r["policy"].endswith("@host-kv") else {}),
                "output_tok_s": round(r["output_tok_s"], 1),
            }
            for r in runs if r["replicas"] == n and not r["policy"].endswith("@pooled-kv")
        }
        pooled = next(r for r in runs if r["replicas"] == n and r["policy"] == "prefix@pooled-kv")
        summary[str(n)]["prefix@pooled-kv"] = {  # hit rate only: one replica carried the whole fleet's load
            "prefix_hit_rate": round(pooled["prefix_hit_rate"], 4),
            "share_of_ceiling": round(pooled["prefix_hit_rate"] / CEILING, 3),
            "kv_tokens": n * per_replica_kv,
            "prefix_share_of_pooled": round(summary[str(n)]["prefix"]["prefix_hit_rate"] / pooled["prefix_hit_rate"], 3),
        }
    floor = ttft_floor(args.trace, args.model, sorted({n for n, _ in combos}))
    doc = {"command": "python bench/router/replay_compare.py " + " ".join(sys.argv[1:]),
           "ceiling_hit_rate": CEILING, "host_kv_gb": HOST_KV_GB, "summary": summary, "ttft_floor": floor,
           "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, Path(args.out).with_suffix(".png"))
    print(json.dumps(summary, indent=2))


def ttft_floor(trace: str, model: str, sizes: list[int]) -> dict:
    """Per replica count and policy (GPU-only KV): TTFT p90 measured, the zero-wait floor (p90 of each request's
    TTFT alone on an idle replica with the hits it got), and what the requests above p90 are."""
    import numpy as np

    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim import replay as replay_mod
    from zoe_cluster.sim.calibrate import calibrate, predict_lone_ttft

    finished: list = []

    class RecordingCore(replay_mod.EngineCore):  # keeps every finished request for the analysis
        def _retire_finished(self) -> None:
            finished.extend(r for r in self.running if r.finish_s is not None)
            super()._retire_finished()

    recipe = RecipeRegistry.default().get(model)
    variant = recipe.default_variant
    cal = calibrate(recipe, variant)
    chunk = recipe.variant(variant).max_num_batched_tokens
    rows = replay_mod.load_mooncake(trace)
    out: dict = {}
    original, replay_mod.EngineCore = replay_mod.EngineCore, RecordingCore
    try:
        for n in sizes:
            for policy in ("prefix", "round_robin"):
                finished.clear()
                res = replay_mod.replay(replay_mod.SimReplayConfig(recipe, variant, n, policy, calibration=cal), rows)
                m = cal.model
                ttft = np.array([r.first_token_s - r.arrival_s + m.frontend_s for r in finished])
                hit = np.array([max(0, r.cached_tokens) + r.host_cached_tokens for r in finished])
                prompt = np.array([r.prompt_tokens for r in finished])
                lone = np.array([predict_lone_ttft(m, int(p), int(h), chunk) for p, h in zip(prompt, hit)])
                tail = ttft >= np.percentile(ttft, 90)
                out.setdefault(str(n), {})[policy] = {
                    "ttft_p90_s": round(res.ttft_p90_s, 3),
                    "ttft_p90_zero_wait_floor_s": round(float(np.percentile(lone, 90)), 3),
                    "tail_mean_prompt_tokens": int(prompt[tail].mean()),
                    "tail_cached_share": round(float(hit[tail].sum() / prompt[tail].sum()), 3),
                    "tail_share_waiting_over_100ms": round(float(np.mean((ttft - lone)[tail] > 0.1)), 3),
                }
    finally:
        replay_mod.EngineCore = original
    return out


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = doc["summary"]
    sizes = list(summ)
    policies = [p for p in next(iter(summ.values())) if not p.endswith(("@unbounded-kv", "@pooled-kv"))]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, title in [
        (axes[0], "prefix_hit_rate", "prefix-cache hit rate (hatched: host KV tier)"),
        (axes[1], "ttft_p50_s", "TTFT p50 (s)"),
        (axes[2], "ttft_p90_s", "TTFT p90 (s)"),
    ]:
        w = 0.8 / len(policies)
        for j, p in enumerate(policies):
            xs = [i + (j - (len(policies) - 1) / 2) * w for i in range(len(sizes))]
            ax.bar(xs, [summ[s][p][key] for s in sizes], width=w, label=p, color=f"C{j}")
            if key == "prefix_hit_rate" and p.endswith("@host-kv"):  # the host tier's hits on top, hatched
                ax.bar(xs, [summ[s][p]["host_hit_rate"] for s in sizes], width=w, hatch="//", fill=False,
                       bottom=[summ[s][p][key] for s in sizes], edgecolor=f"C{j}")
        ax.set_xticks(range(len(sizes)), [f"{s} replicas" for s in sizes])
        ax.set_title(title)
        if key == "prefix_hit_rate":
            ax.axhline(doc["ceiling_hit_rate"], color="k", ls="--", lw=1, label="ceiling (36.6%)")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.35)  # room for the legend above the bars
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle("Mooncake conversation trace, GLM-5.3 simulated replicas (zoe sim replay)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
