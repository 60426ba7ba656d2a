"""prefix vs round_robin vs least_load on the Mooncake conversation trace, through `zoe sim replay` (the router's
own policy code driving N simulated GLM-5.3 replicas on the virtual clock).

    python bench/router/replay_compare.py [--trace ../shared/traces/mooncake_conversation_trace.jsonl]

Runs `zoe sim replay TRACE --model glm-5.3 --replicas N --policy P --json` for N in {4, 8} and every policy
(plus `prefix` with `--kv-tokens 1000000000`, an unbounded cache per replica, as a reference for what the
replicas' finite KV capacity costs),
and writes bench/router/replay_compare.json (each run's exact command and result) and replay_compare.png.
The hit-rate ceiling (36.6%) is the share of reusable prefix blocks with one unbounded shared cache
(../shared/traces/README.md).
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(REPO.parent / "shared/traces/mooncake_conversation_trace.jsonl"))
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
    with Progress() as progress:
        task = progress.add_task("replays", total=len(combos))
        for n, policy in combos:
            progress.update(task, description=f"{policy} x{n}")
            name, _, kv = policy.partition("@")
            cmd = ["zoe", "sim", "replay", args.trace, "--model", args.model, "--replicas", str(n), "--policy",
                   name, "--json", *(["--kv-tokens", "1000000000"] if kv else [])]
            out = subprocess.run([sys.executable, "-m", "zoe_cluster.cli.main", *cmd[1:]], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout
            res = json.loads(out)
            res.pop("per_replica", None)
            res["policy"] = policy
            runs.append({"command": shlex.join(cmd).replace(str(REPO.parent) + "/", "../"), **res})
            progress.advance(task)
    summary = {}
    for n in sorted({r["replicas"] for r in runs}):
        rr = next(r for r in runs if r["replicas"] == n and r["policy"] == "round_robin")
        summary[str(n)] = {
            r["policy"]: {
                "prefix_hit_rate": round(r["prefix_hit_rate"], 4),
                "share_of_ceiling": round(r["prefix_hit_rate"] / CEILING, 3),
                "ttft_p50_s": round(r["ttft_p50_s"], 3),
                "ttft_p90_s": round(r["ttft_p90_s"], 3),
                "p90_vs_round_robin": round(rr["ttft_p90_s"] / r["ttft_p90_s"], 2),
                "output_tok_s": round(r["output_tok_s"], 1),
            }
            for r in runs if r["replicas"] == n
        }
    doc = {"command": "python bench/router/replay_compare.py " + " ".join(sys.argv[1:]),
           "ceiling_hit_rate": CEILING, "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, Path(args.out).with_suffix(".png"))
    print(json.dumps(summary, indent=2))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = doc["summary"]
    sizes = list(summ)
    policies = [p for p in next(iter(summ.values())) if "@" not in p]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, key, title in [
        (axes[0], "prefix_hit_rate", "prefix-cache hit rate"),
        (axes[1], "ttft_p50_s", "TTFT p50 (s)"),
        (axes[2], "ttft_p90_s", "TTFT p90 (s)"),
    ]:
        w = 0.8 / len(policies)
        for j, p in enumerate(policies):
            xs = [i + (j - (len(policies) - 1) / 2) * w for i in range(len(sizes))]
            ax.bar(xs, [summ[s][p][key] for s in sizes], width=w, label=p)
        ax.set_xticks(range(len(sizes)), [f"{s} replicas" for s in sizes])
        ax.set_title(title)
        if key == "prefix_hit_rate":
            ax.axhline(doc["ceiling_hit_rate"], color="k", ls="--", lw=1, label="ceiling (36.6%)")
        ax.legend(fontsize=8)
    fig.suptitle("Mooncake conversation trace, GLM-5.3 simulated replicas (zoe sim replay)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
