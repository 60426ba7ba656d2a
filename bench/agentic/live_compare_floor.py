"""The simulated engine's server path against the twin core: one request at a time on an idle `zoe sim serve`
GLM-5.3 replica, sent to it directly and through zoe's router (alternating), its TTFT against the twin's zero-wait
floor for the same prompt and cached tokens (`agentic.metrics.ttft_floor_s`, what replay and `zoe bench agentic`
report as `ttft_floor_p90_s`), at two time scales.

    python bench/agentic/live_compare_floor.py

Time on the live path that is not the model (client, HTTP, JSON, the server's parsing and hashing, waiting for a
CPU) is wall time; divided by the time scale it shrinks in modelled seconds as the scale grows, while a modelling
difference between the server and the twin does not. Each point: a cold prompt of N tokens, then the same prompt
plus a short new turn (all N tokens cached). Writes bench/agentic/live_compare_floor.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from zoe_cluster.bench.loopback import RouterSpec, router_process, sim_replicas  # noqa: E402

NEW_TURN_TOKENS = 2048


def first_token_s(url: str, model: str, prompt: str) -> tuple[float, int]:
    """Wall seconds to the first streamed event of a 2-token completion, and the cached tokens it reports."""
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    first, cached = None, 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None:
                first = time.monotonic()
            usage = json.loads(line[6:]).get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    if first is None:
        raise RuntimeError(f"{url}: no streamed event")
    return first - t0, cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--prompt-tokens", default="8192,32768,131072")
    ap.add_argument("--time-scales", default="1.0,4.0")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "live_compare_floor.json"))
    args = ap.parse_args()
    from zoe_cluster.agentic.cli import twin_profile
    from zoe_cluster.agentic.metrics import ttft_floor_s
    from zoe_cluster.agentic.prompts import block_key, prompt_text, scope_number

    twin = twin_profile(args.model, None)
    block = 64
    rows = []
    scope = 0
    for ts in map(float, args.time_scales.split(",")):
        log_dir = Path(tempfile.mkdtemp())
        with sim_replicas(1, model=args.model, time_scale=ts, log_dir=log_dir) as (url,):
            with router_process(RouterSpec.parse("zoe-prefix"), [url], model=args.model, log_dir=log_dir) as router:
                paths = {"direct": url, "router": router.url}
                for path_url in paths.values():
                    first_token_s(path_url, args.model, "warm-up " * 64)  # a server's first request pays imports
                for n in map(int, args.prompt_tokens.split(",")):
                    for rep in range(args.repeats):
                        for path, path_url in paths.items():  # alternated, so both see the same machine load
                            scope += 1  # fresh text for each cold prompt
                            keys = tuple(block_key(scope_number(1, scope), h) for h in range(n // block))
                            cold_s, _ = first_token_s(path_url, args.model, prompt_text(keys, block, n, f"c{scope}"))
                            warm_s, cached = first_token_s(path_url, args.model, prompt_text(
                                keys, block, n + NEW_TURN_TOKENS, f"w{scope}"))
                            for kind, prompt, hit, wall_s in (("cold", n, 0, cold_s),
                                                              ("cached", n + NEW_TURN_TOKENS, n, warm_s)):
                                floor = ttft_floor_s(twin.model, twin.max_num_batched_tokens, prompt, hit)
                                rows.append({"time_scale": ts, "path": path, "kind": kind, "prompt_tokens": prompt,
                                             "cached_tokens": hit, "engine_cached_tokens": cached if hit else 0,
                                             "ttft_s": wall_s / ts, "floor_s": floor, "excess_s": wall_s / ts - floor,
                                             "excess_wall_s": wall_s - floor * ts, "repeat": rep + 1})
                                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for ts in sorted({r["time_scale"] for r in rows}):
        for path in ("direct", "router"):
            for kind in ("cold", "cached"):
                sel = [r for r in rows if r["time_scale"] == ts and r["path"] == path and r["kind"] == kind]
                summary[f"{path} {kind} @ time scale {ts:g}"] = {
                    "ttft_over_floor_median": statistics.median(r["ttft_s"] / r["floor_s"] for r in sel),
                    "excess_modelled_s_median": statistics.median(r["excess_s"] for r in sel),
                    "excess_wall_s_median": statistics.median(r["excess_wall_s"] for r in sel)}
    doc = {"command": "python bench/agentic/live_compare_floor.py " + " ".join(sys.argv[1:]),
           "setup": {"model": args.model, "twin": twin.name, "new_turn_tokens": NEW_TURN_TOKENS,
                     "machine_cpus": os.cpu_count(), "load_average_1m_at_end": os.getloadavg()[0]},
           "rows": rows, "summary": summary}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
