"""Session routing on agentic traffic: `prefix` vs `session_hash` vs `least_load` vs `round_robin`, closed loop on
the shared Claude-Code sessions, through the router's own policy code and simulated GLM-5.3 replicas (the twin,
virtual clock; `zoe sim replay PATH --sessions N` runs the same loop).

    python bench/agentic/policies.py [--traces ../shared/traces/agentic] [--jobs 2]

For every replica count (4, 8), live-session count (16, 32, 64), KV setting (HBM only; a host-memory KV tier of
`--host-kv-gb` per replica) and policy, it runs every session file once (more instances when more are live than
files; a repeated file is a new user) and writes bench/agentic/policies.json (each run's parameters and report:
the `zoe sim replay --sessions` fields, plus the routing reasons, session moves, preemptions and the fleet's
prefill load) and policies.png.

`--retention` runs the tool-pause experiment instead (policies_retention.json): 32 live sessions on 4 replicas
whose HBM is cut to `--retention-kv-tokens` (so thinking sessions' chains compete for it), HBM only and with the
host tier: `prefix`, `prefix` placing new sessions by instantaneous load only (`session_tokens` 0: thinking
sessions do not count), and `session_hash`.

Derived columns: `share_of_ceiling` (twin-reported prefix hit rate over the reuse ceiling; with a host tier,
HBM + host hits), `p90_over_floor` (TTFT p90 over the zero-wait floor p90: each request alone on an idle replica
with every reusable block hit) and `prefill_load` (the fleet's busy share from prefill alone at the floor: the
sum of the requests' floor prefill time over replicas x span; the fleet is counted saturated at >= 0.5, where
queueing for prefill cannot stay within 10% of the floor for any routing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces" / "agentic"
POLICIES = ("prefix", "session_hash", "least_load", "round_robin", "sglang_cache_aware")
HOST_KV_GB = 2048
"""Host memory per replica (one 8-GPU node) for the KV tier, as bench/router/replay_compare.py gives it."""
SATURATED_PREFILL_LOAD = 0.5
RETENTION_KV_TOKENS = 700_000
"""HBM KV per replica in the tool-pause experiment: about 7 of the sessions' ~100K-token chains, so 8 sessions per
replica must share it (GLM-5.3's real 2.77M holds every chain of these runs)."""
RETENTION_ARMS = (("prefix", "prefix", {}), ("prefix, thinking sessions not counted", "prefix", {"session_tokens": 0.0}),
                  ("session_hash", "session_hash", {}))


def recipe_with_threshold(model: str, long_prefill_token_threshold: int, image: str | None = None,  # type: ignore[no-untyped-def]
                          max_num_batched_tokens: int | None = None):
    """`model`'s recipe, its default variant run with vLLM's `--long-prefill-token-threshold` (0: as written) and,
    when given, another engine image (the twin reads only the vLLM release its tag names: whether the threshold
    cuts a request that is alone on the engine, as vLLM before 0.32 does) and another step token budget."""
    from zoe_cluster.recipes import RecipeRegistry

    recipe = RecipeRegistry.default().get(model)
    update: dict[str, Any] = {}
    if long_prefill_token_threshold:
        update["long_prefill_token_threshold"] = long_prefill_token_threshold
    if image:
        update["image"] = image
    if max_num_batched_tokens:
        update["max_num_batched_tokens"] = max_num_batched_tokens
    if update:
        recipe = recipe.model_copy(deep=True)
        name = recipe.default_variant
        recipe.variants[name] = recipe.variants[name].model_copy(update=update)
    return recipe


def policy_arguments(policy: str, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any] | None]:
    """(policy, policy_options) for `replay_sessions`: a registered policy by name, or `sglang_cache_aware`
    (sglang-router's `cache_aware`, `routing.policies.SglangCacheAwarePolicy`, unregistered) by a factory."""
    from zoe_cluster.routing.policies import SglangCacheAwarePolicy

    if policy != SglangCacheAwarePolicy.name:
        return policy, options
    config = SglangCacheAwarePolicy.Config(**(options or {}))
    return (lambda: SglangCacheAwarePolicy(config)), None


def run_one(traces: str, model: str, replicas: int, live: int, policy: str, host_kv_gb: float,
            policy_options: dict[str, Any] | None = None, kv_tokens: int | None = None,
            long_prefill_token_threshold: int = 0, think_cap_s: float = 60.0,
            image: str | None = None, max_num_batched_tokens: int | None = None,
            ramp_up_s: float = 0.0) -> dict[str, Any]:
    """One closed-loop replay (`zoe sim replay TRACES --sessions LIVE`, the default variant with
    `long_prefill_token_threshold` set when nonzero); its report with the derived columns."""
    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.agentic.replay import replay_sessions
    from zoe_cluster.sim.calibrate import calibrate

    t0 = time.perf_counter()
    recipe = recipe_with_threshold(model, long_prefill_token_threshold, image, max_num_batched_tokens)
    opts = SessionOptions(live, think_cap_s=think_cap_s, max_input_tokens=recipe.architecture.max_context_tokens,
                          ramp_up_s=ramp_up_s)
    chosen, options = policy_arguments(policy, policy_options)
    rep = replay_sessions(recipe, recipe.default_variant, opts.driver(traces), replicas, chosen,
                          policy_options=options, kv_tokens=kv_tokens, host_kv_gb=host_kv_gb)
    per_token_s = calibrate(recipe, rep["variant"]).model.prefill_per_token_s
    hits = (rep["prefix_hit_rate"] or 0.0) + rep.get("host_hit_rate", 0.0)
    floor_p90 = rep.get("ttft_floor_p90_s")
    # prefill the floor needs (every reusable block hit), as a share of the fleet's time: a lower bound on load
    cold_tokens = rep["prompt_tokens"] * (1.0 - rep["reuse_ceiling"])
    prefill_load = cold_tokens * per_token_s / (replicas * rep["span_s"]) if rep["span_s"] else None
    return {
        "replicas": replicas, "live_sessions": live, "policy": policy, "host_kv_gb": host_kv_gb,
        "policy_options": policy_options or {}, "kv_tokens": kv_tokens,
        "long_prefill_token_threshold": long_prefill_token_threshold, "think_cap_s": think_cap_s,
        "ramp_up_s": ramp_up_s,
        "image": recipe.variant(recipe.default_variant).image,
        "max_num_batched_tokens": recipe.variant(recipe.default_variant).max_num_batched_tokens,
        "share_of_ceiling": hits / rep["reuse_ceiling"] if rep["reuse_ceiling"] else None,
        "p90_over_floor": rep["ttft_p90_s"] / floor_p90 if floor_p90 else None,
        "prefill_load": prefill_load,
        "saturated": prefill_load is None or prefill_load >= SATURATED_PREFILL_LOAD,
        "bench_wall_s": round(time.perf_counter() - t0, 1),
        "report": rep,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=str(DEFAULT_TRACES))
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", default="4,8")
    ap.add_argument("--live", default="16,32,64")
    ap.add_argument("--policies", default=",".join(POLICIES[:4]),
                    help="comma-separated: registered policies, or sglang_cache_aware (sglang-router's cache_aware)")
    ap.add_argument("--ramp-up-s", type=float, default=0.0,
                    help="start the first live sessions spread evenly over this many seconds (zoe sim replay "
                         "--ramp-up-s): with more live sessions than files, repeated files are then not in lockstep")
    ap.add_argument("--host-kv-gb", type=float, default=HOST_KV_GB, help="host tier per replica (0: HBM only)")
    ap.add_argument("--long-prefill-token-threshold", default="0",
                    help="vLLM's --long-prefill-token-threshold values to run the default variant with (0: unset)")
    ap.add_argument("--engine-image", default=None,
                    help="run the default variant on this image instead (e.g. vllm/vllm-openai-rocm:v0.32.0)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="run the default variant with this step token budget instead")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "policies.json"))
    ap.add_argument("--plot-only", action="store_true", help="redraw policies.png from --out")
    ap.add_argument("--retention", action="store_true", help="the tool-pause experiment (policies_retention.json)")
    ap.add_argument("--retention-kv-tokens", type=int, default=RETENTION_KV_TOKENS)
    args = ap.parse_args()
    if args.retention:
        return retention(args)
    out = Path(args.out)
    if not args.plot_only:
        combos = [(int(n), int(live), p, tier, int(cap))
                  for n in args.replicas.split(",") for live in args.live.split(",")
                  for tier in ((0.0, args.host_kv_gb) if args.host_kv_gb else (0.0,))
                  for cap in args.long_prefill_token_threshold.split(",")
                  for p in args.policies.split(",")]
        rows = []
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futs = [pool.submit(run_one, args.traces, args.model, n, live, p, tier,
                                long_prefill_token_threshold=cap, image=args.engine_image,
                                max_num_batched_tokens=args.max_num_batched_tokens, ramp_up_s=args.ramp_up_s)
                    for n, live, p, tier, cap in combos]
            for i, f in enumerate(futs):
                row = f.result()
                rows.append(row)
                r = row["report"]
                print(f"[{i + 1}/{len(futs)}] {row['replicas']} replicas, {row['live_sessions']} live, "
                      f"{row['policy']}, host {row['host_kv_gb']:.0f} GB, "
                      f"threshold {row['long_prefill_token_threshold']}: hit {r['prefix_hit_rate']:.3f} "
                      f"(+host {r.get('host_hit_rate', 0):.3f}) of ceiling {r['reuse_ceiling']:.3f}, "
                      f"TTFT p90 {r['ttft_p90_s']:.2f} s (floor {r['ttft_floor_p90_s']:.2f}), "
                      f"{r['output_tok_s_per_gpu']:.2f} tok/s/GPU, dropped {r['dropped']}", flush=True)
        doc = {"command": "python bench/agentic/policies.py " + " ".join(sys.argv[1:]),
               "traces": str(Path(args.traces)), "model": args.model,
               "saturated_prefill_load": SATURATED_PREFILL_LOAD, "runs": rows}
        out.write_text(json.dumps(doc, indent=1) + "\n")
    plot(json.loads(out.read_text()), out.with_suffix(".png"))


def retention(args: argparse.Namespace) -> None:
    combos = [(name, pol, opts, tier) for tier in (0.0, args.host_kv_gb) for name, pol, opts in RETENTION_ARMS]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futs = [pool.submit(run_one, args.traces, args.model, 4, 32, pol, tier, opts, args.retention_kv_tokens,
                            ramp_up_s=args.ramp_up_s) for _, pol, opts, tier in combos]
        rows = []
        for (name, *_), f in zip(combos, futs):
            row = {"name": name, **f.result()}
            rows.append(row)
            r = row["report"]
            print(f"{name}, host {row['host_kv_gb']:.0f} GB: hit {r['prefix_hit_rate']:.3f} + host "
                  f"{r.get('host_hit_rate', 0):.3f} of {r['reuse_ceiling']:.3f}, TTFT p90 {r['ttft_p90_s']:.2f} s, "
                  f"{r['output_tok_s_per_gpu']:.2f} tok/s/GPU", flush=True)
    doc = {"command": "python bench/agentic/policies.py " + " ".join(sys.argv[1:]), "traces": args.traces,
           "model": args.model, "runs": rows}
    (HERE / "policies_retention.json").write_text(json.dumps(doc, indent=1) + "\n")


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    panels = sorted({(r["replicas"], r["host_kv_gb"]) for r in runs})
    fig, axes = plt.subplots(3, len(panels), figsize=(4.2 * len(panels), 10), squeeze=False)
    for j, (n, tier) in enumerate(panels):
        for p in POLICIES:
            pts = sorted((r for r in runs if r["replicas"] == n and r["host_kv_gb"] == tier and r["policy"] == p),
                         key=lambda r: r["live_sessions"])
            if not pts:
                continue
            live = [r["live_sessions"] for r in pts]
            axes[0][j].plot(live, [r["share_of_ceiling"] * 100 for r in pts], "o-", label=p)
            axes[1][j].plot(live, [r["p90_over_floor"] for r in pts], "o-", label=p)
            axes[2][j].plot([r["report"]["tok_s_per_user_p90"] for r in pts],
                            [r["report"]["output_tok_s_per_gpu"] for r in pts], "o-", label=p)
            for r in pts:
                axes[2][j].annotate(str(r["live_sessions"]), (r["report"]["tok_s_per_user_p90"],
                                                              r["report"]["output_tok_s_per_gpu"]), fontsize=7)
        title = f"{n} replicas, " + (f"host KV {tier:.0f} GB" if tier else "HBM only")
        axes[0][j].set_title(title, fontsize=9)
        axes[0][j].set_ylabel("hit rate, % of reuse ceiling")
        axes[0][j].axhline(97, color="grey", lw=0.7, ls="--")
        axes[1][j].set_ylabel("TTFT p90 / zero-wait floor p90")
        axes[1][j].axhline(1.1, color="grey", lw=0.7, ls="--")
        axes[1][j].set_xlabel("live sessions")
        axes[0][j].set_xlabel("live sessions")
        axes[2][j].set_xlabel("p90 interactivity, tok/s per user (1 / ITL p90)")
        axes[2][j].set_ylabel("output tok/s per GPU")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Closed-loop agentic sessions (32 shared Claude-Code traces), simulated GLM-5.3 replicas", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
