"""Live, side by side on one set of simulated GLM-5.3 replicas: `zoe bench agentic` (closed-loop sessions)
through zoe's router and through sglang-router `cache_aware`, and the same sessions replayed on the virtual
clock (`zoe sim replay --sessions`), to check that live and replay agree.

    python bench/agentic/live_compare.py --peer-python /tmp/peers/venv/bin/python

Each router gets freshly started replicas (empty caches) and a different run salt. The simulated engines run on
a scaled wall clock (`--time-scale`); the bench divides its timings by the same factor, so figures are modelled
seconds, as in replay. The engines' own /metrics counters give the prefix hit rate. Writes
bench/agentic/live_compare.json (commands, each run's report) and live_compare.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench/router"))
from overhead import free_port, stop, wait_http  # noqa: E402  (loopback helpers of the router benches)

ZOE = [sys.executable, "-m", "zoe_cluster.cli.main"]
SMALL = ("trace_0012,trace_0074,trace_0134,trace_0175,trace_0179,trace_0184,trace_0272,trace_0347,trace_0350,"
         "trace_0351,trace_0574,trace_0576,trace_0694,trace_0722")
"""The sessions of at most ~2M prompt tokens in all: what two CPU cores push through four engines and a router."""
COMPARED = ("prefix_hit_rate", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "e2e_p90_s", "output_tok_s")


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)


def session_dir(src: Path, names: list[str]) -> Path:
    d = Path(tempfile.mkdtemp(prefix="zoe-agentic-"))
    for n in names:
        (d / f"{n}.json").symlink_to(src / f"{n}.json")
    return d


def live_run(name: str, args, sessions: Path, tmp: Path, salt: int) -> tuple[list[str], dict]:
    ports = [free_port() for _ in range(args.replicas)]
    # sglang-router lists its model as "unknown" in /v1/models; the replicas serve that name behind it
    served = args.model if name.startswith("zoe-") else "unknown"
    sims = [spawn([*ZOE, "sim", "serve", "--model", args.model, "--port", str(p), "--time-scale", str(args.time_scale),
                   "--startup-s", "0", "--served-model-name", served], tmp / f"sim-{name}-{i}.log")
            for i, p in enumerate(ports)]
    router = None
    try:
        for p in ports:
            wait_http(f"http://127.0.0.1:{p}/health")
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        rport = free_port()
        if name.startswith("zoe-"):
            policy = name.removeprefix("zoe-")
            argv = [*ZOE, "router", "--port", str(rport), "--model", args.model, "--policy", policy, "--engine", "sim",
                    "--kv-capacity-tokens", str(args.kv_tokens)]
            for u in urls:
                argv += ["--replica", u]
        else:
            argv = [args.peer_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(rport),
                    "--worker-urls", *urls, "--policy", name.removeprefix("sglang-router-"), "--log-level", "warn",
                    "--prometheus-port", str(free_port())]
        router = spawn(argv, tmp / f"router-{name}.log")
        wait_http(f"http://127.0.0.1:{rport}/health")
        time.sleep(1)
        out = tmp / f"{name}.json"
        cmd = ["zoe", "bench", "agentic", str(sessions), "--url", f"http://127.0.0.1:{rport}", "--sessions",
               str(args.sessions), "--model", served, "--gpus", str(args.replicas * args.gpus_per_replica),
               "--twin-model", args.model, "--think-cap-s", str(args.think_cap_s), "--server-time-scale",
               str(args.time_scale), "--salt", str(salt), "--out", str(out)]
        for u in urls:
            cmd += ["--engine-url", u]
        done = subprocess.run([*ZOE, *cmd[1:]], cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name}: zoe bench agentic failed ({done.returncode}): {done.stderr[-2000:]}")
        return cmd, json.loads(out.read_text())
    finally:
        if router is not None:
            stop(router)
        for s in sims:
            stop(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--files", default=SMALL, help="session files (ids) to run")
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=8, help="live sessions")
    ap.add_argument("--think-cap-s", type=float, default=10.0)
    ap.add_argument("--time-scale", type=float, default=0.5, help="real seconds per simulated second")
    ap.add_argument("--routers", default="zoe-prefix,sglang-router-cache_aware")
    ap.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    ap.add_argument("--out", default=str(HERE / "live_compare.json"))
    args = ap.parse_args()
    from rich.progress import Progress

    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.agentic.replay import run_closed_loop
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim.kv_cache import kv_capacity

    recipe = RecipeRegistry.default().get(args.model)
    args.kv_tokens = kv_capacity(recipe, recipe.default_variant).tokens
    args.gpus_per_replica = recipe.variant(recipe.default_variant).parallelism.gpus
    names = args.files.split(",")
    sessions = session_dir(Path(args.sessions_dir), names)
    tmp = Path(tempfile.mkdtemp(prefix="zoe-agentic-live-"))
    runs = []
    routers = args.routers.split(",")
    with Progress() as progress:
        task = progress.add_task("runs", total=len(routers) + 1)
        progress.update(task, description="replay (virtual clock)")
        opts = SessionOptions(args.sessions, think_cap_s=args.think_cap_s)
        replay = run_closed_loop(sessions, args.sessions, args.replicas, "prefix", model=args.model, options=opts)
        runs.append({"run": "replay-prefix", "command": f"zoe sim replay <sessions> --sessions {args.sessions} "
                     f"--model {args.model} --replicas {args.replicas} --policy prefix --think-cap-s "
                     f"{args.think_cap_s} --json", "report": replay})
        progress.advance(task)
        for salt, name in enumerate(routers, start=1):
            progress.update(task, description=name)
            cmd, rep = live_run(name, args, sessions, tmp, salt)
            runs.append({"run": name, "command": shlex.join(cmd).replace(str(sessions), "<sessions>")
                         .replace(str(tmp), "<tmp>"), "report": rep})
            progress.advance(task)
    live = next((r["report"] for r in runs if r["run"] == "zoe-prefix"), None)
    agreement = None
    if live is not None:
        agreement = {k: {"live": live.get(k), "replay": replay.get(k),
                         "live_over_replay": (live[k] / replay[k]) if live.get(k) and replay.get(k) else None}
                     for k in COMPARED}
    doc = {
        "command": "python bench/agentic/live_compare.py " + " ".join(sys.argv[1:]),
        "setup": {"model": args.model, "replicas": args.replicas, "live_sessions": args.sessions,
                  "files": names, "think_cap_s": args.think_cap_s, "time_scale": args.time_scale,
                  "machine_cpus": os.cpu_count(), "kv_capacity_tokens_per_replica": args.kv_tokens},
        "runs": runs,
        "live_vs_replay": agreement,
    }
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    plot(doc, out.with_suffix(".png"))
    for r in runs:
        rep = r["report"]
        print(r["run"], {k: rep.get(k) for k in ("completed", "errors", "prefix_hit_rate", "reuse_ceiling",
                                                 "ttft_p90_s", "ttft_floor_p90_s", "itl_p90_s",
                                                 "output_tok_s_per_gpu")})
    if agreement:
        print(json.dumps(agreement, indent=1))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    names = [r["run"] for r in runs]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    panels = [("prefix_hit_rate", "prefix hit rate (engines' counters; twin in replay)", "reuse_ceiling"),
              ("ttft_p90_s", "TTFT p90 (modelled s)", "ttft_floor_p90_s"),
              ("itl_p90_s", "ITL p90 (modelled s)", None),
              ("output_tok_s_per_gpu", "output tok/s per GPU", None)]
    for ax, (key, title, ref) in zip(axes, panels):
        ax.bar(range(len(names)), [r["report"].get(key) or 0 for r in runs],
               color=["tab:gray", "tab:blue", "tab:red", "tab:green"][: len(names)])
        if ref:
            for i, r in enumerate(runs):
                if r["report"].get(ref):
                    ax.plot([i - 0.4, i + 0.4], [r["report"][ref]] * 2, "k--", lw=1)
        ax.set_xticks(range(len(names)), names, fontsize=8, rotation=15, ha="right")
        ax.set_title(title + (f" (dashed: {ref})" if ref else ""), fontsize=8)
    s = doc["setup"]
    fig.suptitle(f"agentic, live vs replay: {s['replicas']} simulated {s['model']} replicas, {s['live_sessions']} "
                 f"live sessions of {len(s['files'])} files, think cap {s['think_cap_s']} s, time scale "
                 f"{s['time_scale']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
