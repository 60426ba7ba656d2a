"""Live, side by side on one simulated cluster: zoe's router (prefix, round_robin) and sglang-router
(cache_aware) in front of the same N `zoe sim serve` GLM-5.3 replicas, driven by `zoe bench trace` on the
Mooncake conversation trace.

    python bench/router/live_compare.py --peer-python /tmp/peers/venv/bin/python

Each router gets freshly started replicas (empty caches) and a different trace seed. The simulated engines run
on a scaled wall clock (`--time-scale`, real seconds per simulated second), and `zoe bench trace` divides its
timings by the same factor, so TTFT is reported in modelled seconds. Writes bench/router/live_compare.json
(the commands and each run's report summary) and live_compare.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from zoe_cluster.bench.loopback import ZOE, RouterSpec, router_process, sim_replicas  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(REPO / "third_party/traces/mooncake_conversation_trace.jsonl"))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--limit", type=int, default=800, help="first N trace requests")
    ap.add_argument("--time-scale", type=float, default=0.1, help="real seconds per simulated second")
    ap.add_argument("--max-output-len", type=int, default=64, help="cap output tokens (CPU of this machine)")
    ap.add_argument("--routers", default="zoe-prefix,zoe-round_robin,sglang-router-cache_aware")
    ap.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    ap.add_argument("--out", default=str(HERE / "live_compare.json"))
    args = ap.parse_args()
    from rich.progress import Progress

    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim.kv_cache import kv_capacity

    recipe = RecipeRegistry.default().get(args.model)
    kv_tokens = kv_capacity(recipe, recipe.default_variant).tokens
    tmp = Path(tempfile.mkdtemp(prefix="zoe-live-"))
    runs = []
    names = args.routers.split(",")
    with Progress() as progress:
        task = progress.add_task("routers", total=len(names))
        for seed, name in enumerate(names, start=1):
            progress.update(task, description=name)
            # "zoe-prefix:key=value,key=value" passes policy tunables (`RouterSpec`)
            spec = RouterSpec.parse(name)
            served = spec.served_model(args.model)
            with sim_replicas(args.replicas, model=args.model, time_scale=args.time_scale, log_dir=tmp,
                              served_model=served) as urls:
                with router_process(spec, urls, model=args.model, log_dir=tmp, kv_capacity_tokens=kv_tokens,
                                    peer_python=args.peer_python) as router:
                    report = tmp / f"{name}.json"
                    cmd = ["zoe", "bench", "trace", args.trace, "--url", router.url, "--model", served,
                           "--time-scale", str(args.time_scale), "--server-time-scale", str(args.time_scale),
                           "--limit", str(args.limit), "--max-output-len", str(args.max_output_len), "--seed",
                           str(seed), "--out", str(report), "--label", name]
                    done = subprocess.run([*ZOE, *cmd[1:]], cwd=REPO, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name}: zoe bench trace failed ({done.returncode}): {done.stderr[-2000:]}")
            doc = json.loads(report.read_text())
            runs.append({"router": name, "command": shlex.join(cmd).replace(str(REPO.parent) + "/", "../")
                         .replace(str(tmp), "<tmp>"), "report": summary_of(doc)})
            progress.advance(task)
    doc = {"command": "python bench/router/live_compare.py " + " ".join(sys.argv[1:]),
           "setup": {"replicas": args.replicas, "limit": args.limit, "time_scale": args.time_scale,
                     "max_output_len": args.max_output_len, "machine_cpus": os.cpu_count(),
                     "kv_capacity_tokens_per_replica": kv_tokens},
           "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, Path(args.out).with_suffix(".png"))
    for r in runs:
        print(r["router"], json.dumps(r["report"]))


def summary_of(doc: dict) -> dict:
    """The row of a `zoe bench trace` report that this comparison needs."""
    row = doc["rows"][0] if "rows" in doc else doc
    ttft = row.get("ttft_s") or {}
    return {
        "completed": row.get("completed"), "errors": row.get("errors"),
        "client_cached_fraction": row.get("client_cached_fraction"),
        "ttft_p50_s": ttft.get("p50"), "ttft_p90_s": ttft.get("p90"), "ttft_p99_s": ttft.get("p99"),
        "output_tok_s": row.get("output_tok_s"),
    }


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    names = [r["router"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in [(axes[0], "client_cached_fraction", "prefix-cache hit rate (usage.cached_tokens)"),
                           (axes[1], "ttft_p50_s", "TTFT p50 (modelled s)"),
                           (axes[2], "ttft_p90_s", "TTFT p90 (modelled s)")]:
        ax.bar(range(len(names)), [r["report"].get(key) or 0 for r in runs],
               color=["tab:blue", "tab:orange", "tab:red", "tab:green"][: len(names)])
        ax.set_xticks(range(len(names)), names, fontsize=8, rotation=15, ha="right")
        ax.set_title(title, fontsize=9)
    s = doc["setup"]
    fig.suptitle(f"live: {s['replicas']} simulated GLM-5.3 replicas, first {s['limit']} Mooncake requests, "
                 f"time scale {s['time_scale']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
