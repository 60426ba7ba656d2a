"""What a router that joins a running fleet (a scale-up, a rolling update's new pod) knows: the hit rate of its
first requests with and without pulling its peers' picture at start (`zoe router --picture-peers`).

Three simulated GLM-5.3 engines (`zoe sim serve`, 100x faster than real) behind two routers, A and B, each with
its own prefix index. An affinity front (a consistent hash of the request's first `--affinity-blocks` trace
blocks over the routers, as a ring-hash ingress does) sends the first `--warm` requests of the Mooncake
conversation trace to A or B. Then router C starts and joins the ring, and the next requests are sent until C has
received `--first` of them; measured over those requests: `new_router_hit`, the share of their prompt tokens C's
prefix index matched (C's `zoe_router_prefix_matched_tokens_total / zoe_router_prompt_tokens_total`), and
`new_router_engine_hit`, the share the engines found in their prefix caches (`vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total`, summed over the engines; requests are sent one at a time, so the change is the
request's). Variants, each on
fresh engines and routers:

- `pull`: C starts like a new chart pod: an empty membership file and `--picture-peers A,B`, so its membership and
  picture come from A and B (merged);
- `blind`: C starts with the membership pushed to it and no picture (what a new pod had before `--picture-peers`);
- `stay`: no C; the requests the ring would have given C are measured on the routers they reach (A or B), the
  hit rate of a fleet whose membership did not change.

Trace blocks (512 tokens in Mooncake) are rendered as 64-token blocks of text (`zoe_cluster.agentic.prompts`), the
router's block size, so two requests share a router block exactly where the trace says they share a block;
`max_tokens` is 2 (the routers' index is what is measured, not the engines).

    python bench/reliability/router_join.py      # -> router_join.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_matrix import ZOE, free_port, kill_tree, spawn, wait_http  # noqa: E402  (same folder)
from router_restart import metric  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from zoe_cluster.agentic.prompts import prompt_text  # noqa: E402
from zoe_cluster.router.membership import MemberReplica, Membership  # noqa: E402
from zoe_cluster.routing.hash_ring import HashRing  # noqa: E402
from zoe_cluster.sim.replay import load_mooncake  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL = "glm-5.3"
TRACE_BLOCK_TOKENS = 512
BLOCK_TOKENS = 64
VARIANTS = ("stay", "blind", "pull")
KV_TOKENS = 1_000_000
"""Each engine's KV capacity, and what membership tells the routers (their prefix indexes are sized to it)."""


def _counters(url: str) -> tuple[float, float]:
    return metric(url, "zoe_router_prefix_matched_tokens_total"), metric(url, "zoe_router_prompt_tokens_total")


def _engine_counters(urls: list[str]) -> tuple[float, float]:
    """Prefix-cache hit and queried tokens, summed over the engines (vLLM's metric names)."""
    return (sum(metric(u, "vllm:prefix_cache_hits_total") for u in urls),
            sum(metric(u, "vllm:prefix_cache_queries_total") for u in urls))


def trace_prompt(i: int, row) -> str:
    """Request i of the trace as text: its trace blocks as router-sized blocks (module docstring)."""
    tokens = max(1, round(row.input_tokens * BLOCK_TOKENS / TRACE_BLOCK_TOKENS))
    return prompt_text(tuple(row.hash_ids), BLOCK_TOKENS, tokens, str(i))


def run_variant(variant: str, rows: list, args: argparse.Namespace, tmp: Path) -> dict:
    procs = []
    env = {**os.environ, "ZOE_ROUTER_ADMIN_KEY": "k"}
    try:
        members = []
        for i in range(3):
            p = free_port()
            procs.append(spawn([*ZOE, "sim", "serve", "--model", MODEL, "--port", str(p), "--time-scale", "0.01",
                                "--startup-s", "0", "--served-model-name", MODEL, "--kv-tokens", str(KV_TOKENS)],
                               tmp / f"{variant}-sim{i}.log"))
            members.append(MemberReplica(id=f"glm/{i}/1", url=f"http://127.0.0.1:{p}", engine="sim", models=[MODEL],
                                         kv_capacity_tokens=KV_TOKENS))
        membership = Membership(version=1, replicas=members).model_dump_json()
        for m in members:
            wait_http(m.url + "/health")
        urls = {}

        def start_router(name: str, extra: list[str], membership_given: bool) -> None:
            port = free_port()
            mfile = tmp / f"{variant}-{name}.json"
            if membership_given:
                mfile.write_text(membership)
            procs.append(spawn([*ZOE, "router", "--port", str(port), "--model", MODEL, "--membership-file",
                                str(mfile), *extra], tmp / f"{variant}-{name}.log", env=env))
            urls[name] = f"http://127.0.0.1:{port}"

        start_router("A", [], True)
        start_router("B", [], True)
        for u in urls.values():
            wait_http(u + "/health", 120)
        ring = HashRing(100, ["A", "B"])
        grown = HashRing(100, ["A", "B", "C"])

        def key(row) -> str:
            return ",".join(map(str, row.hash_ids[:args.affinity_blocks])) or "none"

        with httpx.Client(timeout=120) as c:
            def send(name: str, i: int, row) -> None:
                r = c.post(urls[name] + "/v1/completions",
                           json={"model": MODEL, "prompt": trace_prompt(i, row), "max_tokens": 2})
                assert r.status_code == 200, r.text

            for i, row in enumerate(rows[:args.warm]):
                send(ring.lookup(key(row)), i, row)
            joined_s = None
            if variant != "stay":
                t0 = time.monotonic()
                start_router("C", ["--picture-peers", f"{urls['A']},{urls['B']}"] if variant == "pull" else [],
                             variant == "blind")
                wait_http(urls["C"] + "/health", 120)
                joined_s = round(time.monotonic() - t0, 2)
            before = {n: _counters(u) for n, u in urls.items()}
            moved = matched = tokens = hits = queried = 0
            window: list[float] = []
            engines = [m.url for m in members]
            for i, row in enumerate(rows[args.warm:], start=args.warm):
                owner = grown.lookup(key(row))
                if owner != "C":
                    send(ring.lookup(key(row)) if variant == "stay" else owner, i, row)
                    continue
                target = ring.lookup(key(row)) if variant == "stay" else "C"
                m0, p0 = _counters(urls[target])
                h0, q0 = _engine_counters(engines)
                send(target, i, row)  # one request at a time: the counters' change is this request's
                m1, p1 = _counters(urls[target])
                h1, q1 = _engine_counters(engines)
                matched, tokens, moved = matched + m1 - m0, tokens + p1 - p0, moved + 1
                hits, queried = hits + h1 - h0, queried + q1 - q0
                window.append((m1 - m0) / max(1.0, p1 - p0))
                if moved >= args.first:
                    break
            after = {n: _counters(u) for n, u in urls.items()}
            others = [n for n in ("A", "B")]
            om = sum(after[n][0] - before[n][0] for n in others)
            op = sum(after[n][1] - before[n][1] for n in others)
            if variant == "stay":
                om, op = om - matched, op - tokens  # A and B's own share, without the requests C would get
        return {"variant": variant, "requests_to_new_router": moved, "new_router_hit": round(matched / max(1, tokens), 4),
                "new_router_engine_hit": round(hits / max(1, queried), 4),
                "new_router_hit_first_20": round(sum(window[:20]) / max(1, len(window[:20])), 4),
                "new_router_hit_last_20": round(sum(window[-20:]) / max(1, len(window[-20:])), 4),
                "other_routers_hit": round(om / max(1.0, op), 4), "join_to_health_s": joined_s}
    finally:
        for p in procs:
            kill_tree(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(REPO / "third_party/traces/mooncake_conversation_trace.jsonl"))
    ap.add_argument("--warm", type=int, default=1500, help="trace requests sent to A and B before C joins")
    ap.add_argument("--first", type=int, default=150, help="requests the new router receives, measured")
    ap.add_argument("--affinity-blocks", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=str(HERE / "router_join.json"))
    args = ap.parse_args()
    rows = load_mooncake(args.trace)
    tmp = Path(tempfile.mkdtemp(prefix="zoe-join-"))
    results = []
    try:
        for v in args.variants.split(","):
            t0 = time.monotonic()
            results.append(run_variant(v, rows, args, tmp))
            results[-1]["wall_s"] = round(time.monotonic() - t0, 1)
            print(json.dumps(results[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cmd = "python bench/reliability/router_join.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(json.dumps({
        "command": cmd.strip(), "trace": Path(args.trace).name, "warm": args.warm, "first": args.first,
        "affinity_blocks": args.affinity_blocks, "engines": "3 x zoe sim serve glm-5.3 --time-scale 0.01",
        "block_tokens": BLOCK_TOKENS, "load_avg_1m": round(os.getloadavg()[0], 1), "results": results},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
