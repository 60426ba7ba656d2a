"""Assemble bench/kernels/results/moe_h200.json from the H200 runs, keeping only rows whose kernel code
path and block sizes are the ones committed now (the device time allowed few calls, and the code changed
between them).

    python bench/kernels/moe_assemble_h200.py && python bench/kernels/moe_plot.py \
        bench/kernels/results/moe_h200.json bench/kernels/results/moe_h200.png

Which run each row comes from, and why:
- run1 (code 0067fa2): bf16 zoe, every baseline (torch._grouped_mm, torch._scaled_grouped_mm rowwise, the
  fallback loop), and fp8 zoe where BLOCK_M < 64 (w8a8, block sizes unchanged since). Its 4-bit rows timed
  an older dequantization (interleave + tl.dot_scaled emulation, which gave wrong mxfp4 results on Hopper)
  and are dropped.
- run2 (code 2499c95): fp8 zoe where BLOCK_M >= 64 (w8a8 with the stage-1 BLOCK_N of 64 kept since). Its
  fp8 rows with BLOCK_M < 64 timed the w8a16 mode, which is off by default now, and are dropped (they stay
  in raw/run2_moe_results.json as the evidence for that decision); its 4-bit rows did not compile.
- run3 (code 8b79871, the committed kernel; its 65 GPU tests passed): w4a16 and mxfp4 zoe, plus the M=1
  block-size sweeps of fp8 and w4a16. ZAYA1 4-bit rows stop at M=1: the run's time budget ran out.
  Runs 1-3 timed only the tl.dot path, so their "zoe" rows become "zoe_dot" here; they are kept for M >= 512
  (run4 re-timed M <= 256).
- run4 (the GEMV path of commit 12a6225, whose stage 2 did not split the top-k slots yet, and the dot path, which
  has not changed since run3): every provider at M <= 256 side by side: zoe_gemv, zoe_dot, the PyTorch
  baselines and the fallback loop (M=1). Its GEMV rows are the committed code wherever stage 2 does not split
  slots (config.gemv_config: CHUNKS == 1), i.e. every point but M=1 of the top-k-8 shapes and mxfp4 at M=8;
  those rows carry "committed_differs" (the committed stage 2 is faster there: run5's stage sweep).
The "zoe" rows (fused_moe as dispatched) are derived from zoe_gemv / zoe_dot by `config.use_gemv`.
run5 (commit 12a6225, stage-2 sweep) and run6 (commit f950d4a, the GPU tests of the GEMV path, 12 passed)
are in raw/ only; run5 re-timed the dot path within 1-3 % of run4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
RAW = HERE / "results" / "raw"


def _block_m(row: dict) -> int:
    from zoe_kernels.moe.config import block_m_for

    return block_m_for(row["M"], row["k"] + row["shared"], row["E"] + row["shared"])


def keep(run: str, row: dict) -> bool:
    if run == "run4":
        return True
    if row["M"] <= 256:
        return False  # re-timed side by side in run4
    zoe = row["provider"] == "zoe"
    if run == "run1":
        if not zoe:
            return True
        return row["fmt"] == "bf16" or (row["fmt"] == "fp8" and _block_m(row) < 64)
    if run == "run2":
        return zoe and row["fmt"] == "fp8" and _block_m(row) >= 64
    return zoe and row["fmt"] in ("w4a16", "mxfp4")


def main() -> None:
    import moe_bench

    from zoe_kernels.moe.config import gemv_config

    rows, runs = [], []
    for run, commit in (("run1", "0067fa2"), ("run2", "2499c95"), ("run3", "8b79871"), ("run4", "12a6225")):
        data = json.loads((RAW / f"{run}_moe_results.json").read_text())
        runs.append({"run": run, "code_commit": commit, "command": data["command"], "date_utc": data["date_utc"],
                     "torch": data["torch"], "triton": data["triton"], "tests_on_gpu": data["tests"],
                     "sweep_m1": data.get("sweep_m1", []), "gemv_sweep": data.get("gemv_sweep", [])})
        for r in data["rows"]:
            if not keep(run, r) or r["provider"] == "zoe" and run == "run4":
                continue
            r = r | {"run": run}
            if r["provider"] == "zoe":
                r["provider"] = "zoe_dot"
            if r["provider"] == "zoe_gemv":
                if gemv_config(r["M"], r["H"], r["fmt"], gated=False, top_k=r["k"] + r["shared"])["CHUNKS"] > 1:
                    r["committed_differs"] = "committed stage 2 splits the top-k slots (faster: run5 sweep)"
            rows.append(r)
    rows += moe_bench.dispatched_rows(rows)
    result = {
        "device": "NVIDIA H200",
        "assembled_by": "python bench/kernels/moe_assemble_h200.py",
        "note": "run4 ran the working tree committed next as 12a6225 (same GEMV kernel; --apply-sweep put in the "
                "tiles committed there); run5/run6 are in raw/ only",
        "runs": runs,
        "ceilings": data["ceilings"],
        "shapes": data["shapes"],
        "crossover": moe_bench.crossover(rows),
        "rows": rows,
    }
    out = HERE / "results" / "moe_h200.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
