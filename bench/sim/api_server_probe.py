"""Where a vLLM request's time goes between the client and the engine: the client's TTFT, the API server's own TTFT
(`vllm:time_to_first_token_seconds`, from the request's arrival in the API server to its first output there) and the
engine's (queue + prefill, stamped in its engine core), read from /metrics around each request or burst, for:

- a request alone on an idle engine, and the same request while one stream decodes (the engine busy), at 16 and
  594 prompt tokens (594: the scaled Mooncake trace's mean);
- a 16-token request while 8 and 16 streams decode;
- bursts of 4 and 8 16-token requests and of 10 594-token ones sent together (the scaled Mooncake trace's requests
  arrive in bursts of 5-14).

With `--profile` the twin runs the same scenarios on that calibration (`twin_scenarios`) and both are written to
`api_server_probe.json` (README.md in this folder reads it).

    .venv/bin/python bench/sim/api_server_probe.py --url http://127.0.0.1:PORT \
        --profile bench/sim/calibration_vllm_cpu.yaml

vLLM's engine core takes new requests from its input queue between steps and stamps their arrival (QUEUED) then
(`vllm/v1/engine/core.py` `_process_input_queue`, `Scheduler.add_request`), so its queue + prefill time leaves out
the step in progress when a request reached it; the twin's engine-side figure is measured the same way
(`SimRequest.queued_s`).
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

from zoe_cluster.engines.metrics_text import sum_samples

HERE = Path(__file__).resolve().parent
ENGINE = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")
API = "vllm:time_to_first_token_seconds"
BUSY_PROMPTS = (16, 594)
"""Prompt tokens of the idle/busy-engine requests."""
BURSTS = ((4, 16), (4, 16), (4, 16), (8, 16), (8, 16), (8, 16), (10, 594), (10, 594), (10, 594))
"""(requests sent together, prompt tokens) of each burst, in order."""
STREAMS = (8, 16)


def reading(url: str) -> dict[str, float]:
    """Counts and sums of the engine's and the API server's TTFT histograms."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:  # noqa: S310 (the engine URL probed)
        text = resp.read().decode()
    names = {f"{h}_{k}" for h in (*ENGINE, API) for k in ("sum", "count")}
    if f"{ENGINE[1]}_count" not in text:
        raise SystemExit(f"{url}/metrics: no vllm:request_queue_time/prefill_time histograms (not a vLLM engine?)")
    return sum_samples(text, names)


def window(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float]:
    """(requests finished, mean engine TTFT, mean API-server TTFT) between two readings."""
    n = after[f"{ENGINE[0]}_count"] - before[f"{ENGINE[0]}_count"]
    api_n = after[f"{API}_count"] - before[f"{API}_count"]
    eng = sum(after[f"{h}_sum"] - before[f"{h}_sum"] for h in ENGINE)
    return n, eng / n if n else 0.0, (after[f"{API}_sum"] - before[f"{API}_sum"]) / api_n if api_n else 0.0


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


async def _alone(s: aiohttp.ClientSession, url: str, model: str, prompt: int, rng: random.Random, n: int,
                 pause_s: float) -> list[dict[str, float]]:
    """`n` requests one at a time, each with its client, API-server and engine TTFT (only windows where it alone
    finished)."""
    rows = []
    for _ in range(n):
        c0 = reading(url)
        t = await ttft(s, url, model, prompt, 2, rng)
        await asyncio.sleep(0.03)
        done, eng, api = window(c0, reading(url))
        if done == 1:
            rows.append({"client_s": t, "api_s": api, "engine_s": eng})
        await asyncio.sleep(pause_s)
    return rows


async def probe(url: str, model: str, seed: int, n: int = 8) -> dict:
    rng = random.Random(seed)
    out: dict = {"alone": [], "bursts": [], "under_streams": []}
    async with aiohttp.ClientSession() as s:
        await ttft(s, url, model, 16, 2, rng)  # warm-up
        for prompt in BUSY_PROMPTS:
            for streams in (0, 1):
                running = [asyncio.create_task(ttft(s, url, model, 16, 1500, rng)) for _ in range(streams)]
                await asyncio.sleep(0.3 if streams else 0.0)
                rows = await _alone(s, url, model, prompt, rng, n, 0.1 if not streams else 0.0)
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                await asyncio.sleep(0.3)
                out["alone"].append({"prompt_tokens": prompt, "engine": "busy" if streams else "idle", "rows": rows})
        for k, prompt in BURSTS:
            c0 = reading(url)
            ts = await asyncio.gather(*[ttft(s, url, model, prompt, 2, rng) for _ in range(k)])
            await asyncio.sleep(0.1)
            _, eng, api = window(c0, reading(url))
            out["bursts"].append({"requests": k, "prompt_tokens": prompt, "client_ttft_s": sorted(ts),
                                  "engine_ttft_mean_s": eng, "api_ttft_mean_s": api})
        for streams in STREAMS:
            running = [asyncio.create_task(ttft(s, url, model, 16, 300, rng)) for _ in range(streams)]
            await asyncio.sleep(0.3)
            rows = await _alone(s, url, model, 16, rng, 4, 0.0)
            await asyncio.gather(*running)
            out["under_streams"].append({"streams": streams, "rows": rows})
    return out


def merge(runs: list[dict]) -> dict:
    """One result from repeated probes: each scenario's rows and bursts over all runs."""
    out = runs[0]
    for r in runs[1:]:
        for a, b in zip(out["alone"], r["alone"]):
            a["rows"] += b["rows"]
        out["bursts"] += r["bursts"]
        for a, b in zip(out["under_streams"], r["under_streams"]):
            a["rows"] += b["rows"]
    return out


def summarize(res: dict) -> dict:
    """Medians per scenario (ms): client, API-server and engine TTFT; bursts by (requests, prompt tokens)."""
    def med(rows: list[dict[str, float]], k: str) -> float | None:
        return round(statistics.median(r[k] for r in rows) * 1e3, 2) if rows else None

    out: dict = {}
    for a in res["alone"]:
        out[f"{a['engine']} engine, {a['prompt_tokens']} tokens"] = {k: med(a["rows"], f"{k}_s")
                                                                     for k in ("client", "api", "engine")}
    for u in res["under_streams"]:
        out[f"{u['streams']} streams, 16 tokens"] = {k: med(u["rows"], f"{k}_s") for k in ("client", "api", "engine")}
    for k, prompt in sorted(set(BURSTS)):
        bs = [b for b in res["bursts"] if (b["requests"], b["prompt_tokens"]) == (k, prompt)]
        if not bs:
            continue
        out[f"burst of {k} x {prompt} tokens"] = {
            "client": round(statistics.median(statistics.mean(b["client_ttft_s"]) for b in bs) * 1e3, 2),
            "client_first": round(statistics.median(b["client_ttft_s"][0] for b in bs) * 1e3, 2),
            "api": round(statistics.median(b["api_ttft_mean_s"] for b in bs) * 1e3, 2),
            "engine": round(statistics.median(b["engine_ttft_mean_s"] for b in bs) * 1e3, 2)}
    return out


# --- the twin on the same scenarios ------------------------------------------------------------------------------
def _twin_run(prof, cal, rows: list[tuple[float, int, int]]):  # type: ignore[no-untyped-def]
    from zoe_cluster.sim.engine_calibration import MEASURED_VARIANT
    from zoe_cluster.sim.replay import RowSource, SimReplayConfig, TraceRow, replay

    bs = prof.scheduler.block_tokens
    trace = [TraceRow(t, n_in, n_out, tuple(10**6 * i + h for h in range(n_in // bs)))  # no shared blocks
             for i, (t, n_in, n_out) in enumerate(rows)]
    config = SimReplayConfig(prof.recipe(), MEASURED_VARIANT, 1, "round_robin", calibration=cal,
                             kv_tokens=prof.scheduler.kv_tokens, log_requests=True)
    return replay(config, RowSource(trace, bs))


def twin_scenarios(prof) -> dict:  # type: ignore[no-untyped-def]
    """The twin's client and engine-side TTFT (ms) in the probe's scenarios: a request alone on the idle engine, the
    same arriving at 8 points of a step while streams decode, and bursts sent at once. Engine-side as vLLM stamps it
    (from the step boundary where the engine took the request), plus the part of `frontend_s` measured in the
    engine (none once the fit's idle wake-up is split out)."""
    cal = prof.calibration()
    api_s = prof.api_server_s if prof.api_server_s is not None else cal.model.frontend_s
    extra = cal.model.frontend_s - api_s
    out: dict = {}
    for prompt in BUSY_PROMPTS:
        res = _twin_run(prof, cal, [(0.0, prompt, 2)])
        out[f"idle engine, {prompt} tokens"] = {"client": res.request_log[0][1] * 1e3,
                                                 "engine": (res.engine_ttft_mean_s + extra) * 1e3}
    for streams in (1, *STREAMS):
        for prompt in (BUSY_PROMPTS if streams == 1 else (16,)):
            bg = _twin_run(prof, cal, [(0.0, 16, 1500)] * streams)
            step = cal.model.decode_step_s(streams)
            client, eng = [], []
            for j in range(8):
                t = 0.3 + step * j / 8
                res = _twin_run(prof, cal, [(0.0, 16, 1500)] * streams + [(t, prompt, 2)])
                client.append(next(x[1] for x in res.request_log if x[0] == t))
                # the mean over streams + probe, less the streams' own (the same run without the probe)
                eng.append(res.engine_ttft_mean_s * (streams + 1) - bg.engine_ttft_mean_s * streams + extra)
            name = f"busy engine, {prompt} tokens" if streams == 1 else f"{streams} streams, 16 tokens"
            out[name] = {"client": statistics.mean(client) * 1e3, "engine": statistics.mean(eng) * 1e3}
    for k, prompt in sorted(set(BURSTS)):
        res = _twin_run(prof, cal, [(0.0, prompt, 2)] * k)
        tt = sorted(x[1] for x in res.request_log)
        out[f"burst of {k} x {prompt} tokens"] = {"client": statistics.mean(tt) * 1e3, "client_first": tt[0] * 1e3,
                                                  "engine": (res.engine_ttft_mean_s + extra) * 1e3}
    return {name: {k: round(v, 2) for k, v in row.items()} for name, row in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="Runs of every scenario (a shared machine's stalls).")
    ap.add_argument("--profile", type=Path, default=None, help="A calibration: run the twin on the same scenarios.")
    ap.add_argument("--out", type=Path, default=HERE / "api_server_probe.json")
    args = ap.parse_args()
    import os

    load = os.getloadavg()[0]
    res = merge([asyncio.run(probe(args.url.rstrip("/"), args.model, args.seed + i)) for i in range(args.repeats)])
    doc = {"url": args.url, "machine_load_1min": [round(load, 1), round(os.getloadavg()[0], 1)],
           "summary_ms": summarize(res)}
    if args.profile:
        from zoe_cluster.sim.engine_calibration import load_engine_profile

        doc["profile"] = str(args.profile)
        doc["twin_ms"] = twin_scenarios(load_engine_profile(args.profile))
    args.out.write_text(json.dumps({**doc, **res}, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("summary_ms", "twin_ms") if k in doc}, indent=1))


if __name__ == "__main__":
    main()
