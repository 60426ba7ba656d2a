"""Concurrency sweep on the virtual clock: the 32 shared agentic sessions closed-loop on simulated GLM-5.3
replicas, 1..64 live sessions, throughput per GPU against p90 interactivity.

    python bench/agentic/sweep.py                       # writes bench/agentic/sweep.json and sweep.png
    python bench/agentic/sweep.py --replicas 8 --policies prefix --sessions 8,32

Each point is `zoe sim replay ../shared/traces/agentic --sessions N --model glm-5.3 --replicas R --policy P
--json` (the in-process `run_closed_loop`); sessions beyond the 32 files replay them again as new users.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from zoe_cluster.agentic.plot import plot_sweep  # noqa: E402
from zoe_cluster.agentic.replay import run_closed_loop  # noqa: E402

KEEP = ("live_sessions", "total_sessions", "requests", "completed", "dropped", "errors", "prefix_hit_rate",
        "reuse_ceiling", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_floor_p90_s", "itl_p50_s", "itl_p90_s",
        "e2e_p90_s", "output_tok_s", "output_tok_s_per_gpu", "tok_s_per_user_p90", "gpus", "preemptions", "wall_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--policies", default="prefix,session_hash")
    ap.add_argument("--sessions", default="1,2,4,8,16,32,64")
    ap.add_argument("--host-kv-gb", type=float, default=0.0)
    ap.add_argument("--out", default=str(HERE / "sweep.json"))
    args = ap.parse_args()
    from rich.progress import Progress

    levels = [int(x) for x in args.sessions.split(",")]
    policies = args.policies.split(",")
    series: dict[str, list[dict]] = {}
    with Progress() as progress:
        task = progress.add_task("sweep", total=len(levels) * len(policies))
        for policy in policies:
            for n in levels:
                progress.update(task, description=f"{policy} x {n} sessions")
                rep = run_closed_loop(args.sessions_dir, n, args.replicas, policy, model=args.model,
                                      host_kv_gb=args.host_kv_gb)
                series.setdefault(policy, []).append({k: rep.get(k) for k in KEEP})
                progress.advance(task)
    doc = {
        "command": "python bench/agentic/sweep.py " + " ".join(sys.argv[1:]),
        "point_command": "zoe sim replay ../shared/traces/agentic --sessions N --model "
                         f"{args.model} --replicas {args.replicas} --policy P --host-kv-gb {args.host_kv_gb} --json",
        "setup": {"model": args.model, "replicas": args.replicas, "host_kv_gb": args.host_kv_gb,
                  "think_cap_s": 60.0, "max_input_tokens": "the model's context"},
        "series": series,
    }
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot_sweep(series, out.with_suffix(".png"),
               f"{args.model}: 32 agentic sessions closed-loop, {args.replicas} simulated replicas (virtual clock)")
    for policy, pts in series.items():
        for p in pts:
            print(policy, p["live_sessions"], round(p["output_tok_s_per_gpu"], 2), round(p["tok_s_per_user_p90"], 1),
                  round(p["ttft_p90_s"], 3), p["prefix_hit_rate"], p["reuse_ceiling"])


if __name__ == "__main__":
    main()
