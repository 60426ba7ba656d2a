"""How fast a killed router serves again with its full membership (router HA, `--membership-file`).

Three `zoe sim serve` replicas; `zoe router --membership-file F` gets its membership pushed through the admin API,
is killed with SIGKILL and started again, `--runs` times. Measured per restart: seconds from the new process's
start to the first completion answered 200 through it, and whether `GET /admin/membership` then lists every
replica (no push was made after the restart). For comparison, a router without the file answers 503 until the
controller's next push.

    python bench/reliability/router_restart.py          # writes bench/reliability/router_restart.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_matrix import ZOE, free_port, kill_tree, spawn, wait_http  # noqa: E402  (same folder)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from zoe_cluster.router.membership import MemberReplica, Membership  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "router_restart.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zoe-restart-"))
    sims, urls = [], []
    for i in range(3):
        p = free_port()
        sims.append(spawn([*ZOE, "sim", "serve", "--model", "glm-5.3", "--port", str(p), "--time-scale", "0.01",
                           "--startup-s", "0", "--served-model-name", "glm-5.3"], tmp / f"sim{i}.log"))
        urls.append(f"http://127.0.0.1:{p}")
    port = free_port()
    router_url = f"http://127.0.0.1:{port}"
    argv = [*ZOE, "router", "--port", str(port), "--model", "glm-5.3", "--engine", "sim",
            "--membership-file", str(tmp / "membership.json")]
    env = {**os.environ, "ZOE_ROUTER_ADMIN_KEY": "k"}
    admin = {"Authorization": "Bearer k"}
    body = {"model": "glm-5.3", "prompt": "hello", "max_tokens": 4}
    rows = []
    router = None
    try:
        for u in urls:
            wait_http(u + "/health")
        router = spawn(argv, tmp / "router0.log", env=env)
        wait_http(router_url + "/health")
        m = Membership(version=int(time.time() * 1000), replicas=[
            MemberReplica(id=f"glm/{i}/1", url=u, engine="sim", models=["glm-5.3"]) for i, u in enumerate(urls)])
        assert httpx.put(router_url + "/admin/membership", json=m.model_dump(), headers=admin).status_code == 200
        for run in range(args.runs):
            os.killpg(router.pid, signal.SIGKILL)
            router.wait()
            t0 = time.monotonic()
            router = spawn(argv, tmp / f"router{run + 1}.log", env=env)
            while True:
                try:
                    if httpx.post(router_url + "/v1/completions", json=body, timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.02)
            serving_s = time.monotonic() - t0
            listed = httpx.get(router_url + "/admin/membership", headers=admin).json()["replicas"]
            rows.append({"run": run, "serving_s": round(serving_s, 3), "replicas_listed": len(listed)})
            print(rows[-1], flush=True)
    finally:
        if router is not None:
            kill_tree(router)
        for s in sims:
            kill_tree(s)
    doc = {"command": "python bench/reliability/router_restart.py " + " ".join(sys.argv[1:]),
           "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 1), "rows": rows,
           "serving_s_median": statistics.median(r["serving_s"] for r in rows),
           "serving_s_max": max(r["serving_s"] for r in rows)}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))


if __name__ == "__main__":
    main()
