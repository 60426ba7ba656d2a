"""MI355X roofline lower bounds for zoe's kernels at the recipe shapes, from the AOT report.

For each call of `zoe_kernels.aot_cases` (and the seed's measured shapes) it counts the bytes the call must move
through HBM and the FLOPs it must do, and takes the time at the seed's Table 1 MI355X measurements: 6,068.8 GB/s
(the C++ copy kernel; 6,271.2 read-only), 2,363.1 TFLOP/s BF16, 4,936.2 FP8 and 9,830.2 FP4 MFMA peaks. The
FLOPs are timed at the rate of the MFMA the gfx950 compile uses (bench/kernels/amd_aot.json: f8f6f4 -> FP8,
otherwise BF16; no MFMA -> bytes only). The bound is max(bytes / bandwidth, FLOPs / rate): no kernel can be
faster, and one whose programs hold few waves per SIMD (`min_waves_per_simd`, from the same report) may not reach
it, since HBM latency is then hidden by little more than the loads in flight. Beside each estimate, the seed's
MI355X measurement where it has one (tables A2-A3; table A1 gives speedups over baselines, not times).

Usage: python bench/kernels/amd_estimate.py [--report bench/kernels/amd_aot.json] [--out bench/kernels/amd_estimate.json]
       [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# seed Table 1 (MI355X, one GPU, measured)
HBM_BPS = 6068.8e9
PEAK_FLOPS = {"bf16": 2363.1e12, "fp8": 4936.2e12, "fp4": 9830.2e12}
# bytes per weight with its scales (fp8: one fp32 per 128x128 block; w4a16: fp32 per 128; mxfp4: e8m0 per 32)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0 + 4 / (128 * 128), "w4a16": 0.5 + 4 / 128, "mxfp4": 0.5 + 1 / 32}
# seed table A2: lightning indexer TFLOP/s on MI355X (causal, "ours"), {H: {(M, N): TFLOP/s}}
SEED_INDEXER_TFLOPS = {
    32: {(4096, 4096): 852, (8192, 8192): 1142, (16384, 16384): 1040, (32768, 32768): 1019, (65536, 65536): 1026,
         (2048, 16384): 921, (2048, 32768): 551, (2048, 65536): 630, (4096, 65536): 1006},
    64: {(4096, 4096): 1411, (8192, 8192): 1531, (16384, 16384): 1588, (32768, 32768): 1613, (65536, 65536): 1562,
         (2048, 16384): 1437, (2048, 32768): 898, (2048, 65536): 1045, (4096, 65536): 1176},
}
# seed table A3: top-K kernel time for one request by context (us), and dual-scope decode per call by batch (us)
SEED_TOPK_US = {4096: 11.2, 65536: 30.5, 262144: 43.1, 1048576: 67.2}
SEED_DUAL_SCOPE_US = {1: 17.6, 2: 20.8, 4: 24.5, 8: 30.6, 16: 40.2, 32: 54.6}


def moe_cost(s: dict) -> tuple[float, float, str]:
    """(bytes, FLOPs, matrix format): the routed experts' weights that M tokens touch under uniform routing
    (E (1 - (1 - k/E)^M) experts), the bf16 activations in and out, the intermediate written and read. mxfp4 runs at
    the fp8 rate: gfx950 multiplies its e2m1 weights by MXFP8 (e4m3) activations in the scaled f8f6f4 MFMA."""
    m, h, i, e, k, fmt = s["M"], s["H"], s["I"], s["E"], s["k"], s["fmt"]
    active = e * (1 - (1 - min(1.0, k / e)) ** m)
    weights = active * 3 * h * i * WEIGHT_BYTES[fmt]
    acts = m * h * 2 * 2 + m * k * i * 2 * 2
    return weights + acts, 2.0 * m * k * 3 * h * i, "fp8" if fmt in ("fp8", "mxfp4") else "bf16"


def _valid_pairs(m: int, n: int) -> float:
    """Causal (query, key) pairs of M query rows that end N keys (a prefill chunk after N - M cached keys)."""
    return m * (n - m) + m * (m + 1) / 2 if m <= n else n * (n + 1) / 2


def indexer_cost(s: dict) -> tuple[float, float, str]:
    """fp8 q [M, H, D] and k [N, D] read once, the float32 logits [M, N] written; 2 H D FLOPs per valid pair."""
    m, n, h, d = s["M"], s["N"], s["H"], s["D"]
    pairs = m * n if m <= 64 else _valid_pairs(m, n)  # decode rows see the whole context
    return m * h * d + n * (d + 4) + m * h * 4 + m * n * 4.0, 2.0 * h * d * pairs, "fp8"


def topk_cost(s: dict) -> tuple[float, float, str]:
    """The float32 scores read once and the int32 indices written; no matrix work."""
    return s["B"] * (s["N"] * 4.0 + s["k"] * 4), 0.0, ""


def dual_scope_cost(s: dict) -> tuple[float, float, str]:
    """Per sequence the W + k entries' fp8 keys (with a float32 scale) and bf16 values, the k indices, q and the
    output; 2 D FLOPs per head and entry for the scores and as many for the values."""
    b, h, d, entries = s["B"], s["H"], s["D"], s["W"] + s["k"]
    return b * entries * (d + 4 + 2 * d) + b * s["k"] * 4 + b * h * d * 4.0, 4.0 * b * h * entries * d, "bf16"


COSTS = {"moe": moe_cost, "indexer": indexer_cost, "topk": topk_cost, "dual_scope": dual_scope_cost,
         "paged_dual_scope": dual_scope_cost}


def seed_measured(s: dict) -> str:
    """The seed's MI355X figure for this shape, in words, or ''. Top-K: the seed's context column read as the
    entries per row (as bench/kernels/sparse_bench.py labels B=1 x 1M); dual-scope: its batch column at H=64, D=512,
    W=128, k=512 (sparse_bench's decode shape; the seed does not give its heads)."""
    if s["op"] == "indexer" and (s["M"], s["N"]) in SEED_INDEXER_TFLOPS.get(s["H"], {}):
        return f"{SEED_INDEXER_TFLOPS[s['H']][(s['M'], s['N'])]} TFLOP/s (A2)"
    if s["op"] == "topk" and s.get("seed") and s["N"] in SEED_TOPK_US:
        return f"{SEED_TOPK_US[s['N']]} us (A3, context {s['N']})"
    if s["op"] == "dual_scope" and s["H"] == 64 and s["B"] in SEED_DUAL_SCOPE_US:
        return f"{SEED_DUAL_SCOPE_US[s['B']]} us (A3)"
    return ""


def estimate(name: str, shape: dict, rows: list[dict]) -> dict:
    """One call's bound on gfx950, with the compiled kernels' MFMAs and the fewest waves per SIMD among them."""
    nbytes, flops, fmt = COSTS[shape["op"]](shape)
    used = [r for r in rows if r["arch"] == "gfx950" and r.get("ok") and name in r.get("cases", [])]
    mfma = sorted({m for r in used for m in r.get("mfma", [])})
    if used and fmt == "fp8" and not (mfma and all("f8f6f4" in m for m in mfma)):
        fmt = "bf16"  # timed at the rate of the instructions the compile chose (seed shapes: the family's format)
    t_mem = nbytes / HBM_BPS
    t_flop = flops / PEAK_FLOPS[fmt] if flops else 0.0
    return {"case": name, "shape": shape, "bytes": round(nbytes), "flops": flops, "rate": fmt or None,
            "t_mem_us": round(t_mem * 1e6, 2), "t_compute_us": round(t_flop * 1e6, 2),
            "t_lower_bound_us": round(max(t_mem, t_flop) * 1e6, 2),
            "bound": "memory" if t_mem >= t_flop else "compute",
            "tflops_at_bound": round(flops / max(t_mem, t_flop) / 1e12, 1) if flops else None,
            "min_waves_per_simd": min((r["waves_per_simd"] for r in used), default=None),
            "kernels": sorted({r["kernel"] for r in used}), "mfma": mfma, "seed_mi355x": seed_measured(shape)}


def seed_shapes() -> list[tuple[str, dict]]:
    """The seed's measured shapes that the recipe cases lack (table A2's indexer shapes, A3's top-K contexts)."""
    extra = []
    for h, shapes in SEED_INDEXER_TFLOPS.items():
        for m, n in shapes:
            extra.append((f"seed indexer H={h} M={m} N={n}", dict(op="indexer", M=m, N=n, H=h, D=128, k=2048)))
    for n in SEED_TOPK_US:
        extra.append((f"seed topk B=1 N={n}", dict(op="topk", B=1, N=n, k=512, seed=True)))
    return extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", default=str(HERE / "amd_aot.json"))
    ap.add_argument("--out", default=str(HERE / "amd_estimate.json"))
    ap.add_argument("--markdown", action="store_true", help="print the docs/kernels.md table")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parents[1]))
    from zoe_kernels.aot_cases import all_cases
    from zoe_kernels.platform import TARGETS

    rows = json.loads(Path(args.report).read_text())["rows"]
    cases = [(c.name, c.shape) for c in all_cases(TARGETS["gfx950"])] + seed_shapes()
    out = [estimate(name, shape, rows) for name, shape in cases]
    meta = {"hbm_Bps": HBM_BPS, "peak_flops": PEAK_FLOPS, "source": "seed Table 1 (MI355X measured)",
            "report": str(Path(args.report).name), "command": "python bench/kernels/amd_estimate.py"}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": out}, indent=1) + "\n")
    if args.markdown:
        print(aot_markdown(rows))
        print()
        print(markdown(out))


# the rows the docs table shows: each family at its decode and prefill points, and every seed-measured shape
DOC_CASES = ("moe deepseek-v3.2 fp8 full M=1", "moe deepseek-v3.2 fp8 full M=256", "moe deepseek-v3.2 fp8 full M=4096",
             "moe glm-5.3 mxfp4 full M=1", "moe glm-5.3 mxfp4 full M=4096", "moe kimi-k2.6 w4a16 full M=1",
             "moe kimi-k2.6 w4a16 full M=4096", "moe zaya1 fp8 full M=1", "indexer deepseek-v3.2 H=64 M=1 N=65536",
             "indexer glm-5.3 H=32 M=32 N=65536", "dual_scope deepseek-v4-pro B=128 H=64",
             "paged_dual_scope deepseek-v4-pro B=1 H=64", "paged_dual_scope deepseek-v4-pro B=32 H=64")


def aot_markdown(rows: list[dict]) -> str:
    """The compile report per kernel and arch: configurations, how many compiled, the largest register, scratch
    and LDS use, the fewest waves per SIMD and the MFMAs."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["arch"]), []).append(r)
    lines = ["| kernel | arch | configs | ok | max VGPR+AGPR | max scratch (B) decode / all | max LDS (B) | min waves/SIMD "
             "| MFMA |", "|---|---|---|---|---|---|---|---|---|"]
    for (kernel, arch), rs in sorted(groups.items()):
        if rs[0]["ok"] is None:
            lines.append(f"| {kernel} | {arch} | - | n/a (Gluon, sm_90 only) | | | | | |")
            continue
        ok = [r for r in rs if r["ok"]]
        dec = [r["spill_bytes"] for r in ok if r["decode"]]
        mfma = sorted({m.removeprefix("v_mfma_") for r in ok for m in r["mfma"]})
        lines.append(f"| {kernel} | {arch} | {len(rs)} | {len(ok)} | {max(r['total_vgprs'] for r in ok)} | "
                     f"{max(dec) if dec else '-'} / {max(r['spill_bytes'] for r in ok)} | "
                     f"{max(r['lds_bytes'] for r in ok)} | {min(r['waves_per_simd'] for r in ok)} | "
                     f"{', '.join(mfma) or 'none'} |")
    return "\n".join(lines)


def markdown(out: list[dict]) -> str:
    lines = ["| call | bytes | GFLOP | bound | lower bound (us) | at bound | min waves/SIMD | seed MI355X |",
             "|---|---|---|---|---|---|---|---|"]
    for r in out:
        keep = r["case"] in DOC_CASES or r["seed_mi355x"]
        if not keep:
            continue
        at = f"{r['tflops_at_bound']} TFLOP/s" if r["tflops_at_bound"] else ""
        lines.append(f"| {r['case']} | {r['bytes'] / 1e6:.2f} MB | {r['flops'] / 1e9:.1f} | {r['bound']} "
                     f"({r['rate'] or 'bytes'}) | {r['t_lower_bound_us']} | {at} | {r['min_waves_per_simd']} | "
                     f"{r['seed_mi355x']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
