"""Dual-scope decode on one GPU: launch variants side by side with the default, each checked first.

Every variant is checked against sparse_bench's float32 reference (relative error < sparse_bench.DECODE_TOL) on two
fresh draws before it is timed: the benchmark's draw (full windows, 512 selected entries) and a ragged one (random
window lengths, -1 padded selections), its outputs NaN-poisoned. Times are medians of CUDA-graph replays, each variant
timed twice back to back and once as an isolated call with a clean L2 (`sparse_bench._isolated_us`), as in
sparse_bench.py, whose row format the timed rows also take ($OUT/sparse_results.json).

To fit one short lease the script first compiles every (variant, batch) specialisation in parallel worker
processes (they fill Triton's on-disk cache; `--pytest` runs the GPU tests of the two dual-scope test files
beside them, in 6 pytest-xdist processes), then times everything in this process, one launch at a time.

Usage: python bench/kernels/sparse_decode_sweep.py [--out DIR] [--workers N] [--pytest] [--batches 64,1,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# (name, dual_scope_decode keyword arguments): the default and the launch parameters and schedules it was chosen
# over (the variants timed before are in git history: `git log -p bench/kernels/sparse_decode_sweep.py`)
VARIANTS = [("default", {}), ("3 key slots", dict(num_stages=3)), ("one warpgroup, 256 columns", dict(block_dv=256)),
            ("two warpgroups, 512 columns", dict(block_dv=512)), ("two passes", dict(schedule=3))]


def variants(b: int) -> list[tuple[str, dict]]:
    """The variants timed at batch b (the same list at every batch)."""
    return VARIANTS


def _check(sb, draw, cfg) -> float:
    """Relative error of the variant against sparse_bench's float32 reference on one draw, NaN if any output is not
    finite; the call's outputs and partials are NaN-poisoned (`sparse_bench._poisoned_call`), so an element the
    kernels fail to write shows."""
    from zoe_kernels.csa import dual_scope_decode

    q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = draw
    out = sb._poisoned_call(lambda: dual_scope_decode(q, win_k, win_v, win_len, comp_k, comp_v, idx, win_k_scale=win_ks,
                                                      comp_k_scale=comp_ks, **cfg))
    return sb._rel_err(out, sb._reference_f32(*draw))


def worker(index: int, count: int, batches: list[int], log_path: Path) -> None:
    """Compiles (and checks) this worker's share of the (batch, variant) pairs, filling Triton's cache."""
    import sparse_bench as sb
    import torch

    jobs = [(b, name, cfg) for b in batches for name, cfg in variants(b)]
    lines = []
    for j, (b, name, cfg) in enumerate(jobs):
        if j % count != index:
            continue
        t0 = time.time()
        try:
            err = _check(sb, sb._decode_inputs(b, ragged=True), cfg)
            lines.append(f"B={b} {name}: compiled+checked in {time.time() - t0:.1f} s, err {err:.1e}")
        except Exception as exc:  # noqa: BLE001 - reported, the timing pass reports it again
            lines.append(f"B={b} {name}: ERROR {exc!r:.300}")
        torch.cuda.empty_cache()  # the baseline's expanded K/V: keep the workers' memory small
    log_path.write_text("\n".join(lines) + "\n")


def sweep(out: Path, batches: list[int]) -> None:
    import sparse_bench as sb
    import torch
    import triton

    from zoe_kernels.csa import dual_scope_decode

    meta = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                command="python bench/kernels/sparse_decode_sweep.py " + " ".join(sys.argv[1:]),
                started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    sb.META.update(meta)
    sb.measure_ceilings()
    rows: list[dict] = []

    def save():
        (out / "decode_sweep.json").write_text(json.dumps({"meta": {**sb.META}, "rows": rows}, indent=1))
        (out / "sparse_results.json").write_text(json.dumps({"meta": {**sb.META}, "rows": sb.ROWS}, indent=1))

    for b in batches:
        draw = sb._decode_inputs(b)
        ragged = sb._decode_inputs(b, ragged=True)
        q, win_k, win_v, win_len, comp_k, comp_v, idx, win_ks, comp_ks = draw
        args = (q, win_k, win_v, win_len, comp_k, comp_v, idx)
        kw = dict(win_k_scale=win_ks, comp_k_scale=comp_ks)
        h, d = q.shape[1], q.shape[2]
        bytes_min, floor_us = sb._decode_floor(draw)
        shape = f"B={b} H={h} D={d} W=128 k=512"
        base = sb.median_us(lambda: sb._torch_dual_scope_bmm(*args, win_ks, comp_ks), graph=True, rep_ms=30)
        sb.add_row(op="csa_dual_scope_decode", shape=shape, provider="torch gather+bmm", config="", median_us=base,
                   gbps=bytes_min / base / 1e3, pct_roofline=100 * floor_us / base)
        for name, cfg in variants(b):
            try:
                errs = [_check(sb, draw, cfg), _check(sb, ragged, cfg)]
            except Exception as exc:  # noqa: BLE001 - a variant that does not fit is reported, not fatal
                rows.append(dict(shape=f"B={b}", variant=name, config=json.dumps(cfg), error=repr(exc)[:300]))
                sb.log(f"decode B={b:<3d} {name:22s} ERROR {exc!r:.150}")
                save()
                continue
            ok = all(e < sb.DECODE_TOL for e in errs)  # NaN compares False
            us = sb.median_us(lambda: dual_scope_decode(*args, **kw, **cfg), graph=True, rep_ms=30)
            iso = sb._isolated_us(lambda: dual_scope_decode(*args, **kw, **cfg))
            us2 = sb.median_us(lambda: dual_scope_decode(*args, **kw, **cfg), graph=True, rep_ms=30)
            rows.append(dict(shape=f"B={b}", variant=name, config=json.dumps(cfg), median_us=us, repeat_us=us2,
                             isolated_us=iso, pct_hbm=100 * floor_us / us, rel_err=errs, correct=ok,
                             speedup_vs_torch=base / us))
            sb.add_row(op="csa_dual_scope_decode", shape=shape, provider=f"zoe {name}", config=json.dumps(cfg),
                       median_us=us, isolated_us=iso, gbps=bytes_min / us / 1e3, pct_roofline=100 * floor_us / us,
                       speedup_vs_torch=base / us, rel_err_vs_torch=max(errs), correct=ok)
            sb.log(f"decode B={b:<3d} {name:28s} {us:7.1f} us (again {us2:7.1f}, isolated {iso:7.1f})  "
                   f"{100 * floor_us / us:5.1f}% of "
                   f"{floor_us:.1f} us floor  {base / us:6.1f}x torch  err {errs[0]:.1e}/{errs[1]:.1e} ok={ok}")
            save()
        del draw, ragged
        torch.cuda.empty_cache()
    save()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--batches", default="64,1,8,32,128")
    ap.add_argument("--workers", type=int, default=8, help="parallel compile processes before timing (0: none)")
    ap.add_argument("--pytest", nargs="?", const="", default=None,
                    help="run the dual-scope GPU tests beside the compiles (optionally only those matching -k EXPR)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(x) for x in args.batches.split(",")]
    out = Path(args.out)
    if args.worker is not None:
        worker(args.worker, args.workers, batches, Path(f"/tmp/decode_warm_{args.worker}.log"))
        return
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--workers", str(args.workers),
                               "--batches", args.batches]) for i in range(args.workers)]
    if args.pytest is not None:
        repo = HERE.parents[1]
        env = dict(os.environ, PYTHONPATH=f"/tmp/zoe_kernels_shim:{repo}:" + os.environ.get("PYTHONPATH", ""))
        with open(out / "decode_pytest.log", "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "6",
                                           "tests/kernels/test_csa_dual_scope.py",
                                           "tests/kernels/test_paged_dual_scope.py"]
                                          + (["-k", args.pytest] if args.pytest else []),
                                          cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()
    warm = "".join(Path(f"/tmp/decode_warm_{i}.log").read_text() for i in range(args.workers)
                   if Path(f"/tmp/decode_warm_{i}.log").exists())
    print(warm, f"compiles (and pytest) took {time.time() - t0:.0f} s", flush=True)
    sweep(out, batches)


if __name__ == "__main__":
    main()
