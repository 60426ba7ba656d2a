"""Where a vLLM API server's delay comes from: the client's TTFT minus the engine's own (queue + prefill, stamped in
its engine core, read from /metrics) for a request sent alone, for a burst of requests sent together, and for a lone
request sent while other streams decode; writes `api_server_probe.json` (README.md in this folder reads it).

    .venv/bin/python bench/sim/api_server_probe.py --url http://127.0.0.1:PORT

A single API-server thread that admits requests one after another before the engine sees them would show in a
burst as engine-side queueing (the engine would see the requests staggered); a per-token streaming cost on that
thread as a gap under concurrent streams that grows with their number while their throughput stays capped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
import urllib.request
from pathlib import Path

import aiohttp

from zoe_cluster.sim.engine_calibration import engine_ttft_reading

HERE = Path(__file__).resolve().parent


def engine_reading(url: str) -> tuple[float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:  # noqa: S310 (the engine URL probed)
        reading = engine_ttft_reading(resp.read().decode())
    if reading is None:
        raise SystemExit(f"{url}/metrics: no vllm:request_queue_time/prefill_time histograms (not a vLLM engine?)")
    return reading


async def ttft(session: aiohttp.ClientSession, url: str, model: str, prompt_tokens: int, max_tokens: int,
               rng: random.Random) -> float:
    """Client TTFT of one streamed completion of random token ids."""
    body = {"model": model, "prompt": [rng.randrange(3, 2000) for _ in range(prompt_tokens)],
            "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = None
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if first is None and line.startswith(b"data:") and b"[DONE]" not in line:
                first = time.perf_counter() - t0
    if first is None:
        raise SystemExit(f"{url}: a stream ended without a token")
    return first


async def probe(url: str, model: str, seed: int) -> dict:
    rng = random.Random(seed)
    out: dict = {"lone_gap_s": [], "bursts": [], "under_streams": []}
    async with aiohttp.ClientSession() as s:
        await ttft(s, url, model, 16, 2, rng)  # warm-up
        for _ in range(8):
            c0 = engine_reading(url)
            t = await ttft(s, url, model, 16, 2, rng)
            await asyncio.sleep(0.05)
            c1 = engine_reading(url)
            out["lone_gap_s"].append(t - (c1[1] - c0[1]) / (c1[0] - c0[0]))
        for k in (4, 8):
            for _ in range(3):
                c0 = engine_reading(url)
                ts = await asyncio.gather(*[ttft(s, url, model, 16, 2, rng) for _ in range(k)])
                await asyncio.sleep(0.1)
                c1 = engine_reading(url)
                out["bursts"].append({"requests": k, "client_ttft_s": sorted(ts),
                                      "engine_ttft_mean_s": (c1[1] - c0[1]) / (c1[0] - c0[0])})
        for streams in (8, 16):
            running = [asyncio.create_task(ttft(s, url, model, 16, 300, rng)) for _ in range(streams)]
            await asyncio.sleep(0.3)
            gaps = []
            for _ in range(4):
                c0 = engine_reading(url)
                t = await ttft(s, url, model, 16, 2, rng)
                await asyncio.sleep(0.02)
                c1 = engine_reading(url)
                if c1[0] - c0[0] == 1:  # only the probe finished in the window
                    gaps.append(t - (c1[1] - c0[1]))
            await asyncio.gather(*running)
            out["under_streams"].append({"streams": streams, "gap_s": gaps})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "api_server_probe.json")
    args = ap.parse_args()
    res = asyncio.run(probe(args.url.rstrip("/"), args.model, args.seed))
    lone = statistics.median(res["lone_gap_s"])
    for b in res["bursts"]:
        b["client_minus_engine_mean_s"] = statistics.mean(b["client_ttft_s"]) - b["engine_ttft_mean_s"]
    summary = {"lone_gap_median_s": lone,
               "burst_gap_median_s": {k: statistics.median(b["client_minus_engine_mean_s"] for b in res["bursts"]
                                                           if b["requests"] == k) for k in (4, 8)},
               "burst_engine_ttft_median_s": {k: statistics.median(b["engine_ttft_mean_s"] for b in res["bursts"]
                                                                   if b["requests"] == k) for k in (4, 8)},
               "under_streams_gap_median_s": {u["streams"]: statistics.median(u["gap_s"]) if u["gap_s"] else None
                                              for u in res["under_streams"]}}
    args.out.write_text(json.dumps({"url": args.url, "summary": summary, **res}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
