"""A 10x slower replica behind zoe's router: which share of new requests does it still receive?

Three `zoe sim serve` GLM-5.3 replicas, one started with `--slowdown 10` (every engine step takes 10x longer),
behind `zoe router` (default policy and settings); closed-loop clients, half of them streaming, send requests with
distinct prompts for `--duration-s`. Each request's replica comes from the response's `x-zoe-replica` header.
Reported: the slow replica's share of the requests sent in each window (before and after `--after-s`), and
client latency percentiles per replica.

    python bench/router/slow_replica.py            # writes bench/router/slow_replica.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from zoe_cluster.bench.loopback import ZOE, free_port, spawn, stop, wait_http

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--after-s", type=float, default=10.0, help="the share is reported for requests sent after this")
    ap.add_argument("--slowdown", type=float, default=10.0)
    ap.add_argument("--faulty-flags", default=None,
                    help="`zoe sim serve` flags of the third replica instead of --slowdown, e.g. '--error-rate 0.5'")
    ap.add_argument("--time-scale", type=float, default=0.1, help="real seconds per simulated second")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--router-args", default="", help="extra `zoe router` arguments")
    ap.add_argument("--out", default=str(HERE / "slow_replica.json"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="zoe-slow-"))
    ports = [free_port() for _ in range(3)]
    sims = []
    for i, p in enumerate(ports):
        faulty = shlex.split(args.faulty_flags) if args.faulty_flags else ["--slowdown", str(args.slowdown)]
        flags = faulty if i == 2 else []
        sims.append(spawn([*ZOE, "sim", "serve", "--model", "glm-5.3", "--port", str(p), "--time-scale",
                           str(args.time_scale), "--startup-s", "0", "--served-model-name", "glm-5.3", *flags],
                          tmp / f"sim{i}.log"))
    rport = free_port()
    router_argv = [*ZOE, "router", "--port", str(rport), "--engine", "sim", "--model", "glm-5.3",
                   *[a for p in ports for a in ("--replica", f"http://127.0.0.1:{p}")], *shlex.split(args.router_args)]
    router = spawn(router_argv, tmp / "router.log")
    rows: list[tuple[float, str, float, int]] = []  # (sent at, replica, latency, status)
    lock = threading.Lock()
    try:
        for p in ports:
            wait_http(f"http://127.0.0.1:{p}/health")
        wait_http(f"http://127.0.0.1:{rport}/health")
        t0 = time.monotonic()
        stop_at = t0 + args.duration_s

        def client(k: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{rport}", timeout=120) as c:
                n = 0
                while time.monotonic() < stop_at:
                    n += 1
                    body = {"model": "glm-5.3", "prompt": f"client {k} request {n} " + "words " * 100,
                            "max_tokens": args.max_tokens, "stream": k % 2 == 1}
                    sent = time.monotonic()
                    r = c.post("/v1/completions", json=body)
                    with lock:
                        rows.append((sent - t0, r.headers.get("x-zoe-replica", "-"), time.monotonic() - sent,
                                     r.status_code))

        with cf.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
    finally:
        stop(router)
        for s in sims:
            stop(s)
    slow_id = "static/2/0"
    before = [r for r in rows if r[0] < args.after_s]
    after = [r for r in rows if r[0] >= args.after_s]
    per_replica = {}
    for rid in sorted({r[1] for r in rows}):
        lat = sorted(r[2] for r in rows if r[1] == rid)
        per_replica[rid] = {"requests": len(lat), "p50_s": round(statistics.median(lat), 3),
                            "max_s": round(lat[-1], 3)}
    out = {
        "command": "python bench/router/slow_replica.py " + shlex.join(sys.argv[1:]),
        "router_command": shlex.join(["zoe", *router_argv[3:]]),
        "args": vars(args),
        "requests": len(rows),
        "failed": sum(1 for r in rows if r[3] != 200),
        "slow_replica": slow_id,
        f"slow_share_before_{args.after_s:g}s": round(sum(r[1] == slow_id for r in before) / max(1, len(before)), 4),
        f"slow_share_after_{args.after_s:g}s": round(sum(r[1] == slow_id for r in after) / max(1, len(after)), 4),
        "slow_requests_after": sum(r[1] == slow_id for r in after),
        "requests_after": len(after),
        "per_replica": per_replica,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
