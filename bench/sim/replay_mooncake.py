"""`zoe sim replay` of the Mooncake conversation trace (12,031 requests, 59 minutes) on 8 simulated GLM-5.3
replicas, once per routing policy: wall time of the simulator and what each policy gives.

    .venv/bin/python bench/sim/replay_mooncake.py      # writes bench/sim/replay_mooncake.json and .png

Each run is the same code path as `zoe sim replay TRACE --model glm-5.3 --variant fp8-tp8-zoe --replicas 8
--policy P --json`, called in-process (the CLI adds only argument checks and printing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from rich.progress import Progress  # noqa: E402

from zoe_cluster.recipes import RecipeRegistry  # noqa: E402
from zoe_cluster.routing import policy_names  # noqa: E402
from zoe_cluster.sim.calibrate import calibrate  # noqa: E402
from zoe_cluster.sim.replay import SimReplayConfig, load_mooncake, replay  # noqa: E402

TRACE = Path(os.environ.get("ZOE_TRACES", Path(__file__).resolve().parents[2] / "third_party" / "traces")) / "mooncake_conversation_trace.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--variant", default="fp8-tp8-zoe")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--out", type=Path, default=HERE / "replay_mooncake.json")
    args = ap.parse_args()
    recipe = RecipeRegistry.default().get(args.model)
    rows = load_mooncake(args.trace)
    cal = calibrate(recipe, args.variant)
    runs = []
    with Progress() as prog:
        for policy in policy_names():
            task = prog.add_task(f"{policy}", total=len(rows))
            res = replay(SimReplayConfig(recipe, args.variant, args.replicas, policy, calibration=cal), rows,
                         progress=lambda n, task=task: prog.update(task, completed=n))
            d = res.to_dict()
            d.pop("per_replica")
            runs.append(d)
    out = {
        "command": f"python bench/sim/replay_mooncake.py --replicas {args.replicas} --variant {args.variant}",
        "cli_equivalent": f"zoe sim replay {args.trace} --model {args.model} --variant {args.variant} "
                          f"--replicas {args.replicas} --policy P --json",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "trace": str(args.trace), "requests": len(rows), "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["policy"] for r in runs]
    x = range(len(runs))
    for j, (key, label) in enumerate((("ttft_p50_s", "p50"), ("ttft_p90_s", "p90"), ("ttft_p99_s", "p99"))):
        axes[0].bar([i + (j - 1) * 0.25 for i in x], [r[key] for r in runs], width=0.25, label=label)
    axes[0].set_xticks(list(x), names)
    axes[0].set_ylabel("TTFT, simulated s")
    axes[0].set_yscale("log")
    axes[0].legend()
    axes[0].set_title(f"Mooncake conversation trace, {args.replicas} x {args.model} {args.variant}")
    axes[1].bar(list(x), [r["prefix_hit_rate"] * 100 for r in runs], color="tab:green")
    for i, r in enumerate(runs):
        axes[1].text(i, r["prefix_hit_rate"] * 100 + 0.5, f"{r['wall_s']:.1f} s wall", ha="center", fontsize=8)
    axes[1].set_xticks(list(x), names)
    axes[1].set_ylabel("prefix-cache hit rate, % of prompt tokens")
    axes[1].set_title("hit rate (label: simulator wall time)")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=120)
    print(json.dumps([{k: r[k] for k in ("policy", "wall_s", "prefix_hit_rate", "ttft_p50_s", "ttft_p99_s",
                                         "output_tok_s")} for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
