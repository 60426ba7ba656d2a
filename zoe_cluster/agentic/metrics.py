"""The one summary of an agentic run, for both clocks: per-request records in, the report's JSON fields out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zoe_cluster.agentic.driver import Call
from zoe_cluster.sim.calibrate import predict_lone_ttft
from zoe_cluster.sim.step_model import StepModel


@dataclass(slots=True)
class CallRecord:
    """What happened to one released request; times are seconds of the run's clock."""

    call: Call
    ok: bool
    start_s: float
    dropped: bool = False
    """Refused before any engine served it (no routable replica, longer than an engine's KV cache)."""
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    tpot_s: float | None = None
    """Mean inter-token latency of the request: (end - first token) / (output tokens - 1)."""
    ttft_floor_s: float | None = None
    prompt_tokens: int | None = None
    """Prompt tokens the server reported (`usage`), when it did."""
    cached_tokens: int | None = None
    """Prompt tokens the server reported as cache hits (`usage.prompt_tokens_details.cached_tokens`)."""


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def ttft_floor_s(model: StepModel, max_num_batched_tokens: int, prompt_tokens: int, cached_tokens: int) -> float:
    """TTFT of a request alone on an idle replica whose first `cached_tokens` are already in its cache: the
    chunked prefill of the rest (at least the last token, as engines recompute it) plus `frontend_s`, as
    `sim.calibrate.predict_lone_ttft` prices it without the idle wake-up."""
    cached = min(max(0, cached_tokens), prompt_tokens - 1)
    return predict_lone_ttft(model, prompt_tokens, cached, max_num_batched_tokens, idle_wake=False)


def summarize(records: list[CallRecord], *, gpus: int | None, prefix_hit_rate: float | None) -> dict[str, Any]:
    """The fields of an agentic report over the records not marked warm-up.

    `prefix_hit_rate` is what the engines (or the twin) report; `reuse_ceiling` is the share of prompt tokens in
    leading blocks seen earlier in their session (what a perfect router and an unbounded cache could hit);
    `ttft_floor_p90_s` is None unless every record has a floor. ITL percentiles are over requests' mean
    inter-token latency; `tok_s_per_user_p90` is 1 / `itl_p90_s` (the p90 interactivity)."""
    measured = [r for r in records if not r.call.warmup]
    ok = [r for r in measured if r.ok]
    prompt = sum(r.call.input_tokens for r in measured)
    reusable = sum(min(r.call.input_tokens, r.call.reusable_blocks * r.call.block_tokens) for r in measured)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    floors = [r.ttft_floor_s for r in ok if r.ttft_floor_s is not None]
    itls = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    span = (max(r.start_s + (r.e2e_s or 0.0) for r in ok) - min(r.start_s for r in measured)) if ok else 0.0
    tok_s = out_tokens / span if span > 0 else 0.0
    itl_p90 = _pct(itls, 90)
    return {
        "requests": len(measured),
        "completed": len(ok),
        "dropped": sum(1 for r in measured if r.dropped),
        "errors": sum(1 for r in measured if not r.ok and not r.dropped),
        "prefix_hit_rate": prefix_hit_rate,
        "reuse_ceiling": reusable / prompt if prompt else 0.0,
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p90_s": _pct(ttfts, 90),
        "ttft_p99_s": _pct(ttfts, 99),
        "ttft_floor_p90_s": _pct(floors, 90) if ok and len(floors) == len(ok) else None,
        "itl_p50_s": _pct(itls, 50),
        "itl_p90_s": itl_p90,
        "e2e_p90_s": _pct(e2es, 90),
        "output_tok_s": tok_s,
        "output_tok_s_per_gpu": tok_s / gpus if gpus else None,
        "tok_s_per_user_p90": 1.0 / itl_p90 if itl_p90 else None,
        "prompt_tokens": prompt,
        "output_tokens": out_tokens,
        "span_s": span,
        "warmup_requests": len(records) - len(measured),
        "error_examples": sorted({(r.error or "")[:300] for r in measured if not r.ok})[:3],
    }
