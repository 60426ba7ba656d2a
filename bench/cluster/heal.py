"""How fast a deployment heals, and what clients see meanwhile.

Deploys simulated replicas of glm-5.3 on a local Ray (16 fake GPUs), sends steady traffic through the
deployment's router, and injects failures one at a time: SIGKILL of an engine's process group (crash), SIGSTOP of
it (hang: only /health timeouts reveal it), SIGKILL of the replica's node actor (lost actor: the gang is
re-placed). For each it records the time to detect (injection -> the generation is marked failed), the time to
recover (injection -> the next generation is ready), and the requests that failed through the router.

    .venv/bin/python bench/cluster/heal.py --repeats 3 --out bench/cluster/heal.json --plot bench/cluster/heal.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import httpx  # noqa: E402
from rich.progress import Progress  # noqa: E402

from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec, HealthConfig  # noqa: E402
from zoe_cluster.recipes.loader import RecipeRegistry  # noqa: E402

SCENARIOS = ("engine crash", "engine hang", "node actor lost")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Traffic:
    """Closed-loop clients through the router; counts outcomes per time."""

    def __init__(self, url: str, clients: int = 4):
        self.url, self.ok, self.failed = url, 0, []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(self.url + "/v1/chat/completions", json={
                        "model": "glm-5.3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append((time.time(), r.status_code))
                except httpx.HTTPError as e:
                    self.failed.append((time.time(), type(e).__name__))

    def start(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def replica(handle, index: int) -> dict:
    import ray

    return next(r for r in ray.get(handle.status.remote())["replicas"] if r["index"] == index)


def history(handle, rid: str) -> dict:
    import ray

    return next(h for h in ray.get(handle.status.remote())["history"] if h["id"] == rid)


def inject(kind: str, rep: dict) -> None:
    if kind == "engine crash":
        os.killpg(rep["process_groups"][0], signal.SIGKILL)
    elif kind == "engine hang":
        os.killpg(rep["process_groups"][0], signal.SIGSTOP)
    else:
        os.kill(rep["member_pids"][0], signal.SIGKILL)


def run(args) -> dict:
    import ray

    from zoe_cluster.cluster.client import create_deployment, remove_deployment

    ray.init(address="local", num_gpus=16, num_cpus=4, include_dashboard=False, namespace="zoe",
             _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
    gcs = ray.get_runtime_context().gcs_address
    health = HealthConfig(check_interval_s=args.check_interval_s, check_timeout_s=args.check_timeout_s,
                          failures_to_restart=args.failures_to_restart, backoff_base_s=0.5, stop_grace_s=2)
    port = free_port()
    spec = DeploymentSpec(
        name="heal-bench", recipe=RecipeRegistry.default().get("glm-5.3"), variant="fp8-tp8", replicas=2,
        engine="sim", engine_env={"ZOE_SIM_TIME_SCALE": str(args.time_scale), "ZOE_SIM_STARTUP_S": str(args.startup_s)},
        health=health, router=DeploymentRouter(host="127.0.0.1", port=port, policy="round_robin"),
    )
    results: dict = {"deploy": {}, "scenarios": {k: [] for k in SCENARIOS}}
    t0 = time.time()
    handle = create_deployment(spec, gcs)
    st = ray.get(handle.wait_ready.remote(120))
    results["deploy"] = {"replicas": 2, "ready_s": time.time() - t0, "ready": st["replicas_ready"]}
    url = f"http://127.0.0.1:{port}"
    try:
        with Progress() as progress:
            task = progress.add_task("failures injected", total=args.repeats * len(SCENARIOS))
            for rep_i in range(args.repeats):
                for kind in SCENARIOS:
                    index = rep_i % 2
                    before = replica(handle, index)
                    traffic = Traffic(url).start()
                    time.sleep(args.settle_s)
                    ok_before = traffic.ok
                    t_inject = time.time()
                    inject(kind, before)
                    deadline = time.monotonic() + 120
                    while time.monotonic() < deadline:
                        now = replica(handle, index)
                        if now["generation"] > before["generation"] and now["state"] == "ready":
                            break
                        time.sleep(0.05)
                    t_ready = now["ready_at"]
                    time.sleep(args.settle_s)
                    traffic.stop()
                    old = history(handle, before["id"])
                    results["scenarios"][kind].append({
                        "replica": before["id"], "detect_s": old["failed_at"] - t_inject,
                        "recover_s": t_ready - t_inject, "failure": old["failure"],
                        "requests_ok": traffic.ok, "requests_ok_before_injection": ok_before,
                        "requests_failed": len(traffic.failed), "failures": traffic.failed[:10],
                    })
                    progress.advance(task)
    finally:
        remove_deployment("heal-bench")
        ray.shutdown()
    return results


def summarize(results: dict) -> dict:
    out = {}
    for kind, runs in results["scenarios"].items():
        out[kind] = {
            "detect_s_median": statistics.median(r["detect_s"] for r in runs),
            "recover_s_median": statistics.median(r["recover_s"] for r in runs),
            "recover_s_max": max(r["recover_s"] for r in runs),
            "requests_ok": sum(r["requests_ok"] for r in runs),
            "requests_failed": sum(r["requests_failed"] for r in runs),
        }
    return out


def plot(results: dict, summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(kinds))
    det = [[r["detect_s"] for r in results["scenarios"][k]] for k in kinds]
    rec = [[r["recover_s"] for r in results["scenarios"][k]] for k in kinds]
    ax.bar([x - 0.2 for x in xs], [statistics.median(d) for d in det], 0.4, label="detect (median)")
    ax.bar([x + 0.2 for x in xs], [statistics.median(r) for r in rec], 0.4, label="recover to ready (median)")
    for x, d, r in zip(xs, det, rec):
        ax.scatter([x - 0.2] * len(d), d, color="k", s=8, zorder=3)
        ax.scatter([x + 0.2] * len(r), r, color="k", s=8, zorder=3)
    labels = [f"{k}\nfailed requests: {summary[k]['requests_failed']}/"
              f"{summary[k]['requests_ok'] + summary[k]['requests_failed']}" for k in kinds]
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("seconds after the failure")
    ax.set_title("zoe deployment healing: 2 simulated replicas behind the router, steady traffic", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--time-scale", type=float, default=0.01, help="Simulated engine speed-up (0.01 = 100x).")
    p.add_argument("--startup-s", type=float, default=1.0, help="Simulated weight-load time, seconds.")
    p.add_argument("--check-interval-s", type=float, default=2.0)
    p.add_argument("--check-timeout-s", type=float, default=2.0)
    p.add_argument("--failures-to-restart", type=int, default=3)
    p.add_argument("--settle-s", type=float, default=1.0, help="Traffic before the injection and after recovery.")
    p.add_argument("--out", type=Path, default=Path("bench/cluster/heal.json"))
    p.add_argument("--plot", type=Path, default=Path("bench/cluster/heal.png"))
    args = p.parse_args()
    results = run(args)
    summary = summarize(results)
    doc = {
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "plot")},
        "summary": summary, **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    plot(results, summary, args.plot)
    print(json.dumps({"deploy": results["deploy"], "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
