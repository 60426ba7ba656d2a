"""Plot fused-MoE results: time per call and percent of roofline against M, one column per model shape.
"zoe" is fused_moe as dispatched (GEMV path or tl.dot path by tokens per expert); dashed: the tl.dot path alone.

    python bench/kernels/moe_plot.py bench/kernels/results/moe_h200.json bench/kernels/results/moe_h200.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {  # (format, provider) -> (label, colour, line style)
    ("bf16", "zoe"): ("zoe bf16", "tab:blue", "-"),
    ("fp8", "zoe"): ("zoe fp8", "tab:orange", "-"),
    ("w4a16", "zoe"): ("zoe w4a16", "tab:green", "-"),
    ("mxfp4", "zoe"): ("zoe mxfp4", "tab:red", "-"),
    ("w4a16", "zoe_dot"): ("zoe w4a16, tl.dot path only", "tab:green", "--"),
    ("mxfp4", "zoe_dot"): ("zoe mxfp4, tl.dot path only", "tab:red", "--"),
    ("bf16", "torch_grouped_mm"): ("torch._grouped_mm bf16", "tab:blue", ":"),
    ("fp8", "torch_scaled_grouped_mm_rowwise"): ("torch._scaled_grouped_mm fp8 rowwise", "tab:orange", ":"),
}


def plot(results: dict, out: Path) -> None:
    rows = [r for r in results["rows"] if "median_us" in r]
    shapes = list(results["shapes"])
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 8), squeeze=False)
    for col, shape in enumerate(shapes):
        top, bottom = axes[0][col], axes[1][col]
        for (fmt, provider), (label, colour, ls) in STYLE.items():
            pts = sorted((r["M"], r["median_us"], r["pct_roofline"]) for r in rows
                         if r["shape"] == shape and r["fmt"] == fmt and r["provider"] == provider)
            if not pts:
                continue
            ms, us, pct = zip(*pts)
            top.plot(ms, us, ls, color=colour, marker="o", ms=3, label=label)
            bottom.plot(ms, pct, ls, color=colour, marker="o", ms=3, label=label)
        floor = sorted({(r["M"], r["floor_us"]) for r in rows if r["shape"] == shape and r["fmt"] == "fp8"})
        if floor:
            top.plot(*zip(*floor), "--", color="grey", lw=1, label="fp8 roofline floor")
        sh = results["shapes"][shape]
        top.set_title(f"{shape}\nH={sh['H']} I={sh['I']} E={sh['E']}+{sh['shared']} k={sh['k']}", fontsize=9)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("M (tokens)")
        top.set_yscale("log")
        top.set_ylabel("median us per MoE call")
        bottom.set_ylabel("% of roofline (4.19 TB/s read, 684/1265 TFLOP/s)")
        bottom.axhline(100, color="grey", lw=0.8)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Fused MoE on {results['device']} (CUDA graphs, median)", fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
