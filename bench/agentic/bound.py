"""What any router can reach on the sweep's fleet: upper bounds on throughput per GPU at each p90 interactivity,
from the twin's step-time model and the 32 shared sessions, beside the measured curves of `sweep.py`.

    python bench/agentic/bound.py --sweep bench/agentic/sweep.json --sweep bench/agentic/sweep_host.json \
        --sweep bench/agentic/sweep_unbounded.json          # writes bench/agentic/bound.json and bound.png

Bounds, per replica of the sweep's variant (GLM-5.3 fp8-tp8-zoe unless --model says otherwise):

- Decode. A request decoding at X tok/s per user sits in steps of at most 1/X s. A step of B decode tokens whose
  requests hold c tokens of context each takes `StepModel.decode_step_s(B, B c)`, with c the sessions' mean
  decode context (prompt + half the output, weighted by output tokens). B is also at most the requests whose
  context fits in the replica's KV cache at once (an engine holds a running request's whole context in HBM) and
  the engine's `max_num_seqs`. So a replica emits at most B_max(X) x X tokens per second while it decodes.
- Prefill. The prompt tokens outside the reuse ceiling (never seen before in their session) must be prefilled
  whatever the routing; priced alone (`ttft_floor_s` less the frontend, the chunks a lone request gets), they
  cost p seconds of replica time per output token. A replica's time splits into decode steps and these prefill
  steps, so R <= B_max X (1 - R p), i.e. R <= B_max X / (1 + B_max X p).
- Demand. A closed loop's throughput is its live sessions' demand: with N live sessions at most N x the output
  rate of one session alone (`--alone`: every session on its own replica, cache unbounded; its output tokens over
  its duration, summed over the files). And the live sessions' chains fill the fleet's HBM at N_fit sessions (the
  time-weighted chain of a live session, i.e. its latest prompt between turns, against replicas x KV tokens);
  past N_fit some chain is out of HBM and re-prefilled at its next turn (or loaded back from a host tier).

`--sweep` files add their measured curves; the target line is 1.5x `session_hash`'s curve of each sweep file
(HBM only, host tier), interpolated as `sweep.ratios` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from sweep import curve, throughput_at  # noqa: E402

TARGET = 1.5
"""The issue's throughput ratio over `session_hash` at equal p90 interactivity."""


def session_stats(sessions_dir: str, model: str, think_cap_s: float) -> dict[str, Any]:
    """Every session alone (its own replica, unbounded KV): the per-request facts the bounds need."""
    from zoe_cluster.agentic.metrics import CallRecord
    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.agentic.replay import replay_sessions
    from zoe_cluster.recipes import RecipeRegistry

    recipe = RecipeRegistry.default().get(model)
    files = len(list(Path(sessions_dir).glob("*.json")))
    opts = SessionOptions(files, think_cap_s=think_cap_s, max_input_tokens=recipe.architecture.max_context_tokens)
    records: list[CallRecord] = []
    rep = replay_sessions(recipe, recipe.default_variant, opts.driver(sessions_dir), files, "session_hash",
                          kv_tokens=10**9, records_out=records)
    out_by: dict[str, int] = defaultdict(int)
    span_by: dict[str, list[float]] = {}
    chain_time: dict[str, float] = defaultdict(float)
    by_session: dict[str, list[CallRecord]] = defaultdict(list)
    for r in records:
        top = r.call.session_key.split("/")[0]
        by_session[top].append(r)
    for key, recs in by_session.items():
        recs.sort(key=lambda r: r.start_s)
        out_by[key] = sum(r.output_tokens for r in recs)
        end = max(r.start_s + (r.e2e_s or 0.0) for r in recs)
        span_by[key] = [recs[0].start_s, end]
        # the chain a session holds: its latest prompt (+ output), from one release to the next
        for a, b in zip(recs, recs[1:] + [None]):
            t_next = b.start_s if b is not None else end
            chain_time[key] += (a.call.input_tokens + a.output_tokens) * max(0.0, t_next - a.start_s)
    duration = sum(e - s for s, e in span_by.values())
    longest = max(e - s for s, e in span_by.values())
    out = sum(out_by.values())
    decode_ctx = sum(r.output_tokens * (r.call.input_tokens + r.output_tokens / 2) for r in records) / out
    return {
        "files": files, "requests": len(records), "output_tokens": out,
        "prompt_tokens": rep["prompt_tokens"], "reuse_ceiling": rep["reuse_ceiling"],
        "longest_session_alone_s": longest,
        "mean_chain_tokens": sum(chain_time.values()) / duration,
        "decode_context_tokens": decode_ctx,
        "records": [(r.call.input_tokens, min(r.call.input_tokens, r.call.reusable_blocks * r.call.block_tokens),
                     r.output_tokens) for r in records],
        "alone_command": f"zoe sim replay {sessions_dir} --sessions {files} --model {model} --replicas {files} "
                         f"--policy session_hash --think-cap-s {think_cap_s} --kv-tokens 1000000000 --json",
    }


def bounds(model: str, stats: dict[str, Any], replicas: int, levels: list[float]) -> dict[str, Any]:
    """The decode/prefill bound per interactivity level and the demand/HBM facts (module docstring)."""
    from zoe_cluster.agentic.metrics import ttft_floor_s
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.sim.core import long_prefill_cap
    from zoe_cluster.sim.calibrate import calibrate
    from zoe_cluster.sim.kv_cache import kv_capacity

    recipe = RecipeRegistry.default().get(model)
    name = recipe.default_variant
    v = recipe.variant(name)
    m = calibrate(recipe, name).model
    chunk = long_prefill_cap(v).lone_chunk_tokens(v.max_num_batched_tokens)
    kv_tokens = kv_capacity(recipe, name).tokens
    gpus = v.parallelism.gpus
    ctx = stats["decode_context_tokens"]
    prefill_s = sum(ttft_floor_s(m, chunk, n, cached) - m.frontend_s for n, cached, _ in stats["records"])
    p = prefill_s / stats["output_tokens"]
    b_kv = int(kv_tokens // ctx)
    b_seqs = v.max_num_seqs
    rows = []
    for x in levels:
        b_step = 0
        while b_step < 4096 and m.decode_step_s(b_step + 1, (b_step + 1) * ctx) <= 1.0 / x:
            b_step += 1
        b = min(b_step, b_kv, b_seqs)
        r = b * x / (1.0 + b * x * p)
        rows.append({"tok_s_per_user_p90": x, "batch_by_step_time": b_step, "batch": b,
                     "bound_tok_s_per_gpu": r / gpus})
    n_fit = replicas * kv_tokens / stats["mean_chain_tokens"]
    # N live sessions (the files replayed N / files times) emit their output over at least the longest alone
    lam = stats["output_tokens"] / stats["files"] / stats["longest_session_alone_s"]
    return {
        "variant": f"{recipe.name}/{name}", "gpus_per_replica": gpus, "replicas": replicas,
        "kv_tokens_per_replica": kv_tokens, "max_num_seqs": b_seqs, "prefill_chunk_tokens": chunk,
        "batch_by_kv": b_kv, "prefill_s_per_output_token": p,
        "sessions_filling_hbm": n_fit,
        "demand_tok_s_per_gpu_per_session": lam / (replicas * gpus),
        "demand_tok_s_per_gpu_at_hbm_fill": n_fit * lam / (replicas * gpus),
        "per_interactivity": rows,
    }


def measured(paths: list[str]) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """{sweep label: {policy: curve}} of the given sweep files."""
    out = {}
    for p in paths:
        doc = json.loads(Path(p).read_text())
        label = Path(p).stem
        out[label] = {pol: curve(pts) for pol, pts in doc["series"].items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--think-cap-s", type=float, default=60.0)
    ap.add_argument("--sweep", action="append", default=[], help="a sweep.py result to draw beside the bounds")
    ap.add_argument("--levels", default="10,14,18,21,25,28,32,36,40,45,50,55",
                    help="p90 tok/s per user at which the bounds and the curves are read")
    ap.add_argument("--out", default=str(HERE / "bound.json"))
    args = ap.parse_args()
    levels = [float(x) for x in args.levels.split(",")]
    stats = session_stats(args.sessions_dir, args.model, args.think_cap_s)
    b = bounds(args.model, stats, args.replicas, levels)
    curves = measured(args.sweep)
    table = []
    for row in b["per_interactivity"]:
        x = row["tok_s_per_user_p90"]
        entry = dict(row)
        for label, pols in curves.items():
            for pol, pts in pols.items():
                t = throughput_at(pts, x)
                entry[f"{label}:{pol}"] = t
                if pol == "session_hash" and t is not None:
                    entry[f"{label}:target"] = TARGET * t
        table.append(entry)
    stats.pop("records")
    doc = {"command": "python bench/agentic/bound.py " + " ".join(sys.argv[1:]), "sessions": stats,
           "bounds": {k: v for k, v in b.items() if k != "per_interactivity"}, "table": table}
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, curves, out.with_suffix(".png"))
    for e in table:
        print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in e.items()}))
    print(json.dumps(doc["bounds"], indent=1))


def plot(doc: dict[str, Any], curves: dict[str, dict[str, list[tuple[float, float]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axz) = plt.subplots(1, 2, figsize=(13, 5))
    xs = [r["tok_s_per_user_p90"] for r in doc["table"]]
    for a in (ax, axz):
        a.plot(xs, [r["bound_tok_s_per_gpu"] for r in doc["table"]], "k-", lw=2,
               label="bound: decode batch at the ITL, less the misses' prefill")
        a.axhline(doc["bounds"]["demand_tok_s_per_gpu_at_hbm_fill"], color="grey", ls=":",
                  label=f"demand of {doc['bounds']['sessions_filling_hbm']:.0f} sessions (chains fill HBM)")
        for label, pols in curves.items():
            style = "--" if "host" in label else ("-." if "unbounded" in label else "-")
            for pol, pts in pols.items():
                a.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=f"{pol} ({label})")
            if "session_hash" in pols:
                sh = pols["session_hash"]
                a.plot([p[0] for p in sh], [TARGET * p[1] for p in sh], style, color="red", lw=1,
                       label=f"1.5x session_hash ({label})")
        a.set_xlabel("p90 tok/s per user")
        a.set_ylabel("output tok/s per GPU")
        a.grid(alpha=0.3)
    ax.set_yscale("log")
    ax.set_title("bounds (log scale)")
    axz.set_ylim(0, 30)
    axz.set_title("measured curves and the 1.5x target")
    axz.legend(fontsize=6, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
