"""Live, side by side on one set of simulated GLM-5.3 replicas: the closed-loop session driver through zoe's router
and through sglang-router `cache_aware`, and the same sessions replayed on the virtual clock (`zoe sim replay
--sessions`), to check that live and replay agree.

    python bench/agentic/live_compare.py --peer-python /tmp/peers/venv/bin/python

Each live run gets freshly started replicas (empty caches, `zoe_cluster.bench.loopback`) and its own run salt, and
runs what `zoe bench agentic <sessions> --url ROUTER ...` runs (`agentic.live.run_live`, here in-process so that
every request's record can be joined with replay's). zoe's router is run `--repeats` times, a peer
`--peer-repeats`: the spread between repeats is the live run's noise on this machine, reported beside the
live/replay ratios. The simulated engines run
on a scaled wall clock (`--time-scale`); timings are divided by the same factor, so figures are modelled seconds,
as in replay. The hit rate is the engines' own /metrics counters; zoe's router's decisions by reason and its
ejections come from its /metrics. `--kv-tokens` cuts every replica's KV (and the router's index) so that a few
sessions load the fleet's HBM. The replay puts the router's slow-replica ejection around its policy as zoe's
router is configured (its default `slow_factor`, or what `--router-config-json` sets; `agentic.replay.SlowReplicaGuard`),
so both clocks run the same decisions.

Per request (joined on session key and trace position), the TTFT difference live minus replay is split into
requests whose cached tokens agree (the live path's own cost: client, HTTP, router, the engine's server) and
those that hit less live (another routing decision, or the engine's eviction), and the first is fitted as a fixed cost plus a cost per 100K prompt tokens.
Writes bench/agentic/live_compare.json (commands, setup, each run's report, the split) and live_compare.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from zoe_cluster.bench.loopback import RouterSpec, router_process, sim_replicas  # noqa: E402

SMALL = ("trace_0012,trace_0074,trace_0134,trace_0175,trace_0179,trace_0184,trace_0272,trace_0347,trace_0350,"
         "trace_0351,trace_0574,trace_0576,trace_0694,trace_0722")
"""The sessions of at most ~2M prompt tokens in all: what two CPU cores push through four engines and a router."""
COMPARED = ("prefix_hit_rate", "ttft_p50_s", "ttft_p90_s", "itl_p50_s", "itl_p90_s", "e2e_p90_s", "output_tok_s")


def session_dir(src: Path, names: list[str]) -> Path:
    d = Path(tempfile.mkdtemp(prefix="zoe-agentic-"))
    for n in names:
        (d / f"{n}.json").symlink_to(src / f"{n}.json")
    return d


def router_counters(url: str) -> dict:
    """zoe's router: requests by routing reason and ejections by cause, summed over replicas."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, dict[str, float]] = {"routing_reasons": {}, "ejections": {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "zoe_router_requests_total":
                key, label = "routing_reasons", s.labels["reason"]
            elif s.name == "zoe_router_ejections_total":
                key, label = "ejections", s.labels["cause"]
            else:
                continue
            out[key][label] = out[key].get(label, 0) + int(s.value)
    return out


def live_run(name: str, args, sessions: Path, tmp: Path, salt: int) -> tuple[str, dict, list]:
    """One live run of `name` on fresh replicas: (equivalent command, report, per-request records)."""
    from zoe_cluster.agentic.cli import twin_profile
    from zoe_cluster.agentic.live import LiveConfig, run_live
    from zoe_cluster.agentic.options import SessionOptions

    spec = RouterSpec.parse(name)
    served = spec.served_model(args.model)
    gpus = args.replicas * args.gpus_per_replica
    kv = ("--kv-tokens", str(args.kv_tokens)) if args.kv_override else ()
    with sim_replicas(args.replicas, model=args.model, time_scale=args.time_scale, log_dir=tmp,
                      served_model=served, extra_args=kv) as urls:
        extra = ("--config-json", args.router_config_json) if spec.kind == "zoe" and args.router_config_json else ()
        with router_process(spec, urls, model=args.model, log_dir=tmp, kv_capacity_tokens=args.kv_tokens,
                            peer_python=args.peer_python, extra_args=extra) as router:
            opts = SessionOptions(args.sessions, think_cap_s=args.think_cap_s, salt=salt)
            config = LiveConfig(router.url, served, gpus, urls, twin_profile(args.model, None),
                                server_time_scale=args.time_scale)
            report, records = asyncio.run(run_live(opts.driver(sessions), config))
            if spec.kind == "zoe":
                report["router"] = router_counters(router.url)
    cmd = (f"zoe bench agentic <sessions> --url <router> --sessions {args.sessions} --model {served} --gpus {gpus} "
           f"--twin-model {args.model} --think-cap-s {args.think_cap_s} --server-time-scale {args.time_scale} "
           f"--salt {salt}" + " --engine-url <replica>" * args.replicas)
    return cmd, report, records


class LoadSampler:
    """The machine's 1-minute load average every `every_s` seconds while a live run lasts (a background thread)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        return {"start": self.samples[0], "end": self.samples[-1], "max": max(self.samples),
                "mean": statistics.fmean(self.samples), "every_s": self.every_s}


def _key(rec) -> tuple[str, str]:
    return rec.call.session_key, rec.call.source.index


def split_ttft(replay_records: list, live_records: list, time_scale: float) -> dict:
    """Live minus replay TTFT per request, for requests whose cached tokens agree (the live path's cost) and for
    those that hit less live (routing); the first fitted as fixed + per-100K-prompt-token cost."""
    rep = {_key(r): r for r in replay_records if r.ok and r.ttft_s is not None}
    same, fewer_hits = [], []
    for r in live_records:
        k = _key(r)
        if not r.ok or r.ttft_s is None or k not in rep or r.cached_tokens is None:
            continue
        base = rep[k]
        row = (r.call.input_tokens, r.ttft_s - base.ttft_s, base.cached_tokens - r.cached_tokens)
        (same if abs(row[2]) < r.call.block_tokens else fewer_hits).append(row)
    out: dict = {"requests_joined": len(same) + len(fewer_hits), "same_cached": len(same),
                 "fewer_cached_live": sum(1 for r in fewer_hits if r[2] > 0),
                 "more_cached_live": sum(1 for r in fewer_hits if r[2] < 0),
                 "tokens_lost_live": sum(max(0, r[2]) for r in fewer_hits)}
    if len(same) >= 3:
        x = np.array([t for t, _, _ in same], dtype=float)
        y = np.array([d for _, d, _ in same], dtype=float)
        slope, icept = np.polyfit(x / 1e5, y, 1)
        out.update(same_cached_ttft_delta_p50_s=float(np.median(y)), same_cached_ttft_delta_p90_s=float(
            np.percentile(y, 90)), fit_fixed_s=float(icept), fit_per_100k_prompt_tokens_s=float(slope),
            fit_note=f"modelled seconds; wall seconds are these x time scale {time_scale:g}")
    if fewer_hits:
        out["fewer_cached_ttft_delta_sum_s"] = float(sum(d for _, d, lost in fewer_hits if lost > 0))
    return out


def summarize_repeats(reports: list[dict]) -> dict:
    """Per compared metric: mean, min, max over repeats and the spread (max - min) / mean."""
    out = {}
    for k in COMPARED:
        vals = [r[k] for r in reports if r.get(k) is not None]
        if not vals:
            continue
        mean = statistics.fmean(vals)
        out[k] = {"mean": mean, "min": min(vals), "max": max(vals),
                  "spread": (max(vals) - min(vals)) / mean if mean else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--files", default=SMALL, help="session files (ids) to run")
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=8, help="live sessions")
    ap.add_argument("--think-cap-s", type=float, default=10.0)
    ap.add_argument("--time-scale", type=float, default=1.0, help="real seconds per simulated second")
    ap.add_argument("--routers", default="zoe-prefix,sglang-router-cache_aware")
    ap.add_argument("--repeats", type=int, default=2, help="live runs of each zoe router (their spread is the noise)")
    ap.add_argument("--peer-repeats", type=int, default=1, help="live runs of each peer router")
    ap.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    ap.add_argument("--replay-policy", default="prefix", help="the routing policy of the virtual-clock replay")
    ap.add_argument("--kv-tokens", type=int, default=None,
                    help="KV capacity per replica, tokens (zoe sim serve --kv-tokens; default: the model's), to load "
                         "the replicas' HBM with few sessions")
    ap.add_argument("--router-config-json", default=None,
                    help="zoe router --config-json for zoe's routers, e.g. '{\"slow_factor\": null}' (no slow-replica "
                         "ejection)")
    ap.add_argument("--out", default=str(HERE / "live_compare.json"))
    args = ap.parse_args()
    args.kv_override = args.kv_tokens is not None
    from rich.progress import Progress

    from zoe_cluster.agentic.options import SessionOptions
    from zoe_cluster.agentic.replay import replay_sessions
    from zoe_cluster.recipes import RecipeRegistry
    from zoe_cluster.router.config import RouterConfig
    from zoe_cluster.sim.kv_cache import kv_capacity

    recipe = RecipeRegistry.default().get(args.model)
    args.kv_tokens = args.kv_tokens or kv_capacity(recipe, recipe.default_variant).tokens
    args.gpus_per_replica = recipe.variant(recipe.default_variant).parallelism.gpus
    names = args.files.split(",")
    sessions = session_dir(Path(args.sessions_dir), names)
    tmp = Path(tempfile.mkdtemp(prefix="zoe-agentic-live-"))
    routers = args.routers.split(",")
    runs, live_records = [], {}
    with Progress() as progress:
        repeats = {n: args.repeats if RouterSpec.parse(n).kind == "zoe" else args.peer_repeats for n in routers}
        task = progress.add_task("runs", total=sum(repeats.values()) + 1)
        progress.update(task, description="replay (virtual clock)")
        # prompts cut to the model's context, as `zoe sim replay` does; these sessions fit it whole
        opts = SessionOptions(args.sessions, think_cap_s=args.think_cap_s,
                              max_input_tokens=recipe.architecture.max_context_tokens)
        replay_records: list = []
        # the router's slow-replica ejection as zoe's router is configured here (its default unless the JSON says)
        slow_factor = json.loads(args.router_config_json or "{}").get(
            "slow_factor", RouterConfig.model_fields["slow_factor"].default)
        replay = replay_sessions(recipe, recipe.default_variant, opts.driver(sessions), args.replicas,
                                 args.replay_policy, kv_tokens=args.kv_tokens, records_out=replay_records,
                                 slow_factor=slow_factor)
        runs.append({"run": f"replay-{args.replay_policy}", "command": f"zoe sim replay <sessions> --sessions "
                     f"{args.sessions} --model {args.model} --replicas {args.replicas} --policy {args.replay_policy} "
                     f"--think-cap-s {args.think_cap_s}" + (f" --kv-tokens {args.kv_tokens}" if args.kv_override else "")
                     + " --json", "slow_factor": slow_factor,
                     "note": "in-process (agentic.replay.replay_sessions), with the router's slow-replica ejection "
                             "at slow_factor (agentic.replay.SlowReplicaGuard; null: off)", "report": replay})
        progress.advance(task)
        salt = 0
        for name in routers:
            for rep in range(repeats[name]):
                salt += 1
                progress.update(task, description=f"{name} #{rep + 1}")
                t0 = time.monotonic()
                with LoadSampler() as load:
                    cmd, report, records = live_run(name, args, sessions, tmp, salt)
                report["bench_wall_s"] = time.monotonic() - t0
                report["load_average_1m_at_end"] = load.samples[-1]
                report["load_average_1m"] = load.summary()
                runs.append({"run": name, "repeat": rep + 1, "command": cmd, "report": report})
                live_records.setdefault(name, []).append(records)
                progress.advance(task)
    by_router = {name: summarize_repeats([r["report"] for r in runs if r["run"] == name]) for name in routers}
    agreement = {}
    for name in routers:
        agreement[name] = {k: {"live_mean": v["mean"], "replay": replay.get(k),
                               "live_over_replay": v["mean"] / replay[k] if replay.get(k) else None,
                               "repeat_spread": v["spread"]}
                           for k, v in by_router[name].items()}
    split = {name: [split_ttft(replay_records, recs, args.time_scale) for recs in live_records[name]]
             for name in routers}
    doc = {
        "command": "python bench/agentic/live_compare.py " + " ".join(sys.argv[1:]),
        "setup": {"model": args.model, "replicas": args.replicas, "live_sessions": args.sessions, "files": names,
                  "think_cap_s": args.think_cap_s, "time_scale": args.time_scale, "repeats": repeats,
                  "machine_cpus": os.cpu_count(), "kv_capacity_tokens_per_replica": args.kv_tokens},
        "runs": runs,
        "live_vs_replay": agreement,
        "ttft_split": split,
    }
    out = Path(args.out)
    out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    plot(doc, out.with_suffix(".png"))
    for r in runs:
        rep = r["report"]
        print(r["run"], r.get("repeat", ""), {k: rep.get(k) for k in (
            "completed", "errors", "prefix_hit_rate", "reuse_ceiling", "ttft_p50_s", "ttft_p90_s", "ttft_floor_p90_s",
            "itl_p90_s", "output_tok_s_per_gpu")}, rep.get("router") or rep.get("routing_reasons"))
    print(json.dumps({"live_vs_replay": agreement, "ttft_split": split}, indent=1))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    names = [r["run"] + (f" #{r['repeat']}" if r.get("repeat") else "") for r in runs]
    colors = {runs[0]["run"]: "tab:gray"}
    palette = iter(["tab:blue", "tab:red", "tab:green", "tab:orange"])
    for r in runs:
        if r["run"] not in colors:
            colors[r["run"]] = next(palette)
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    panels = [("prefix_hit_rate", "prefix hit rate (engines' counters; twin in replay)", "reuse_ceiling"),
              ("ttft_p90_s", "TTFT p90 (modelled s)", "ttft_floor_p90_s"),
              ("ttft_p50_s", "TTFT p50 (modelled s)", None),
              ("output_tok_s_per_gpu", "output tok/s per GPU", None)]
    for ax, (key, title, ref) in zip(axes, panels):
        ax.bar(range(len(names)), [r["report"].get(key) or 0 for r in runs], color=[colors[r["run"]] for r in runs])
        if ref:
            for i, r in enumerate(runs):
                if r["report"].get(ref):
                    ax.plot([i - 0.4, i + 0.4], [r["report"][ref]] * 2, "k--", lw=1)
        if key == "prefix_hit_rate":
            lo = min(r["report"].get(key) or 1 for r in runs)
            ax.set_ylim(max(0.0, lo - 0.05), 1.0)
        ax.set_xticks(range(len(names)), names, fontsize=7, rotation=20, ha="right")
        ax.set_title(title + (f" (dashed: {ref})" if ref else ""), fontsize=8)
    s = doc["setup"]
    fig.suptitle(f"agentic, live vs replay: {s['replicas']} simulated {s['model']} replicas, {s['live_sessions']} "
                 f"live sessions of {len(s['files'])} files, think cap {s['think_cap_s']} s, time scale "
                 f"{s['time_scale']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
