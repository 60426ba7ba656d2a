"""Plots bench/kernels/results/sparse_decode_h200.json (sparse_bench.py --sections decode,limits) into a PNG:
time per call against batch beside the torch paths and the byte floor; where the B=64 call's time goes; time
against tiles (64 entries each; 32 from B=67, the two-warpgroup programs) at one split per sequence, with the
fitted lines.

Usage: python bench/kernels/sparse_decode_plot.py [results.json] [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def _batch(shape: str) -> int:
    return int(shape.split()[0].split("=")[1])


def tile_fits(rows, run: str) -> dict[int, dict]:
    """Per batch of the tile sweep: tiles, call and one-pass-alone times, and the lines' (slope, intercept)."""
    fits = {}
    sweep = [r for r in rows if r.get("run") == run and r.get("provider") == "zoe, one split a sequence"]
    for b in sorted({_batch(r["shape"]) for r in sweep}):
        rr = [r for r in sweep if _batch(r["shape"]) == b]
        tiles = np.array([json.loads(r["config"])["tiles"] for r in rr])
        call = np.array([r["median_us"] for r in rr])
        alone = np.array([r["fused_alone_us"] for r in rr])
        fits[b] = {"tiles": tiles, "call": call, "alone": alone, "call_fit": np.polyfit(tiles, call, 1),
                   "alone_fit": np.polyfit(tiles, alone, 1)}
    return fits


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "sparse_decode_h200.json"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    data = json.loads(src.read_text())
    rows = data["rows"]
    run = data["meta"].get("decode_run", "decode-a")  # the sparse_bench.py --sections decode,limits run plotted
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))

    ax = axes[0]
    dec = [r for r in rows if r.get("run") == run and r.get("op") == "csa_dual_scope_decode"]
    batches = sorted({_batch(r["shape"]) for r in dec})
    for i, (provider, style) in enumerate((("torch gather+SDPA", "s:"), ("torch gather+bmm", "o--"),
                                           ("zoe default", "o-"))):
        by_b = {_batch(r["shape"]): r for r in dec if r["provider"] == provider}
        ax.plot(batches, [by_b[b]["median_us"] for b in batches], style, color=f"C{i}",
                label=f"{provider}, back to back")
        ax.plot(batches, [by_b[b]["isolated_us"] for b in batches], style, color=f"C{i}", alpha=0.4,
                label=f"{provider}, isolated (clean L2)")
    floor = {_batch(r["shape"]): r["floor_us"] for r in dec if r["provider"] == "zoe default"}
    ax.plot(batches, [floor[b] for b in batches], "k-", lw=0.8, label="byte floor (copy bandwidth)")
    ax.plot(batches, [floor[b] / 0.75 for b in batches], "k:", lw=0.8, label="75% of the byte floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("us per call (log)")
    ax.set_title("dual-scope decode, H=64 D=512, 128 window + 512 selected", fontsize=9)
    ax.legend(fontsize=6)

    ax = axes[1]
    lim = {r["provider"] + (r.get("config", "") if "variant" in r["provider"] else ""): r
           for r in rows if r.get("run") == run and r.get("op") == "decode_limits"}
    per_launch = lim["zoe default, per launch"]
    gather = lim["gather of the call's rows"]
    b64 = next(r for r in dec if r["provider"] == "zoe default" and _batch(r["shape"]) == 64)
    fits = tile_fits(rows, run)[64]
    loader = next((r for r in rows if r.get("run") == run and r.get("provider") == "loader warps alone"
                   and r["shape"].startswith("B=64 ") and json.loads(r["config"]) == {"key_slots": 2, "value_slots": 2}),
                  None)
    slope, intercept = fits["alone_fit"]
    bars = [("byte floor", b64["floor_us"]), ("75% target", b64["floor_us"] / 0.75),
            ("gather of the\ncall's rows", gather["median_us"])]
    if loader:
        bars.append(("loader warps\nalone", loader["median_us"]))
    bars += [("zoe call", b64["median_us"]), ("zoe call\nisolated", b64["isolated_us"]),
             ("one-pass\nkernel alone", per_launch["fused_alone_us"]), ("q split\nalone", per_launch["split_alone_us"]),
             ("10 tiles\n(slope x 10)", 10 * slope), ("outside the\nloop (intercept)", intercept)]
    ax.bar(range(len(bars)), [v for _, v in bars], color=["k", "0.6"] + ["C0"] * (len(bars) - 2))
    for i, (_, v) in enumerate(bars):
        ax.annotate(f"{v:.1f}", (i, v), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([n for n, _ in bars], fontsize=6)
    ax.set_ylabel("us")
    ax.set_title("B=64: where the time goes", fontsize=9)

    ax = axes[2]
    for i, (b, f) in enumerate(sorted(tile_fits(rows, run).items())):
        xs = np.array([0, f["tiles"].max()])
        ax.plot(f["tiles"], f["call"], "o", color=f"C{i}", label=f"B={b} call")
        ax.plot(xs, np.polyval(f["call_fit"], xs), "-", color=f"C{i}", lw=0.8)
        ax.plot(f["tiles"], f["alone"], "x", color=f"C{i}",
                label=f"B={b} one-pass kernel alone: {f['alone_fit'][0]:.2f} us/tile + {f['alone_fit'][1]:.1f}")
        ax.plot(xs, np.polyval(f["alone_fit"], xs), "--", color=f"C{i}", lw=0.8)
    ax.set_xlabel("tiles per program, one split per sequence (64 entries; 32 at B=128)")
    ax.set_ylabel("us per call")
    ax.set_title("time against tiles: about 2 us a tile at every batch and either tile size", fontsize=9)
    ax.legend(fontsize=6)

    meta = data["meta"]
    fig.suptitle(f"{meta.get('device')} | torch {meta.get('torch')} triton {meta.get('triton')} | copy "
                 f"{meta.get('copy_tbps', 0):.2f} TB/s | {meta.get('command')}", fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(dst)


if __name__ == "__main__":
    main()
