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
- run9 (code 0354143 with the tiles its sweep applied, committed next in config.GEMV_4BIT_TILES): the word-wise
  4-bit GEMV (`gemv_4bit.py`), zoe_gemv for w4a16 and mxfp4 at M 1..64 on DeepSeek-V3.2, GLM-5 and the TP8
  slice, and fp8 zoe_dot at M=1 on those shapes (same code as run4; kept as the same-run reference of the
  issue's 4-bit target). These rows replace run4's. run4's other 4-bit zoe_gemv rows (Kimi-K2, ZAYA1, and
  M=256, where dispatch takes the dot path) timed the byte-wise kernel that word-aligned rows no longer take:
  they carry "committed_differs".
The "zoe" rows (fused_moe as dispatched) are derived from zoe_gemv / zoe_dot by `config.use_gemv`.
- run11 (bench/kernels/moe_fp8_m1_sweep.py --steps candidates, the code of 95510dd with whole M=1 tile sets):
  fp8 zoe_dot at M=1 on DeepSeek-V3.2, GLM-5 and the TP8 slice with the committed `config.DOT_M1_TILES`
  (replacing run4's and run9's fp8 M=1 rows). run10 (its stage breakdown, in-kernel quantization sweep, and
  M 1..256 side by side) is in raw/ only.
- run13 (bench/kernels/moe_4bit_dot_sweep.py): the 4-bit tl.dot path as committed after it (see main()); run12
  (an earlier tree of the same work, slower) is in raw/ only.
- run15, run16 (the same script): every shape's 4-bit rows at M 1..256 as dispatched against torch._grouped_mm,
  and mxfp4's swapped 16-row tiles (see main()).
- run25-m1 (session 6) and run34-m1 (session 7, bench/kernels/moe_gemv4_sweep.py): the word-wise GEMV's 4-bit rows
  at M 1..16 and fp8 at M=1 beside them (see main()).
run5 (commit 12a6225, stage-2 sweep), run6 (commit f950d4a, the GPU tests of the GEMV path, 12 passed), run7
(the byte-wise GEMV end to end) and run8 (the first word-wise sweep) are in raw/ only; run5 re-timed the dot
path within 1-3 % of run4.
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
    if run == "run9":
        return True
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


def _take_gemv_run(rows: list, runs: list, stem: str, run: str, commit: str) -> list:
    """The rows of raw/STEM.json (a moe_gemv4_sweep or moe_bench output) in place of the rows with the same shape, M,
    format and provider; the run's command and versions go into `runs`."""
    data = json.loads((RAW / f"{stem}.json").read_text())
    runs.append({"run": run, "code_commit": commit, "file": f"raw/{stem}.json",
                 **{k: data[k] for k in ("command", "date_utc", "torch", "triton")}})
    for r in data["rows"]:
        if r["provider"] == "zoe" or "median_us" not in r:
            continue
        key = (r["shape"], r["M"], r["fmt"], r["provider"])
        rows = [x for x in rows if (x["shape"], x["M"], x["fmt"], x["provider"]) != key]
        rows.append(r | {"run": run})
    return rows


def _mark_older_gemv(rows: list, current: tuple, why: str) -> None:
    """4-bit GEMV rows not from the `current` runs timed an older kernel: they carry committed_differs (the first
    reason kept)."""
    for r in rows:
        if r["fmt"] in ("w4a16", "mxfp4") and r["provider"] == "zoe_gemv" and r["run"] not in current:
            r.setdefault("committed_differs", why)


def main() -> None:
    import moe_bench

    from zoe_kernels.moe.config import gemv_config

    rows, runs = [], []
    sources = (("run1", "0067fa2", "moe_results"), ("run2", "2499c95", "moe_results"),
               ("run3", "8b79871", "moe_results"), ("run4", "12a6225", "moe_results"),
               ("run9", "0354143", "gemv4_sweep"))
    run9_keys = set()
    for run, commit, stem in sources:
        data = json.loads((RAW / f"{run}_{stem}.json").read_text())
        if stem == "moe_results":
            ceilings, shapes = data["ceilings"], data["shapes"]
        runs.append({"run": run, "code_commit": commit, "command": data["command"], "date_utc": data["date_utc"],
                     "torch": data["torch"], "triton": data["triton"], "tests_on_gpu": data.get("tests"),
                     "sweep_m1": data.get("sweep_m1", []), "gemv_sweep": data.get("gemv_sweep", []),
                     **({"gemv4_tiles_used": data["tiles_used"], "gemv4_stage_timings": data["stage_timings"]}
                        if run == "run9" else {})})
        if run == "run9":
            run9_keys = {(r["shape"], r["M"], r["fmt"], r["provider"]) for r in data["rows"]}
            rows = [r for r in rows if (r["shape"], r["M"], r["fmt"], r["provider"]) not in run9_keys]
        for r in data["rows"]:
            if not keep(run, r) or r["provider"] == "zoe" and run == "run4":
                continue
            r = r | {"run": run}
            if r["provider"] == "zoe":
                r["provider"] = "zoe_dot"
            if r["provider"] == "zoe_gemv" and run == "run4":
                if r["fmt"] in ("w4a16", "mxfp4"):
                    r["committed_differs"] = "byte-wise 4-bit GEMV; the committed word-wise kernel is faster (run9)"
                elif gemv_config(r["M"], r["H"], r["fmt"], gated=False, top_k=r["k"] + r["shared"])["CHUNKS"] > 1:
                    r["committed_differs"] = "committed stage 2 splits the top-k slots (faster: run5 sweep)"
            rows.append(r)
    # run11 (bench/kernels/moe_fp8_m1_sweep.py --steps candidates): fp8 at M=1 with the committed M=1 mode of the
    # tl.dot path (`config.DOT_M1_TILES`); these rows replace the earlier fp8 zoe_dot rows at M=1.
    from zoe_kernels.moe.config import DOT_M1_TILES, use_gemv

    data = json.loads((RAW / "run11_fp8_m1_sweep.json").read_text())
    runs.append({"run": "run11", "code_commit": "95510dd + the M=1 candidate tiles of the script", "command":
                 data["command"], "date_utc": data["date_utc"], "torch": data["torch"], "triton": data["triton"],
                 "best_candidate": data["best_candidate"]})
    committed = {str(k): list(v) for k, v in DOT_M1_TILES["fp8"].items()}
    for r in data["rows"]:
        if r.get("tiles") != committed:
            continue
        shape = moe_bench.SHAPES[r["shape"]]
        new = {"shape": r["shape"], **{k: shape[k] for k in ("H", "I", "E", "k", "shared")}, "M": 1, "fmt": "fp8",
               "provider": "zoe_dot", "unique_experts": r["unique_experts"], "bytes": r["bytes"],
               "flops": moe_bench.roofline_us(shape, "fp8", 1, r["unique_experts"])[2], "floor_us": r["floor_us"],
               "device": r["device"], "median_us": r["median_us"], "pct_roofline": r["pct_roofline"], "run": "run11"}
        rows = [x for x in rows if (x["shape"], x["M"], x["fmt"], x["provider"]) != (new["shape"], 1, "fp8", "zoe_dot")]
        rows.append(new)
    # run13 (bench/kernels/moe_4bit_dot_sweep.py, the 4-bit tl.dot path with the int4 decode, the activation split
    # and the int4 scale prefetch, its grouped_gemm.py identical to the committed one): w4a16 and mxfp4 zoe_dot and
    # zoe_gemv on DeepSeek-V3.2 at M 1..256 and at M=1 on GLM-5 and the TP8 slice, fp8 zoe_dot at M=1 (the
    # same-run reference of the 4-bit target) and torch._grouped_mm at M 8..256; they replace the earlier rows.
    # zoe_dot at M=1 is the committed M=1 mode (tile set "fp8set") for w4a16; mxfp4 at M=1 keeps the GEMV, whose
    # align-based dot tiles run13 did not time (its M=1-mode rows stay in raw/ only).
    data = json.loads((RAW / "run13_4bit_dot_sweep.json").read_text())
    runs.append({"run": "run13", "code_commit": "cdf4d0c (grouped_gemm.py as run13 ran it, docstrings aside)",
                 **{k: data["meta"][k] for k in ("command", "date_utc", "torch", "triton")}})
    for r in data["rows"]:
        v, m, fmt = r["variant"], r["M"], r["fmt"]
        if r.get("rep", 0) != 0:
            continue
        if v == "gemv":
            provider = "zoe_gemv"
        elif v == "torch_grouped_mm":
            provider = "torch_grouped_mm"
        elif (v == "dot" and m > 1) or (v == "dot_m1" and fmt == "fp8") or (v == "dot_m1:fp8set" and fmt == "w4a16"):
            provider = "zoe_dot"
        else:
            continue
        shape = moe_bench.SHAPES[r["shape"]]
        nbytes = r["floor_us"] * 1e-6 * moe_bench.READ_BW  # memory-bound floors at these M
        unique = (nbytes - m * shape["H"] * 4) / moe_bench.bytes_per_expert(shape, fmt)
        new = {"shape": r["shape"], **{k: shape[k] for k in ("H", "I", "E", "k", "shared")}, "M": m, "fmt": fmt,
               "provider": provider, "unique_experts": round(unique, 2), "bytes": nbytes,
               "flops": moe_bench.roofline_us(shape, fmt, m, unique)[2], "floor_us": r["floor_us"],
               "device": r["device"], "median_us": r["median_us"], "pct_roofline": r["pct_roofline"], "run": "run13"}
        rows = [x for x in rows if (x["shape"], x["M"], x["fmt"], x["provider"]) != (r["shape"], m, fmt, provider)]
        rows.append(new)
    for r in rows:  # 4-bit dot rows of runs 1-4 timed the decode that run13's replaced (2-4x slower at M 8..256)
        if r["fmt"] in ("w4a16", "mxfp4") and r["provider"] == "zoe_dot" and r["run"] != "run13":
            r["committed_differs"] = "4-bit tl.dot path before run13 (byte loads, no pipelining): committed is faster"
    # run15 / run16 (bench/kernels/moe_4bit_dot_sweep.py, this file's tree but for the swapped variants since
    # removed): the 4-bit rows of GLM-5, the TP8 slice, Kimi-K2 and ZAYA1 at M 1..256 as fused_moe dispatches them
    # ("dispatched": zoe_gemv or zoe_dot by `config.use_gemv`) beside torch._grouped_mm, DeepSeek-V3.2 at M=1 (and
    # fp8's M=1 mode, the same-run reference), M 8..16 (run15) and M 64..512 (run16). mxfp4 zoe_dot on 16-row
    # tiles is the committed swapped form (`config.SWAP_AB_TILES16`) only in run16's "swapped" variants; run15's
    # unswapped mxfp4 dot rows (M 8, 16 on DeepSeek-V3.2, where dispatch takes the GEMV) carry committed_differs.
    for run in ("run15", "run16"):
        data = json.loads((RAW / f"{run}_4bit_dot_sweep.json").read_text())
        runs.append({"run": run, "code_commit": "739e34d (the tree run15/run16 ran, swapped variants included)",
                     **{k: data["meta"][k] for k in ("command", "date_utc", "torch", "triton")}})
        for r in data["rows"]:
            v, m, fmt, shape_name = r["variant"], r["M"], r["fmt"], r["shape"]
            if r.get("rep", 0) != 0:
                continue
            shape = moe_bench.SHAPES[shape_name]
            differs = None
            if v == "gemv":
                provider = "zoe_gemv"
            elif v == "torch_grouped_mm":
                provider = "torch_grouped_mm"
            elif (v == "dot_m1" and fmt == "fp8") or (v == "dot_m1:fp8set" and fmt == "w4a16"):
                provider = "zoe_dot"
            elif v == "dot" and m > 1:
                if fmt == "mxfp4" and run == "run16":
                    continue  # run16 timed the committed (swapped) form beside it
                provider = "zoe_dot"
                if fmt == "mxfp4":
                    differs = "mxfp4 unswapped; the committed 16-row tiles swap the operands (faster at M >= 64, run16)"
            elif v == "dot/swapped" and m > 1:
                if fmt != "mxfp4" or run != "run16":
                    continue  # w4a16 swapped (slower), run15's mxfp4 swapped (the decode before the scale words)
                provider = "zoe_dot"
            elif v in ("dispatched", "dispatched/swapped"):
                takes_dot = not use_gemv(m, shape["k"] + shape["shared"], shape["E"] + shape["shared"], fmt, shape["I"])
                if v == "dispatched/swapped" and fmt != "mxfp4":
                    continue
                if v == "dispatched" and fmt == "mxfp4" and takes_dot:
                    if run == "run16":
                        continue
                    differs = "mxfp4 unswapped; the committed 16-row tiles swap the operands (faster, run16)"
                provider = "zoe_dot" if takes_dot else "zoe_gemv"
            else:
                continue
            nbytes = r["floor_us"] * 1e-6 * moe_bench.READ_BW
            unique = (nbytes - m * shape["H"] * 4) / moe_bench.bytes_per_expert(shape, fmt)
            new = {"shape": shape_name, **{k: shape[k] for k in ("H", "I", "E", "k", "shared")}, "M": m, "fmt": fmt,
                   "provider": provider, "unique_experts": round(unique, 2), "bytes": nbytes,
                   "flops": moe_bench.roofline_us(shape, fmt, m, unique)[2], "floor_us": r["floor_us"],
                   "device": r["device"], "median_us": r["median_us"], "pct_roofline": r["pct_roofline"], "run": run}
            if differs:
                new["committed_differs"] = differs
            rows = [x for x in rows if (x["shape"], x["M"], x["fmt"], x["provider"]) != (shape_name, m, fmt, provider)]
            rows.append(new)
    # run25-m1 (session 6, the committed word-wise GEMV after its load-layout change, PDL and chunk rules:
    # bench/kernels/moe_gemv4_sweep.py with the committed w4a16 tiles, and moe_bench.py --ms 1 --formats fp8,mxfp4):
    # w4a16 zoe_gemv at M 1, 8, 16 and zoe_dot (align-based tiles; w4a16 left the M=1 mode) and fp8 zoe_dot at M=1 on
    # DeepSeek-V3.2, GLM-5, the TP8 slice (and w4a16 on Kimi-K2); fp8 zoe_gemv / zoe_dot and mxfp4 zoe_gemv / zoe_dot
    # at M=1 on those four shapes. They replace the earlier rows; the 4-bit GEMV rows of earlier runs timed the kernel
    # before the layout change and carry committed_differs.
    for stem in ("run25-m1_gemv4_sweep", "run25-m1_fp8_mxfp4_m1"):
        rows = _take_gemv_run(rows, runs, stem, "run25-m1", "13fab96")
    _mark_older_gemv(rows, ("run25-m1",), "word-wise GEMV before run21-m1's load layout (the committed kernel is "
                     "faster: w4a16 M=1 DeepSeek-V3.2 66.8 against 101.3 us)")
    # run34-m1 (session 7, fa676ad: the word-wise GEMV with packed-half products, per-shape tile lists and the
    # bytewise e2m1 decode; bench/kernels/moe_gemv4_sweep.py --keep-tiles): w4a16 and mxfp4 zoe_gemv at M 1, 8, 16,
    # w4a16 zoe_dot and fp8 zoe_dot at M=1, on DeepSeek-V3.2, GLM-5, Kimi-K2 and the TP8 slice. They replace the
    # earlier rows; the other 4-bit GEMV rows (ZAYA1, M 64..256) timed the kernel before it.
    rows = _take_gemv_run(rows, runs, "run34-m1_bench", "run34-m1", "fa676ad")
    # ZAYA1 (runs 35 and 37-m1): w4a16 at M 1, 8, 16 and mxfp4 at M 8, 16 as committed (run35-m1); mxfp4 at M=1 with
    # the one-edge tiles committed in caf6420 (run37-m1, --bench-tiles), fp8 at M=1 from that run.
    rows = _take_gemv_run(rows, runs, "run35-m1_zaya1_bench", "run35-m1", "fa676ad + fp8 at every bench shape")
    rows = _take_gemv_run(rows, runs, "run37-m1_zaya1_one_edge_tiles", "run37-m1", "caf6420's tiles via --bench-tiles")
    _mark_older_gemv(rows, ("run34-m1", "run35-m1", "run37-m1"), "word-wise GEMV before run34-m1's packed-half "
                     "products (the committed kernel is faster: mxfp4 M=1 DeepSeek-V3.2 58.9 against 80.8 us)")
    rows += moe_bench.dispatched_rows(rows)
    result = {
        "device": "NVIDIA H200",
        "assembled_by": "python bench/kernels/moe_assemble_h200.py",
        "note": "run4 ran the working tree committed next as 12a6225 (same GEMV kernel; --apply-sweep put in the "
                "tiles committed there); run9 ran 0354143 with the word-wise 4-bit tiles its sweep applied "
                "(committed next); run5-run8 are in raw/ only",
        "runs": runs,
        "ceilings": ceilings,
        "shapes": shapes,
        "crossover": moe_bench.crossover(rows),
        "rows": rows,
    }
    out = HERE / "results" / "moe_h200.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
