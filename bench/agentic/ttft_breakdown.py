"""What the slow requests of a closed-loop replay wait for: each request's TTFT split into its zero-wait floor,
the cache it missed, waiting, and the engine steps it shared (with other requests' prefill chunks, with decodes).

    python bench/agentic/ttft_breakdown.py --replicas 4 --live 64 [--policy-options JSON] [--ramp-up-s 60]

It runs `policies.run_one` (the replay `zoe sim replay --sessions` runs) with every replica's engine recording the
steps it ran (a subclass of the twin's `EngineCore` that logs, per step, the chunk of every request still
prefilling, the other prefill chunks and the decodes beside it; the engine's decisions are unchanged) and the
router's load ledger recording each decision's reason. Per request:

    TTFT = floor + miss + chunking + wait + with_decodes + with_prefills

- `floor`: the zero-wait floor the report compares against (alone on an idle replica, every reusable block hit);
- `miss`: the same floor with the blocks the replica actually had (prefill of a moved or scattered chain);
- `chunking`: its chunks priced alone as the engine cut them, over that floor (a chunk cut short by a full step
  budget still pays the least step time);
- `wait`: arrival to its first step, plus gaps between its prefill steps;
- `with_decodes`, `with_prefills`: what the decode tokens and other requests' prefill chunks in its steps added.

The p90 target turns on few requests: p90 TTFT <= 1.1 x floor p90 holds iff at most 10% of requests take longer
than that limit, and those whose own floor is above it count anyway. `allowance` is the share left for requests
pushed over the limit by anything else; `pushed` says how many were and by what (the largest component, the
routing decision's reason, and how many would be under the limit without each component). Counterfactual p90s:
`alone` (its own hits, no waiting, no sharing), `alone_with_decodes` (the oracle "met no queue but shared steps
with the replica's actual decodes"), `no_wait` (TTFT - wait). Runs accumulate in --out (one per setting).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from policies import DEFAULT_TRACES, run_one  # noqa: E402

import zoe_cluster.sim.replay as sim_replay  # noqa: E402
from zoe_cluster.routing.accounting import LoadLedger  # noqa: E402
from zoe_cluster.sim.core import EngineCore, SimRequest, Step  # noqa: E402
from zoe_cluster.sim.step_model import position_sums  # noqa: E402


class StepLog:
    """Per request id: its prefill steps as (start_s, end_s, own_s, with_decodes_s, with_prefills_s, cold_others,
    warm_others) and its cached tokens."""

    def __init__(self) -> None:
        self.steps: dict[str, list[tuple[float, float, float, float, float, int, int]]] = {}
        self.cached: dict[str, int] = {}
        self.reason: dict[str, str] = {}
        """The routing decision's reason (`RoutingDecision.reason`)."""
        self.queued_prefill: dict[str, int] = {}
        """Prefill tokens the router counted queued on the chosen replica when it sent the request."""


def recording_ledger(log: StepLog) -> type[LoadLedger]:
    class RecordingLedger(LoadLedger):
        def admit(self, ctx: Any, decision: Any, view: Any, cached_tokens: int) -> None:
            log.reason[ctx.request_id] = decision.reason
            log.queued_prefill[ctx.request_id] = view.queued_prefill_tokens
            super().admit(ctx, decision, view, cached_tokens)

    return RecordingLedger


def recording_core(log: StepLog) -> type[EngineCore]:
    class RecordingCore(EngineCore):
        def complete(self, step: Step, end: float) -> list[tuple[SimRequest, int]]:
            if step.prefill_tokens:
                self._record(step, end)
            return super().complete(step, end)

        def _record(self, step: Step, end: float) -> None:
            m = self.model
            pre = [(r, n) for r, n in step.entries if r.computed < r.prefill_len]
            n_dec = sum(n for r, n in step.entries if r.computed >= r.prefill_len)
            dctx = sum(r.computed * n for r, n in step.entries if r.computed >= r.prefill_len)
            start = end - step.duration_s
            for r, n in pre:
                s1, s2 = position_sums(r.computed, n)
                own = m.prefill_step_s(n, s1, s2)
                dec = m.prefill_step_s(n, s1, s2, n_dec, dctx) - own
                others = [o for o, _ in pre if o is not r]
                cold = sum(1 for o in others if 2 * max(0, o.cached_tokens) < o.prompt_tokens)
                log.steps.setdefault(r.request_id, []).append(
                    (start, end, own, dec, step.duration_s - own - dec, cold, len(others) - cold))
                if r.request_id not in log.cached:
                    log.cached[r.request_id] = max(0, r.cached_tokens)

    return RecordingCore


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


COMPONENTS = ("miss_s", "chunking_s", "wait_s", "with_decodes_s", "with_prefills_s")


def request_rows(records: list[Any], log: StepLog, model: Any, lone_chunk: int) -> list[dict[str, Any]]:
    """One breakdown row per completed, measured request (the module docstring's terms)."""
    from zoe_cluster.agentic.metrics import ttft_floor_s

    rows = []
    for rec in records:
        if not rec.ok or rec.call.warmup or rec.ttft_s is None:
            continue
        rid = rec.call.request_id
        steps = sorted(log.steps.get(rid, []))
        own = sum(s[2] for s in steps)
        dec = sum(s[3] for s in steps)
        cached = log.cached.get(rid, 0)
        floor_hit = ttft_floor_s(model, lone_chunk, rec.call.input_tokens, cached)
        wait = rec.ttft_s - model.frontend_s - sum(s[1] - s[0] for s in steps)
        rows.append({
            "release_s": rec.call.release_s, "session": rec.call.session_key, "reason": log.reason.get(rid),
            "queued_prefill_tokens": log.queued_prefill.get(rid), "prompt_tokens": rec.call.input_tokens,
            "new_tokens": rec.call.input_tokens - min(rec.call.input_tokens,
                                                      rec.call.reusable_blocks * rec.call.block_tokens),
            "cached_tokens": cached, "ttft_s": rec.ttft_s, "floor_s": rec.ttft_floor_s,
            "floor_with_hits_s": floor_hit, "alone_s": model.frontend_s + own,
            "alone_with_decodes_s": model.frontend_s + own + dec, "no_wait_s": rec.ttft_s - wait,
            "miss_s": floor_hit - rec.ttft_floor_s, "chunking_s": model.frontend_s + own - floor_hit,
            "wait_s": wait, "with_decodes_s": dec, "with_prefills_s": sum(s[4] for s in steps),
            "steps": len(steps), "steps_with_a_cold_prefill": sum(1 for s in steps if s[5]),
        })
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The counterfactual p90s, and the requests the p90 target turns on: p90 TTFT <= 1.1 x floor p90 holds iff at
    most 10% of requests take longer than `limit_s` = 1.1 x floor p90; those whose own floor is above it count
    anyway, so only the rest of the 10% (`allowance`) may be pushed over it by anything else."""
    floor_p90 = pct([r["floor_s"] for r in rows], 90)
    limit = 1.1 * floor_p90
    keys = ("floor_s", "floor_with_hits_s", "alone_s", "alone_with_decodes_s", "no_wait_s", "ttft_s")
    p90 = {k: pct([r[k] for r in rows], 90) for k in keys}
    pushed = [r for r in rows if r["floor_s"] <= limit < r["ttft_s"]]
    by_cause: dict[str, int] = {}
    for r in pushed:
        cause = max(COMPONENTS, key=lambda k: r[k])
        by_cause[cause] = by_cause.get(cause, 0) + 1
    by_reason: dict[str, int] = {}
    for r in pushed:
        by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + 1
    n = len(rows)
    return {
        "requests": n, "floor_p90_s": floor_p90, "limit_s": limit,
        "p90_s": p90, "p90_over_floor_p90": {k: v / floor_p90 for k, v in p90.items()},
        "share_floor_over_limit": sum(r["floor_s"] > limit for r in rows) / n,
        "allowance": 0.1 - sum(r["floor_s"] > limit for r in rows) / n,
        "share_pushed_over_limit": len(pushed) / n,
        "pushed": {
            "requests": len(pushed),
            "largest_component": by_cause,
            "routing_reason": by_reason,
            "component_s_median": {k: float(np.median([r[k] for r in pushed])) if pushed else None
                                   for k in COMPONENTS},
            "under_limit_without": {k: sum(1 for r in pushed if r["ttft_s"] - r[k] <= limit) for k in COMPONENTS},
        },
        "component_s_mean": {k: float(np.mean([r[k] for r in rows])) for k in COMPONENTS},
    }


def breakdown(args: argparse.Namespace) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from zoe_cluster.agentic import replay as agentic_replay
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim.calibrate import calibrate
    from zoe_cluster.sim.core import long_prefill_cap

    log = StepLog()
    records: list[Any] = []
    sim_replay.EngineCore = recording_core(log)  # type: ignore[misc]
    sim_replay.LoadLedger = recording_ledger(log)  # type: ignore[misc]
    replay_sessions = agentic_replay.replay_sessions

    def keep_records(*a: Any, **kw: Any) -> dict[str, Any]:
        return replay_sessions(*a, records_out=records, **kw)

    agentic_replay.replay_sessions = keep_records  # type: ignore[assignment]
    options = json.loads(args.policy_options) if args.policy_options else None
    row = run_one(args.traces, args.model, args.replicas, args.live, args.policy, 0.0, policy_options=options,
                  long_prefill_token_threshold=args.long_prefill_token_threshold, image=args.engine_image,
                  max_num_batched_tokens=args.max_num_batched_tokens, ramp_up_s=args.ramp_up_s)
    recipe = RecipeRegistry.default().get(args.model)
    model = calibrate(recipe, recipe.default_variant).model
    lone_chunk = long_prefill_cap(recipe.variant(recipe.default_variant)).lone_chunk_tokens(
        row["max_num_batched_tokens"])
    rows = request_rows(records, log, model, lone_chunk)
    rep = row["report"]
    return {
        "replicas": args.replicas, "live_sessions": args.live, "policy": args.policy, "policy_options": options or {},
        "long_prefill_token_threshold": args.long_prefill_token_threshold, "ramp_up_s": args.ramp_up_s,
        "image": row["image"], "max_num_batched_tokens": row["max_num_batched_tokens"],
        **summary(rows),
        "report": {k: rep[k] for k in ("ttft_p90_s", "ttft_floor_p90_s", "prefix_hit_rate", "reuse_ceiling",
                                       "output_tok_s_per_gpu", "routing_reasons", "span_s")},
    }, rows


def plot(doc: dict[str, Any], path: Path) -> None:
    """Per run: the share of requests pushed over 1.1 x floor p90, split by their largest component, against the
    allowance; and the counterfactual p90s over the floor p90."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    labels = [f"{r['replicas']} x {r['live_sessions']}" + (" moves at once" if r["policy_options"].get(
        "session_saturation_s") == 0 else "") for r in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    bottom = np.zeros(len(runs))
    for k in COMPONENTS:
        v = np.array([100 * r["pushed"]["largest_component"].get(k, 0) / r["requests"] for r in runs])
        a.bar(labels, v, bottom=bottom, label=k.removesuffix("_s"))
        bottom += v
    a.plot(labels, [100 * r["allowance"] for r in runs], "k_", ms=40, mew=2, label="allowance (p90 <= 1.1x)")
    a.set_ylabel("% of requests pushed over 1.1 x floor p90")
    a.legend(fontsize=7, title="largest part of the delay", title_fontsize=7)
    keys = ("floor_with_hits_s", "alone_s", "alone_with_decodes_s", "no_wait_s", "ttft_s")
    x = np.arange(len(runs))
    for j, k in enumerate(keys):
        b.bar(x + (j - 2) * 0.16, [r["p90_over_floor_p90"][k] for r in runs], 0.16, label=k.removesuffix("_s"))
    b.axhline(1.1, color="grey", ls="--", lw=0.8)
    b.set_xticks(x, labels)
    b.set_ylim(0.9, None)
    b.set_ylabel("p90 / floor p90")
    b.legend(fontsize=7)
    fig.suptitle("What the slow requests wait for: GLM-5.3 replicas x live sessions, prefix, threshold 2048 "
                 "(ttft_breakdown.json)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--live", type=int, default=64)
    ap.add_argument("--policy", default="prefix")
    ap.add_argument("--policy-options", default=None, help="the policy's tunables, a JSON object")
    ap.add_argument("--long-prefill-token-threshold", type=int, default=2048)
    ap.add_argument("--ramp-up-s", type=float, default=60.0)
    ap.add_argument("--engine-image", default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--rows", default=None, help="also write every request's breakdown to this JSON file")
    ap.add_argument("--out", default=str(HERE / "ttft_breakdown.json"),
                    help="a JSON file of runs; this run replaces a run of the same settings in it")
    args = ap.parse_args()
    run, rows = breakdown(args)
    run["command"] = "python bench/agentic/ttft_breakdown.py " + " ".join(sys.argv[1:])
    if args.rows:
        Path(args.rows).write_text(json.dumps(rows) + "\n")
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"runs": []}
    same = ("replicas", "live_sessions", "policy", "policy_options", "long_prefill_token_threshold", "ramp_up_s")
    doc["runs"] = [r for r in doc["runs"] if any(r.get(k) != run[k] for k in same)] + [run]
    out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in run.items() if k != "report"}, indent=1))


if __name__ == "__main__":
    main()
