"""The fit of a live calibration drawn against what was measured (`zoe sim calibrate --url --plot`): prefill TTFT by
input length (one colour per measured hit rate), decode tok/s per node by batch, single-stream decode tok/s by
context, and the engine-side TTFT of prefill cells sent while streams decode (mixed steps); markers are measurements
(median, std bars), lines the fitted twin; a calibration of several passes draws each prefill cell's range over the
passes as a shaded bar."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from zoe_cluster.bench.plots import COLORS  # noqa: E402
from zoe_cluster.sim.calibrate import Calibration  # noqa: E402
from zoe_cluster.sim.calibrate import cached_tokens_for  # noqa: E402
from zoe_cluster.sim.engine_calibration import (  # noqa: E402
    APEX_CONTEXT_TOKENS,
    EngineProfile,
    busy_ttft_s,
    context_tok_s,
    decode_tok_s,
    lone_ttft_s,
)


def plot_fit(prof: EngineProfile, cal: Calibration, path: str | Path) -> Path:
    """Write the four-panel PNG to `path`."""
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    by_rate: dict[float, list] = {}
    for p in prof.profile.ttft:
        by_rate.setdefault(round(p.hit_rate, 1), []).append(p)
    ranges = dict(zip(map(id, prof.profile.ttft), [s.values for s in prof.pass_spread if s.cell.startswith("ttft ")]))
    for i, (rate, pts) in enumerate(sorted(by_rate.items())):
        pts.sort(key=lambda p: p.input_tokens)
        c = COLORS[i % len(COLORS)]
        spans = [(p.input_tokens, ranges[id(p)]) for p in pts if id(p) in ranges]
        if spans:
            ax.vlines([x for x, _ in spans], [min(v) * 1e3 for _, v in spans], [max(v) * 1e3 for _, v in spans],
                      color=c, alpha=0.3, lw=7, label=f"range over {len(prof.passes)} passes" if i == 0 else None)
        ax.errorbar([p.input_tokens for p in pts], [p.ttft_s.value * 1e3 for p in pts],
                    yerr=[(p.ttft_s.std or 0) * 1e3 for p in pts], fmt="o", color=c, capsize=3,
                    label=f"measured, hit ~{rate:.0%}")
        ax.plot([p.input_tokens for p in pts], [lone_ttft_s(prof, cal, p.input_tokens, p.hit_rate) * 1e3 for p in pts],
                "-", color=c, label="twin" if i == 0 else None)
        checks = [p for p in prof.client_ttft_check if round(p.hit_rate, 1) == rate]
        ax.plot([p.input_tokens for p in checks], [p.ttft_s.value * 1e3 for p in checks], "s", mfc="none", color=c,
                label="as the client saw it (check)" if i == 0 and checks else None)
    title = "prefill: single-request TTFT"
    if prof.api_server_s is not None:
        title += f"\n(engine-side + API server {prof.api_server_s * 1e3:.1f} ms)"
    ax.set(xlabel="input tokens", ylabel="TTFT, ms", title=title)
    ax.legend(fontsize=7)

    ax = axes[1]
    contexts = dict(zip([p.concurrency for p in prof.profile.decode],
                        prof.decode_contexts or [APEX_CONTEXT_TOKENS] * len(prof.profile.decode)))
    pts = sorted(prof.profile.decode, key=lambda p: p.concurrency)
    xs = [p.concurrency for p in pts]
    ax.errorbar(xs, [p.tok_s_per_node.value for p in pts], yerr=[p.tok_s_per_node.std or 0 for p in pts], fmt="o",
                color=COLORS[0], capsize=3,
                label="measured, engine-side (fitted)" if prof.client_decode_check else "measured")
    if prof.client_decode_check:
        cpts = sorted(prof.client_decode_check, key=lambda p: p.concurrency)
        ax.plot([p.concurrency for p in cpts], [p.tok_s_per_node.value for p in cpts], "s", mfc="none",
                color=COLORS[2], label="as the client saw it (check)")
    ax.plot(xs, [decode_tok_s(cal, c, contexts[c]) for c in xs], "-", color=COLORS[1],
            label="twin" + (" (each batch at its measured context)" if prof.decode_contexts else ""))
    if prof.decode_long_context and prof.decode_long_context_tokens:
        ctx = prof.decode_long_context_tokens
        lpts = sorted(prof.decode_long_context, key=lambda p: p.concurrency)
        lx = [p.concurrency for p in lpts]
        ax.plot(lx, [p.tok_s_per_node.value for p in lpts], "^", color=COLORS[3], label=f"measured, context {ctx}")
        ax.plot(lx, [decode_tok_s(cal, c, ctx) for c in lx], "--", color=COLORS[3], label=f"twin, context {ctx}")
    ax.set(xscale="log", xlabel="concurrent streams", ylabel="output tok/s (engine)", title="decode by batch")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.legend(fontsize=7)

    ax = axes[2]
    pts = sorted(prof.context_decode_check, key=lambda p: p.context_tokens)
    xs = [p.context_tokens for p in pts]
    ax.errorbar(xs, [p.tok_s_per_user.value for p in pts], yerr=[p.tok_s_per_user.std or 0 for p in pts], fmt="o",
                color=COLORS[0], capsize=3, label="measured")
    ax.plot(xs, [context_tok_s(cal, x) for x in xs], "-", color=COLORS[1], label="twin")
    ax.set(xlabel="context tokens", ylabel="tok/s (one stream)", title="decode by context (check, not fitted)")
    ax.legend(fontsize=7)

    ax = axes[3]
    s = prof.scheduler
    cells = [(1, prof.busy_stream_context_tokens or 0, p) for p in prof.busy_engine_ttft]
    cells += [(p.streams, p.stream_context_tokens, p) for p in prof.mixed_ttft]
    for i, n in enumerate(sorted({n for n, _, _ in cells})):
        pts = sorted([(ctx, p) for m, ctx, p in cells if m == n], key=lambda t: (t[1].input_tokens, t[1].hit_rate))
        c = COLORS[i % len(COLORS)]
        labels = [f"{p.input_tokens}@{p.hit_rate:.0%}" for _, p in pts]
        ax.plot(labels, [p.ttft_s.value * 1e3 for _, p in pts], "o", color=c, label=f"measured, {n} streams decoding")
        pred = [busy_ttft_s(cal.model, p.input_tokens, cached_tokens_for(p.input_tokens, p.hit_rate, s.block_tokens),
                            s.max_num_batched_tokens, n, ctx)[0] * 1e3 for ctx, p in pts]
        ax.plot(labels, pred, "_", ms=14, mew=2, color=c, label=f"twin, {n} streams")
    ax.set(xlabel="input tokens @ hit rate", ylabel="engine-side TTFT, ms", title="prefill beside decoding streams")
    if cells:
        ax.legend(fontsize=7)
    passes = f", median of {len(prof.passes)} passes" if prof.passes else ""
    fig.suptitle(f"zoe sim calibrate: {prof.model} on {prof.engine} {prof.engine_version or ''} "
                 f"({prof.measured_at[:10]}{passes})", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
