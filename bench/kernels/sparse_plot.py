"""Plots bench/kernels/results/sparse_results.json (sparse_assemble.py) into sparse_results.png.

Usage: python bench/kernels/sparse_plot.py [results.json] [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


# the indexer's first kernel (one program per block of heads), timed beside the default in the same run
PREVIOUS_KERNELS = ("zoe triton fp8 heads",)


def provider_group(provider: str) -> str:
    """Bars per group: the torch baseline, the indexer's first kernel, and the current code's best config."""
    if not provider.startswith("zoe"):
        return provider
    if provider in PREVIOUS_KERNELS:
        return "zoe, previous kernel"
    return "zoe (best config)"


def best_rows(rows, op):
    """Per (shape, provider group): the fastest correct row."""
    best = {}
    for r in rows:
        if r.get("op") != op or "median_us" not in r or r.get("correct") is False:
            continue
        key = (r["shape"], provider_group(r["provider"]))
        if key not in best or r["median_us"] < best[key]["median_us"]:
            best[key] = r
    shapes = list(dict.fromkeys(s for s, _ in best))
    order = {"zoe, previous kernel": 1, "zoe radix fallback": 2, "zoe (best config)": 3}
    providers = sorted(dict.fromkeys(p for _, p in best), key=lambda p: order.get(p, 0))  # baseline first
    return shapes, providers, best


def bar_panel(ax, rows, op, title, value="median_us", ylabel="median time (us, log)"):
    shapes, providers, best = best_rows(rows, op)
    width = 0.8 / max(1, len(providers))
    for i, prov in enumerate(providers):
        xs, ys, labels = [], [], []
        for j, shape in enumerate(shapes):
            r = best.get((shape, prov))
            if r is None:
                continue
            xs.append(j + i * width)
            ys.append(r[value])
            labels.append(f"{r['pct_roofline']:.0f}%")
        bars = ax.bar(xs, ys, width, label=prov)
        for bar, lab in zip(bars, labels):
            ax.annotate(lab, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=6)
    ax.set_xticks([j + width * (len(providers) - 1) / 2 for j in range(len(shapes))])
    ax.set_xticklabels([s.replace(" ", "\n", 2) for s in shapes], fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title + " (labels: % of roofline)", fontsize=9)
    ax.legend(fontsize=7)


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results" / "sparse_results.json"
    dst = Path(sys.argv[2]) if len(sys.argv) > 2 else src.with_suffix(".png")
    data = json.loads(src.read_text())
    rows = data["rows"]
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    bar_panel(axes[0, 0], rows, "csa_topk", "CSA top-512")
    bar_panel(axes[0, 1], rows, "csa_dual_scope_decode", "CSA dual-scope decode (H=64, D=512)")
    bar_panel(axes[1, 0], rows, "dsa_indexer", "DSA indexer logits (H=64, D=128)")
    bar_panel(axes[1, 1], rows, "dsa_indexer_topk2048", "DSA indexer top-2048 of the logits")
    meta = data["meta"]
    fig.suptitle(f"{meta.get('device')} | torch {meta.get('torch')} triton {meta.get('triton')} | "
                 f"ceilings: copy {meta.get('copy_tbps', 0):.2f} TB/s, fp8 {meta.get('fp8_tflops', 0):.0f} TFLOP/s\n"
                 f"{meta.get('command')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(dst)


if __name__ == "__main__":
    main()
