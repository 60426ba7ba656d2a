"""Several live `zoe router` processes behind a random front: does the engines' prefix hit rate hold when the
routers share their pictures (`zoe router --picture-peers ... --picture-share-s T`)?

    python bench/router/multi_router_live.py      # -> multi_router_live.json

`--engines` simulated GLM-5.3 engines (`zoe sim serve`, `--time-scale 0.01`: 100x faster than real, KV capacity
`--kv-tokens` each, told to the routers so their prefix indexes are sized to it) on loopback. The first
`--requests` requests of the Mooncake conversation trace are sent at their trace times sped up `--speed` times
(each on its own thread), each to a router drawn uniformly at random (seeded: the same draw for every variant), as
a plain Kubernetes Service spreads connections. Variants, each on fresh engines and routers:

- `one`: a single router receives every request (the baseline);
- `random`: `--routers` routers, each with its own prefix index;
- `share-Ts`: the same routers, each started with `--picture-peers` naming all of them and `--picture-share-s T`,
  for each T of `--share-s` (seconds of wall time: T x speed of the trace's time).

Measured: `engine_hit`, the share of prompt tokens the engines found in their prefix caches
(`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` summed over the engines), the outcome routing
is for; `router_hit`, the share of prompt tokens the routers' indexes matched
(`zoe_router_prefix_matched_tokens_total / zoe_router_prompt_tokens_total` summed over the routers). Trace blocks
(512 tokens) are rendered as 64-token blocks of text, the router's block size, as bench/reliability/router_join.py
renders them (`trace_prompt`), so two prompts share a router block exactly where the trace says they share a
block; `max_tokens` is 2.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench/reliability"))
from router_join import BLOCK_TOKENS, MODEL, trace_prompt  # noqa: E402  (the same prompts as the join benchmark)
from router_restart import metric  # noqa: E402

from zoe_cluster.bench.loopback import RouterSpec, free_port, sim_replicas, spawn, stop, wait_http  # noqa: E402
from zoe_cluster.sim.replay import load_mooncake  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS = ("one", "random", "share")
ADMIN_KEY = "bench-admin"


def run_variant(variant: str, rows: list, args: argparse.Namespace, tmp: Path, share_s: float | None = None) -> dict:
    n_routers = 1 if variant == "one" else args.routers
    spec = RouterSpec.parse("zoe-prefix")
    with sim_replicas(args.engines, model=MODEL, time_scale=0.01, log_dir=tmp,
                      extra_args=("--kv-tokens", str(args.kv_tokens))) as engines:
        ports = [free_port() for _ in range(n_routers)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        extra = ("--picture-peers", ",".join(urls), "--picture-share-s", str(share_s)) if share_s is not None else ()
        procs = [spawn(spec.argv(p, engines, model=MODEL, kv_capacity_tokens=args.kv_tokens, extra_args=extra),
                       tmp / f"{variant}-router-{p}.log") for p in ports]
        try:
            for u, p in zip(urls, procs):
                wait_http(u + "/health", proc=p)
            time.sleep(1.0)  # the routers' first health checks of the engines
            draw = random.Random(args.seed)
            targets = [urls[draw.randrange(len(urls))] for _ in rows]
            failures: list[str] = []
            lock = threading.Lock()

            def send(client: httpx.Client, i: int, row, url: str) -> None:
                body = {"model": MODEL, "prompt": trace_prompt(i, row), "max_tokens": 2}
                r = client.post(url + "/v1/completions", json=body)
                if r.status_code != 200:
                    with lock:
                        failures.append(f"{r.status_code}: {r.text[:200]}")

            t0 = time.monotonic()
            with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=64)) as client, \
                    ThreadPoolExecutor(args.concurrency) as pool:
                futures = []
                for i, (row, url) in enumerate(zip(rows, targets)):
                    delay = t0 + (row.arrival_s - rows[0].arrival_s) / args.speed - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    futures.append(pool.submit(send, client, i, row, url))
                for f in futures:
                    f.result()
            wall_s = time.monotonic() - t0
            hits = sum(metric(u, "vllm:prefix_cache_hits_total") for u in engines)
            queried = sum(metric(u, "vllm:prefix_cache_queries_total") for u in engines)
            matched = sum(metric(u, "zoe_router_prefix_matched_tokens_total") for u in urls)
            prompt = sum(metric(u, "zoe_router_prompt_tokens_total") for u in urls)
            shared = None
            if share_s is not None:
                shared = sum(httpx.get(u + "/admin/membership", headers={"Authorization": f"Bearer {ADMIN_KEY}"},
                                       timeout=10).json()["picture_sharing"]["chains_taken"] for u in urls)
            return {"variant": variant, "routers": n_routers, "share_s": share_s, "requests": len(rows),
                    "failed": len(failures), "failures": failures[:5], "engine_hit": round(hits / max(1.0, queried), 4),
                    "router_hit": round(matched / max(1.0, prompt), 4), "chains_shared": shared,
                    "requests_per_router": [targets.count(u) for u in urls], "send_wall_s": round(wall_s, 1)}
        finally:
            for p in procs:
                stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(REPO / "third_party/traces/mooncake_conversation_trace.jsonl"))
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--routers", type=int, default=4)
    ap.add_argument("--share-s", default="1,5", help="--picture-share-s of the `share` routers, s, comma-separated")
    ap.add_argument("--speed", type=float, default=10.0, help="trace time / wall time")
    ap.add_argument("--concurrency", type=int, default=32, help="threads sending requests")
    ap.add_argument("--kv-tokens", type=int, default=1_000_000, help="each engine's KV capacity, tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(HERE / "multi_router_live.json"))
    args = ap.parse_args()
    os.environ["ZOE_ROUTER_ADMIN_KEY"] = ADMIN_KEY  # the routers' admin key: peers exchange pictures with it
    rows = load_mooncake(args.trace)[:args.requests]
    results = []
    with tempfile.TemporaryDirectory(prefix="zoe-multi-router-") as tmp:
        runs = [(v, None) for v in args.variants.split(",") if v != "share"]
        if "share" in args.variants.split(","):
            runs += [(f"share-{float(t):g}s", float(t)) for t in args.share_s.split(",")]
        for v, share_s in runs:
            t0 = time.monotonic()
            results.append(run_variant(v, rows, args, Path(tmp), share_s))
            results[-1]["wall_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps(results[-1]), flush=True)
    one = next((r for r in results if r["variant"] == "one"), None)
    if one is not None:
        for r in results:
            ratio = r["engine_hit"] / one["engine_hit"] if one["engine_hit"] else None
            r["engine_hit_over_one_router"] = round(ratio, 4) if ratio is not None else None
    Path(args.out).write_text(json.dumps({
        "command": " ".join(["python bench/router/multi_router_live.py", *sys.argv[1:]]),
        "trace": Path(args.trace).name, "engines": f"{args.engines} x zoe sim serve {MODEL} --time-scale 0.01 "
        f"--kv-tokens {args.kv_tokens}", "speed": args.speed, "block_tokens": BLOCK_TOKENS,
        "load_avg_1m": round(os.getloadavg()[0], 1), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
