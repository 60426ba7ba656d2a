"""Plot `moe_large_m.py` results: per shape, time per MoE call against M (top) and the speedup of each format as
dispatched over the strongest PyTorch baseline for it (bottom: bf16 and the 4-bit formats against bf16
`torch._grouped_mm`, fp8 against the faster `torch._scaled_grouped_mm`; below 1 zoe is slower).

    python bench/kernels/moe_large_m_plot.py bench/kernels/results/moe_large_m_h200.json \
        bench/kernels/results/moe_large_m_h200.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_large_m import dispatched_us, path_table  # noqa: E402

COLOUR = {"bf16": "tab:blue", "fp8": "tab:orange", "w4a16": "tab:green", "mxfp4": "tab:red"}
BASELINES = {  # provider -> (label, colour, line style)
    "torch_grouped_mm": ("torch._grouped_mm bf16", "tab:blue", ":"),
    "torch_scaled_grouped_mm": ("torch._scaled_grouped_mm fp8 rowwise", "tab:orange", ":"),
    "torch_scaled_grouped_mm_fast_accum": ("same, fast accumulation", "tab:orange", "-."),
}


def plot(results: dict, out: Path) -> None:
    rows = [r for r in results["rows"] if "median_us" in r]
    zoe = dispatched_us(rows, path_table(rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(2, len(shapes), figsize=(5.5 * len(shapes), 8.5), squeeze=False)
    for col, shape in enumerate(shapes):
        top, bottom = axes[0][col], axes[1][col]
        base = {(r["provider"], r["M"]): r["median_us"] for r in rows if r["shape"] == shape}
        for fmt, colour in COLOUR.items():
            pts = sorted((m, us) for (s, f, m), us in zoe.items() if s == shape and f == fmt)
            if not pts:
                continue
            top.plot(*zip(*pts), "-", color=colour, marker="o", ms=3, label=f"zoe {fmt}")
            if fmt == "fp8":
                ref = [min(base.get(("torch_scaled_grouped_mm", m), 1e30),
                           base.get(("torch_scaled_grouped_mm_fast_accum", m), 1e30)) for m, _ in pts]
            else:
                ref = [base.get(("torch_grouped_mm", m), float("nan")) for m, _ in pts]
            bottom.plot([m for m, _ in pts], [b / us for b, (_, us) in zip(ref, pts)], "-", color=colour, marker="o",
                        ms=3, label=f"zoe {fmt}")
        for provider, (label, colour, ls) in BASELINES.items():
            pts = sorted((m, us) for (p, m), us in base.items() if p == provider)
            if pts:
                top.plot(*zip(*pts), ls, color=colour, label=label)
        floor = sorted({(r["M"], r["floor_us"]) for r in rows if r["shape"] == shape and r["fmt"] == "bf16"})
        top.plot(*zip(*floor), "--", color="grey", lw=1, label="bf16 roofline floor")
        top.set_title(shape, fontsize=10)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("M (tokens)")
        top.set_yscale("log")
        top.set_ylabel("median us per MoE call (CUDA graph)")
        bottom.set_ylabel("speedup over the PyTorch baseline")
        bottom.axhline(1.0, color="black", lw=0.8)
    axes[0][0].legend(fontsize=7, loc="upper left")
    axes[1][0].legend(fontsize=7, loc="upper right")
    c = results["ceilings"]
    fig.suptitle(f"Fused MoE on {results['device']}: ceilings measured in the run: "
                 f"read {c['read_Bps'] / 1e12:.2f} TB/s, "
                 f"bf16 {c['bf16_flops'] / 1e12:.0f} TFLOP/s, fp8 {c['fp8_flops_fast_accum'] / 1e12:.0f} TFLOP/s",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
