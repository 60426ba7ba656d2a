"""Fit a variant's `StepModel` from what was measured for it (`recipe.variants[v].profile`).

- **Prefill** (`Recipe.ttft_points(v)`: single-request TTFT by input length and prefix-cache hit rate, seed
  table A5): the TTFT of one request is replayed exactly as the scheduler runs it, in chunks of
  `max_num_batched_tokens` starting after the cached prefix, and the chunk costs of `StepModel.prefill_step_s`
  plus `frontend_s` are fitted by weighted non-negative least squares (weights 1 / sqrt((3% of the value)^2 +
  std^2), so noisy cells count less), with the floor found by a grid search. Cached tokens skip their per-token
  work, but the new tokens still score every earlier position, cached ones included (the d and e terms).
- **Decode** (`profile.decode`: tok/s per node by concurrency, seed tables A7/A8): the step time at
  concurrency C is C x k / tok_s, with k the tokens a request emits per step (1, or the mean accepted tokens
  with speculative decoding) and C x (1 + proposed) tokens in the step. Variants that differ only in
  speculative decoding run the same kernels on the same weights, so their points are fitted together to one
  step function a + b*experts(n) + c*n; k of a speculative variant is fitted too (grid search) when it has
  points, else taken from `speculative.mean_accepted_tokens`.
- **Single-user decode by context** (`profile.context_decode`, seed table A3): a per-user step a0 + g*context;
  g becomes the context term and the batch terms are estimates (marked so).

Every coefficient says where it came from (`Calibration.sources`, `Calibration.estimates`).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from zoe_cluster.recipes import Recipe
from zoe_cluster.recipes.schema import DecodePoint, TtftPoint
from zoe_cluster.sim.step_model import StepModel, position_sums

APEX_CONTEXT_TOKENS = 600
"""Mean context during the seed's decode benchmark (short Apex prompt, OSL 1024): about 90 + 1024/2 tokens."""

EFFECTIVE_PREFILL_FLOPS_PER_GPU = 2.2e14
"""Prefill FLOP/s per GPU when a variant has no TTFT table (estimate: GLM-5.3 fp8-tp8 fit to seed table A5,
40B active parameters x 2 FLOP per token at 4.6e-5 s per token on 8 GPUs)."""

SMALL_BATCH_SLOPE_PER_BASE = 0.3 / 17.4
"""Decode step growth per extra token relative to the step's base, when only single-user data exists
(estimate: the seed's GLM-5.3 line, 17.4 ms + 0.3 ms per token, seed table A7)."""

NOISE_FLOOR = 0.03
"""Relative error every measurement is assumed to have at least, in the fit weights."""


class CalibrationError(ValueError):
    """The variant has nothing to calibrate from."""


@dataclass(frozen=True)
class Calibration:
    model: StepModel
    sources: dict[str, str]
    """What each group of coefficients was fitted to."""
    estimates: list[str] = field(default_factory=list)
    """Coefficients that are estimates rather than fits to measurements."""
    fit_error_pct: dict[str, float] = field(default_factory=dict)
    """Median and max absolute percentage error of the fit on the points it was fitted to."""

    def to_dict(self) -> dict:
        return {
            "model": self.model.to_dict(), "sources": self.sources, "estimates": self.estimates,
            "fit_error_pct": self.fit_error_pct,
        }


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few unknowns: the best feasible solution over every active set."""
    n = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a_s = a / scale
    best, best_res = np.zeros(n), float(np.sum(b * b))
    for k in range(1, n + 1):
        for cols in itertools.combinations(range(n), k):
            x, *_ = np.linalg.lstsq(a_s[:, cols], b, rcond=None)
            if np.any(x < 0):
                continue
            res = float(np.sum((a_s[:, cols] @ x - b) ** 2))
            if res < best_res - 1e-18:
                best_res = res
                best = np.zeros(n)
                best[list(cols)] = x
    return best / scale


def _pct_errors(pred: Sequence[float], meas: Sequence[float]) -> dict[str, float]:
    e = [abs(p / m - 1) * 100 for p, m in zip(pred, meas)]
    return {"median": float(np.median(e)), "max": float(max(e))} if e else {}


# --- prefill ----------------------------------------------------------------------------------------------
def cached_tokens_for(input_tokens: int, hit_rate: float, block_tokens: int) -> int:
    """Prompt tokens the prefix cache holds for a request at `hit_rate` (whole blocks, never the last token)."""
    blocks = int(round(hit_rate * input_tokens / block_tokens))
    return min(blocks, (input_tokens - 1) // block_tokens) * block_tokens


def prefill_chunks(input_tokens: int, cached: int, chunk: int) -> list[tuple[int, int]]:
    """(start, n) of each prefill step of a lone request, as the scheduler cuts them."""
    out, pos = [], cached
    while pos < input_tokens:
        n = min(chunk, input_tokens - pos)
        out.append((pos, n))
        pos += n
    return out


def predict_lone_ttft(model: StepModel, input_tokens: int, cached: int, chunk: int, idle_wake: bool = True) -> float:
    """TTFT of one request alone on an idle engine (what `EngineCore` yields; used to check fits, and without the
    idle wake-up as the agentic reports' zero-wait floor)."""
    t = model.frontend_s + (model.idle_wake_s if idle_wake else 0.0)
    for start, n in prefill_chunks(input_tokens, cached, chunk):
        s1, s2 = position_sums(start, n)
        t += model.prefill_step_s(n, s1, s2, kv_read_tokens=start + n)
    return t


@dataclass(frozen=True)
class PrefillFit:
    frontend_s: float
    floor_s: float
    per_token_s: float
    context_per_token_s: float
    context2_per_token_s: float
    step_base_s: float = 0.0
    """The per-step overhead the fit was given (`StepModel.prefill_step_base_s`)."""
    kv_read_s: float = 0.0
    """Per token of context each chunk attends over (`StepModel.prefill_kv_read_s`), when fitted."""


def fit_prefill(points: Sequence[TtftPoint], chunk: int, block_tokens: int, step_base_s: float = 0.0,
                kv_read: bool = False, frontend_floor_s: float = 0.0) -> PrefillFit:
    """Fit frontend, floor, per-token and context coefficients to single-request TTFT points; `step_base_s`, a
    known fixed cost of every prefill step (the engine's per-step overhead), is taken off each chunk first;
    `kv_read`: fit a cost per token of context each chunk attends over too (start + chunk tokens, once per chunk);
    `frontend_floor_s`: the least per-request latency (a measured share outside the engine)."""
    if len(points) < 3:
        raise CalibrationError(f"need at least 3 TTFT points to fit prefill, got {len(points)}")
    rows = []
    for p in points:
        cached = cached_tokens_for(p.input_tokens, p.hit_rate, block_tokens)
        chunks = [(n, *position_sums(s, n), s + n) for s, n in prefill_chunks(p.input_tokens, cached, chunk)]
        y = p.ttft_s.value
        w = 1.0 / np.hypot(NOISE_FLOOR * y, p.ttft_s.std or 0.0)
        rows.append((chunks, y, w))
    y = np.array([r[1] for r in rows])
    w = np.array([r[2] for r in rows])
    def fit_at(floor: float) -> tuple[float, PrefillFit]:
        q = 4e-5
        for _ in range(8):  # which chunks sit on the floor depends on q: iterate to a fixed point
            a = np.zeros((len(rows), 5 if kv_read else 4))
            const = np.full(len(rows), frontend_floor_s)
            for i, (chunks, _, _) in enumerate(rows):
                a[i, 0] = 1.0
                const[i] += step_base_s * len(chunks)
                for n, s1, s2, kv in chunks:
                    if kv_read:
                        a[i, 4] += kv
                    if q * n > floor:
                        a[i, 1] += n
                    else:
                        const[i] += floor
                    a[i, 2] += s1
                    a[i, 3] += s2
            x = nnls(a * w[:, None], (y - const) * w)
            done = abs(x[1] - q) <= 1e-3 * max(q, 1e-12)
            q = x[1]
            if done:
                break
        fit = PrefillFit(float(x[0]) + frontend_floor_s, float(floor), float(x[1]), float(x[2]), float(x[3]), step_base_s,
                         float(x[4]) if kv_read else 0.0)
        pred = np.array([_lone_ttft_fit(fit, r[0]) for r in rows])
        return float(np.sum(((pred - y) * w) ** 2)), fit

    # coarse grid over the floor, then a fine one around the best
    best = min((fit_at(f) for f in np.linspace(0.0, 0.25, 26)), key=lambda t: t[0])
    lo = max(0.0, best[1].floor_s - 0.01)
    best = min([best, *(fit_at(f) for f in np.linspace(lo, lo + 0.02, 21))], key=lambda t: t[0])
    assert best is not None
    return best[1]


def _lone_ttft_fit(f: PrefillFit, chunks: list[tuple[int, float, float, int]]) -> float:
    t = f.frontend_s
    for n, s1, s2, kv in chunks:
        t += max(f.floor_s, f.per_token_s * n) + f.step_base_s + f.kv_read_s * kv
        t += f.context_per_token_s * s1 + f.context2_per_token_s * s2
    return t


# --- decode -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeObservation:
    """One decode point of a variant: concurrency, tok/s per node, and that variant's speculative setup."""

    concurrency: int
    tok_s_per_node: float
    proposed: int = 0
    """Draft tokens proposed per request per step (0: none)."""
    spec_key: str = ""
    """Which speculative configuration the point belongs to ('' for none): points sharing a key share k."""


@dataclass(frozen=True)
class DecodeFit:
    base_s: float
    per_expert_s: float
    per_token_s: float
    accepted: dict[str, float]
    """Fitted (or given) mean tokens per step, by spec_key."""


def _experts(n: np.ndarray | float, e: int, k: int) -> np.ndarray | float:
    return e * (1.0 - (1.0 - k / e) ** n)


def constant_free(experts: np.ndarray) -> np.ndarray:
    """The experts(n) column of a decode fit, zeroed when it is the same at every point (a dense model: every token
    touches its one "expert"), where it is indistinguishable from the fixed cost a: a then holds the whole fixed
    cost of a step, which prefill steps pay too (`StepModel.prefill_step_base_s`), instead of an arbitrary share."""
    return np.zeros_like(experts) if experts.size and np.ptp(experts) == 0 else experts


def fit_decode(
    obs: Sequence[DecodeObservation],
    routed_experts: int,
    experts_per_token: int,
    context_per_token_s: float = 0.0,
    given_accepted: dict[str, float] | None = None,
) -> DecodeFit:
    """Fit a + b*experts(n) + c*n to decode observations (n = tokens in the step), and k of speculative
    configurations that have observations (grid search from 1 to 1 + proposed)."""
    given_accepted = dict(given_accepted or {})
    spec_keys = sorted({o.spec_key for o in obs if o.spec_key})
    # k scales every step of its points, so it is only identifiable next to points without speculation.
    anchored = any(not o.spec_key for o in obs)
    free = [s for s in spec_keys if anchored or s not in given_accepted]
    grids = []
    for s in free:
        prop = max(o.proposed for o in obs if o.spec_key == s)
        grids.append(np.arange(1.0, 1.0 + prop + 1e-9, 0.01))
    n_tok = np.array([o.concurrency * (1 + o.proposed) for o in obs], dtype=float)
    ex = constant_free(np.asarray(_experts(n_tok, routed_experts, experts_per_token), dtype=float))
    cols = 3 if len(obs) >= 3 else 2
    best = None
    for ks in itertools.product(*grids) if grids else [()]:
        acc = dict(zip(free, ks))
        kk = np.array([acc.get(o.spec_key, 1.0) if o.spec_key else 1.0 for o in obs])
        y = np.array([o.concurrency * k / o.tok_s_per_node for o, k in zip(obs, kk)])
        y = y - context_per_token_s * n_tok * APEX_CONTEXT_TOKENS
        a = np.stack([np.ones_like(n_tok), ex, n_tok][:cols], axis=1)
        w = 1.0 / y
        x = nnls(a * w[:, None], y * w)
        score = float(np.sum(((a @ x - y) * w) ** 2))
        if best is None or score < best[0] - 1e-15:
            best = (score, x, acc)
    assert best is not None
    _, x, acc = best
    given_accepted.update(acc)
    return DecodeFit(float(x[0]), float(x[1]), float(x[2]) if len(x) > 2 else 0.0, given_accepted)


# --- a whole variant --------------------------------------------------------------------------------------
def _step_key(v) -> tuple:  # type: ignore[no-untyped-def]
    """What makes two variants run the same step function (speculative decoding aside)."""
    return (v.image, v.weights.repo, v.weights.quantization, v.parallelism, tuple(sorted(v.kernels)), v.engine)


def _spec_key(name: str, v) -> str:  # type: ignore[no-untyped-def]
    return f"{name}:{v.speculative.method}:{v.speculative.num_speculative_tokens}" if v.speculative else ""


def decode_observations(
    recipe: Recipe, variant: str, keep: Callable[[str, DecodePoint], bool] | None = None
) -> tuple[list[DecodeObservation], list[str]]:
    """Decode points of `variant` and of the variants that run the same step function, in the prompt most of
    them were measured with; returns (observations, names of the variants they came from)."""
    v = recipe.variant(variant)
    key = _step_key(v)
    siblings = [n for n, o in recipe.variants.items() if _step_key(o) == key]
    pts = [(n, p) for n in siblings for p in recipe.variants[n].profile.decode if keep is None or keep(n, p)]
    if not pts:
        return [], []
    prompt = Counter(p.prompt for _, p in pts).most_common(1)[0][0]
    obs, used = [], []
    for n, p in pts:
        if p.prompt != prompt:
            continue
        sv = recipe.variants[n]
        prop = sv.speculative.num_speculative_tokens if sv.speculative else 0
        obs.append(DecodeObservation(p.concurrency, p.tok_s_per_node.value, prop, _spec_key(n, sv)))
        if n not in used:
            used.append(n)
    return obs, used


def calibrate(
    recipe: Recipe,
    variant: str,
    *,
    block_tokens: int = 16,
    ttft_keep: Callable[[TtftPoint], bool] | None = None,
    decode_keep: Callable[[str, DecodePoint], bool] | None = None,
) -> Calibration:
    """Fit the step model of `variant`. `ttft_keep` / `decode_keep` select the points to fit to (all by
    default; the fidelity benchmark fits on half and predicts the rest)."""
    v = recipe.variant(variant)
    arch = recipe.architecture
    sources: dict[str, str] = {}
    estimates: list[str] = []
    errors: dict[str, float] = {}
    chunk = v.max_num_batched_tokens

    # prefill
    ttft = [p for p in recipe.ttft_points(variant) if ttft_keep is None or ttft_keep(p)]
    if len(ttft) >= 3:
        pf = fit_prefill(ttft, chunk, block_tokens)
        src = v.profile.ttft_from or variant
        sources["prefill"] = f"fit to {len(ttft)} TTFT points of {recipe.name}/{src} ({ttft[0].ttft_s.source})"
    else:
        q = 2 * arch.active_params_b.value * 1e9 / (v.parallelism.gpus * EFFECTIVE_PREFILL_FLOPS_PER_GPU)
        pf = PrefillFit(frontend_s=0.05, floor_s=0.07, per_token_s=q, context_per_token_s=0.0, context2_per_token_s=0.0)
        sources["prefill"] = "estimate from active parameters (no TTFT table for this variant)"
        estimates += ["prefill_per_token_s", "prefill_floor_s", "frontend_s"]
    context_s = pf.context_per_token_s

    # single-user decode by context
    ctx_pts = v.profile.context_decode
    a0 = None
    if ctx_pts:
        xs = np.array([p.context_tokens for p in ctx_pts], dtype=float)
        ys = np.array([1.0 / p.tok_s_per_user.value for p in ctx_pts])
        g, a0 = np.polyfit(xs, ys, 1)
        g = max(0.0, float(g))
        if v.speculative and v.speculative.mean_accepted_tokens:
            # per-user tok/s already includes speculation: a step emits k tokens
            kk = v.speculative.mean_accepted_tokens.value
            a0, g = a0 * kk, g * kk / (1 + v.speculative.num_speculative_tokens)
            g = max(0.0, g)
        context_s = g
        sources["context"] = f"fit to {len(ctx_pts)} single-user decode points by context ({ctx_pts[0].tok_s_per_user.source})"
        if len(ttft) < 3:
            pf = PrefillFit(pf.frontend_s, pf.floor_s, pf.per_token_s, g, 0.0)
            estimates.append("context_per_token_s (prefill uses the decode context cost)")

    # decode by concurrency
    obs, used = decode_observations(recipe, variant, decode_keep)
    given = {}
    for n in used:
        sv = recipe.variants[n]
        if sv.speculative and sv.speculative.mean_accepted_tokens:
            given[_spec_key(n, sv)] = sv.speculative.mean_accepted_tokens.value
    own_spec = _spec_key(variant, v)
    if len(obs) >= 2:
        df = fit_decode(obs, arch.routed_experts, arch.experts_per_token, context_s, given)
        sources["decode"] = (
            f"fit to {len(obs)} decode points of {', '.join(used)} ({recipe.variants[used[0]].profile.decode[0].tok_s_per_node.source})"
        )
        pred = []
        for o in obs:
            k = df.accepted.get(o.spec_key, 1.0) if o.spec_key else 1.0
            ntok = o.concurrency * (1 + o.proposed)
            step = df.base_s + df.per_expert_s * _experts(ntok, arch.routed_experts, arch.experts_per_token)
            step += df.per_token_s * ntok + context_s * ntok * APEX_CONTEXT_TOKENS
            pred.append(o.concurrency * k / step)
        e = _pct_errors(pred, [o.tok_s_per_node for o in obs])
        errors.update({f"decode_{k}": val for k, val in e.items()})
        accepted = df.accepted.get(own_spec, 1.0) if own_spec else 1.0
        if own_spec and own_spec not in {o.spec_key for o in obs}:
            estimates.append("spec_accepted_tokens (recipe's mean_accepted_tokens)")
        base, per_expert, per_token = df.base_s, df.per_expert_s, df.per_token_s
    elif a0 is not None:
        accepted = v.speculative.mean_accepted_tokens.value if v.speculative and v.speculative.mean_accepted_tokens else 1.0
        slope = SMALL_BATCH_SLOPE_PER_BASE * a0
        per_expert = slope / arch.experts_per_token
        base = a0 - per_expert * arch.experts_per_token
        per_token = 0.0
        sources["decode"] = "single-user step from the context fit; batch growth estimated"
        estimates += ["decode_per_expert_s", "decode_per_token_s"]
    elif len(obs) == 1:
        o = obs[0]
        step = o.concurrency / o.tok_s_per_node
        per_expert = SMALL_BATCH_SLOPE_PER_BASE * step / arch.experts_per_token
        base = step - per_expert * _experts(o.concurrency, arch.routed_experts, arch.experts_per_token)
        per_token = 0.0
        accepted = given.get(own_spec, 1.0) if own_spec else 1.0
        sources["decode"] = f"one decode point of {used[0]}; batch growth estimated"
        estimates += ["decode_per_expert_s", "decode_per_token_s"]
    else:
        raise CalibrationError(
            f"{recipe.name}/{variant} has no decode measurements (profile.decode or profile.context_decode)"
        )
    if len(ttft) >= 3:
        got = [predict_lone_ttft(_model(pf, base, per_expert, per_token, arch, v, accepted), p.input_tokens,
                                 cached_tokens_for(p.input_tokens, p.hit_rate, block_tokens), chunk) for p in ttft]
        e = _pct_errors(got, [p.ttft_s.value for p in ttft])
        errors.update({f"ttft_{k}": val for k, val in e.items()})
    model = _model(pf, base, per_expert, per_token, arch, v, accepted, context_s)
    return Calibration(model, sources, estimates, errors)


def _model(pf: PrefillFit, base, per_expert, per_token, arch, v, accepted, context_s=None) -> StepModel:  # type: ignore[no-untyped-def]
    return StepModel(
        decode_base_s=base,
        decode_per_expert_s=per_expert,
        decode_per_token_s=per_token,
        routed_experts=arch.routed_experts,
        experts_per_token=arch.experts_per_token,
        prefill_per_token_s=pf.per_token_s,
        prefill_floor_s=pf.floor_s,
        context_per_token_s=pf.context_per_token_s if context_s is None else context_s,
        context2_per_token_s=pf.context2_per_token_s,
        frontend_s=pf.frontend_s,
        spec_proposed_tokens=v.speculative.num_speculative_tokens if v.speculative else 0,
        spec_accepted_tokens=accepted,
    )
