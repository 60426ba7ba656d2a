"""Exploratory sweep on one GPU: launch variants of CSA top-K, each checked first.

Every variant's indices (written over poisoned outputs) must equal torch.topk's (sorted) index-for-index. Times are
medians of CUDA-graph replays. Writes $OUT/sparse_sweep.json and prints one line per variant (see sparse_README.md).
Top-K rows also go, in sparse_bench.py's row format, to $OUT/sparse_results.json.

Usage: python bench/kernels/sparse_sweep.py [--out DIR] [--sections topk]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sparse_bench as sb  # noqa: E402  (makes zoe_kernels importable)
import torch  # noqa: E402
import triton  # noqa: E402

from zoe_kernels.csa import topk  # noqa: E402
tk = importlib.import_module("zoe_kernels.csa.topk")  # the module (the package exports the function)

ROWS: list[dict] = []
SAVE: dict = {}  # out directory and meta, for the partial JSON written after every row


def _save() -> None:
    """Writes what was measured so far (a run cut short by its time limit still returns its rows)."""
    if not SAVE:
        return
    out, meta = SAVE["out"], SAVE["meta"]
    Path(out, "sparse_sweep.json").write_text(json.dumps({"meta": meta, "rows": ROWS}, indent=1))
    if sb.ROWS:
        Path(out, "sparse_results.json").write_text(json.dumps({"meta": {**sb.META, **meta}, "rows": sb.ROWS},
                                                               indent=1))

# (name, kwargs) per top-K shape: the default at every shape (the 1M shapes more than once), and at B=1 x 1M the
# default after a plain torch kernel (a one-entry fill_, which lets no dependent launch start early, as a kernel
# before topk in a model may not). A variant is a dict of LAUNCH_CONSTANTS keys; the variants timed so far and what
# they measured are in git history (`git log -p bench/kernels/sparse_sweep.py bench/kernels/sparse_README.md`).
DEFAULT = [("default", {})]
AFTER_PLAIN = [("default after plain kernel", dict(_after_plain=True))]
TOPK_VARIANTS = {(1, 1 << 20): DEFAULT * 3 + AFTER_PLAIN, (32, 1 << 20): DEFAULT * 2}
# B=1 x 1M first (the tighter target), then B=32: a run cut by its time limit keeps what it measured
TOPK_SHAPES = [(1, 1 << 20, "randn"), (32, 1 << 20, "randn"), (8, 262144, "randn"), (1, 4096, "randn"),
               (1, 65536, "randn"), (1, 262144, "randn"), (1, 1 << 20, "recent")]
# variant keys -> topk.py's launch constants they set for one call
LAUNCH_CONSTANTS = {"_threshold_warps": "THRESHOLD_WARPS", "_finish_warps": "FINISH_WARPS", "_vec": "VECTOR_LOADS",
                    "_hist_max": "HISTOGRAM_MAX_ENTRIES", "_max_tiles": "MAX_TILES",
                    "_filter_programs": "FILTER_PROGRAMS", "_flt_min_rows": "FLOAT_FILTER_MIN_ROWS",
                    "_half_scan": "HALF_SCAN", "_pairs": "PAIR_SEARCH", "_spec": "SPECULATIVE_SAMPLE",
                    "_fused_rows": "FUSED_FINISH_MAX_ROWS", "_ptx_store": "FINISH_PTX_STORE",
                    "_pdl_threshold_rows": "PDL_THRESHOLD_MAX_ROWS"}
PLAIN: dict = {}  # a one-entry tensor whose fill_ is the plain kernel of "_after_plain"


class _Skipped:
    """Stands for a kernel whose launches are left out (`launches_cut`)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def launches_cut(*names: str):
    """topk calls without the named kernels' launches (the module's attributes), for the cumulative timings."""
    saved = {name: getattr(tk, name) for name in names}
    try:
        for name in names:
            setattr(tk, name, _Skipped())
        yield
    finally:
        for name, kernel in saved.items():
            setattr(tk, name, kernel)


def _time_launch_prefixes(scores, lengths, k, shape, label: str = "", cfg: dict | None = None) -> None:
    """The call (cfg: `_call`'s) cut after its first launch (threshold) and after its second (threshold + filter,
    which with pdl overlap), timed like the whole call: the differences say where its time goes."""
    for name, cut in (("first launch only", ("_split_filter_kernel", "_split_finish_kernel")),
                      ("threshold + filter", ("_split_finish_kernel",))):
        with launches_cut(*cut):
            _call(scores, lengths, k, cfg or {})
            us = sb.median_us(lambda: _call(scores, lengths, k, cfg or {}), graph=True, rep_ms=30)
        ROWS.append(dict(op="topk", shape=shape, variant=name + label, config=json.dumps(cfg or {}), median_us=us))
        sb.log(f"topk {shape} {name + label} {us:8.1f} us")


def _call(scores, lengths, k, cfg):
    """topk with cfg; keys of LAUNCH_CONSTANTS set the module's launch constants for this call only; _after_plain:
    a plain torch kernel (a one-entry fill_) launched right before, so the call follows a kernel that does not let
    its dependents launch early."""
    saved = {name: getattr(tk, name) for name in LAUNCH_CONSTANTS.values()}
    try:
        for key, name in LAUNCH_CONSTANTS.items():
            if key in cfg:
                setattr(tk, name, cfg[key])
        if cfg.get("_after_plain"):
            PLAIN.setdefault("t", torch.zeros(1, device=scores.device)).fill_(1.0)
        return topk(scores, lengths, k, **{a: v for a, v in cfg.items()
                                           if a not in LAUNCH_CONSTANTS and a != "_after_plain"})
    finally:
        for name, value in saved.items():
            setattr(tk, name, value)


def _time_threshold_alone(scores, lengths, k, shape, warps: int) -> None:
    """The first launch (sampled threshold) on its own, at `warps` warps: how much of the call it is."""
    rows, n = scores.shape
    slots = max(4096, 8 * triton.next_power_of_2(k))
    thresh = torch.empty((rows, 2), dtype=torch.int32, device="cuda")
    fill = torch.empty((rows,), dtype=torch.int32, device="cuda")
    hist = torch.empty((rows, slots), dtype=torch.int32, device="cuda")
    launch = lambda: tk._split_threshold_kernel[(rows,)](  # noqa: E731
        scores, lengths, lengths, thresh, fill, hist, n, scores.stride(0), k, HAS_LO=False, S=tk.SAMPLE,
        SB=tk.SAMPLE_BLOCK, MARGIN_=tk.MARGIN, SLOTS=slots, HIST=rows * n <= tk.HISTOGRAM_MAX_ENTRIES,
        FLT=rows >= tk.FLOAT_FILTER_MIN_ROWS, PDL=False,
        num_warps=warps)
    launch()
    us = sb.median_us(launch, graph=True, rep_ms=30)
    name = "threshold launch alone" + ("" if warps == tk.THRESHOLD_WARPS else f" ({warps} warps)")
    ROWS.append(dict(op="topk", shape=shape, variant=name, median_us=us))
    sb.log(f"topk {shape} {name} {us:8.1f} us")


def sweep_topk() -> None:
    """Every variant checked index-for-index against torch.topk on two draws, then timed (CUDA-graph median);
    rows also in sparse_bench.py's format (op csa_topk, provider, % of the byte roofline, x torch.topk), so
    sparse_assemble.py can take them."""
    k = 512
    sb.measure_ceilings()
    for b, n, kind in TOPK_SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(n + b)  # sparse_bench.py's draw for this shape
        scores = sb._topk_scores(b, n, kind, gen)
        lengths = torch.full((b,), n, dtype=torch.int32, device="cuda")
        ref = torch.topk(scores, k, dim=1).indices.sort(dim=1).values.int()
        shape = f"B={b} N={n}" + ("" if kind == "randn" else f" {kind}")
        floor_us = b * n * 4 / (sb.META["copy_tbps"] * 1e6)
        base = sb.median_us(lambda: torch.topk(scores, k, dim=1), graph=True, rep_ms=30)
        sb.add_row(op="csa_topk", shape=shape, provider="torch.topk", config="", median_us=base,
                   gbps=b * n * 4 / base / 1e3, pct_roofline=100 * floor_us / base)
        sb.log(f"topk {shape:22s} {'torch.topk':24s} {base:8.1f} us")
        if (b, n) in ((1, 1 << 20), (32, 1 << 20)) and kind == "randn":
            _time_threshold_alone(scores, lengths, k, shape, tk.THRESHOLD_WARPS)
            try:
                _time_launch_prefixes(scores, lengths, k, shape)
            except Exception as exc:  # noqa: BLE001 - report and go on
                sb.log(f"topk {shape} cut calls: ERROR {exc!r:.200}")
        variants = TOPK_VARIANTS.get((b, n), DEFAULT) if kind == "randn" else DEFAULT
        for name, cfg in variants:
            t0 = time.time()
            try:  # outputs poisoned: every slot must be written
                out = _call(scores, lengths, k, {**cfg, "out": torch.full((b, k), 12345, dtype=torch.int32,
                                                                          device="cuda")})
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - report and go on
                ROWS.append(dict(op="topk", shape=shape, variant=name, error=repr(exc)[:300]))
                sb.log(f"topk {shape} {name}: ERROR {exc!r:.200}")
                _save()
                continue
            first_s = time.time() - t0
            ok = bool(torch.equal(out, ref))
            # a second draw: same function on fresh data (catches races that one input hides)
            scores2 = sb._topk_scores(b, n, kind, gen)
            poisoned = torch.full((b, k), 12345, dtype=torch.int32, device="cuda")
            ok2 = bool(torch.equal(_call(scores2, lengths, k, {**cfg, "out": poisoned}),
                                   torch.topk(scores2, k, dim=1).indices.sort(dim=1).values.int()))
            us = sb.median_us(lambda: _call(scores, lengths, k, cfg), graph=True, rep_ms=30)
            ROWS.append(dict(op="topk", shape=shape, variant=name, config=json.dumps(cfg),
                             median_us=us, correct=ok and ok2, first_call_s=round(first_s, 2)))
            sb.add_row(op="csa_topk", shape=shape, provider=f"zoe {name}", config=json.dumps(cfg), median_us=us,
                       gbps=b * n * 4 / us / 1e3, pct_roofline=100 * floor_us / us, speedup_vs_torch=base / us,
                       correct=ok and ok2, first_call_s=round(first_s, 2))
            sb.log(f"topk {shape:22s} {name:24s} {us:8.1f} us  {base / us:4.1f}x torch  correct={ok and ok2}")
            _save()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--sections", default="topk", help="topk (decode: sparse_decode_sweep.py)")
    args = ap.parse_args()
    meta = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                command="python bench/kernels/sparse_sweep.py " + " ".join(sys.argv[1:]))
    sb.META.update(device=meta["device"], started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    SAVE.update(out=args.out, meta=meta)
    for name in args.sections.split(","):
        {"topk": sweep_topk}[name]()
        _save()


if __name__ == "__main__":
    main()
