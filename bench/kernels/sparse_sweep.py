"""Exploratory sweep on one GPU: launch variants of CSA top-K, each checked first.

Every variant's indices (written over poisoned outputs) must equal torch.topk's (sorted) index-for-index. Times are medians of CUDA-graph replays. Writes $OUT/sparse_sweep.json and
prints one line per variant; the chosen defaults then go through sparse_bench.py (see sparse_README.md).
The top-K lists time the defaults (runs 10-14-topk's variants are named in their JSON); runs 6-7 also swept
decode here (`results/sparse_sweep_run6/7.json`): decode sweeps live in sparse_decode_sweep.py now. Top-K rows also go, in
sparse_bench.py's row format, to $OUT/sparse_results.json.

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

# (name, kwargs) per top-K shape. Runs 6-7 swept warps, tiles and the fused finish, run 9 the band finish and pdl
# (now the default for one row); runs 10-12 ("run10-topk" to "run12-topk", raw/sparse_sweep_run1*-topk.json) the
# filter without its returned atomic, an interpolated finish search, register caps, loads not waiting for the
# row's length, streaming programs (manual prefetch, cp.async pipeline) and 1024-entry tiles; only the last was
# faster (B=32) and is the default from 8 rows; the others are gone (`git show ccd2ed4` has them).
# Run 14-topk timed 16-byte tile loads with the candidate stores as inline PTX in the loads' layout (_vec, the
# default since) against run 12's default. Run 15-topk (raw/sparse_sweep_run15-topk.json) timed the finish's search
# started from a histogram of the candidates (now the default up to 2M entries) and the taken candidates placed
# with tl.gather (the default since), each alone and both against run 14's default, and 1-2-warp filter programs.
# Run 16-topk: smaller filter programs (1-2 warps, 256-1024-entry tiles, more segments per row), no histogram
# (all slower; raw/sparse_sweep_run16-topk.json). Run 17-topk: the filter comparing floats against the threshold's
# float with (bits, position) 8-byte stores and NaN-padded tiles (the default from FLOAT_FILTER_MIN_ROWS = 8 rows
# since: faster at B=8 and B=32, not at B=1) against run 16's default (integer keys, "int keys"), each timed twice
# at the two 1M shapes; run 17 had the float filter on at every shape ("default" in its JSON).
# Run 18-topk (raw/sparse_sweep_run18-topk.json): the filter's halves counted as one packed int32 ("half scan",
# HALF_SCAN: faster at every shape, the default since), dependent launches at B=8 and B=32 ("pdl": faster at 32 rows,
# the default from PDL_MIN_ROWS = 32 since), warp segments (one per warp and tile half, reserved by the warp; slower,
# removed) and 32 threshold warps (slower), each against run 17's default. Listed now: the defaults against what
# they replaced ("one cumsum": HALF_SCAN off; at B=32 also without pdl, and without both: run 17's default).
# Run 19-topk timed both defaults together against HALF_SCAN off ("one cumsum") and, at B=32, pdl off.
# Run 20-topk (raw/sparse_sweep_run20-topk.json): the finish's search started from a histogram the finish builds over
# its own candidates ("own hist N": N bins) where the filter counts none (B=32 x 1M; at B=8 instead of the filter's
# histogram), the searches deciding two bits per count ("pairs": threshold and finish), 16 finish warps with both
# (all slower, removed: `git show 18963a9`), an 8192-entry sample at B=32 (faster, not the default: see
# sparse_README.md), and the call cut after its first launch or two ("first launch only", "threshold + filter": where
# the time goes). Run 21-topk (raw/sparse_sweep_run21-topk.json): the threshold's search over each group's two largest
# keys ("pairs", PAIR_SEARCH), the finish counting its own histogram with one `red` per candidate where the filter
# counts none ("own hist": slower, removed, `git show 2bff189`), the finish's loads issued with its slot count ("early",
# FINISH_EARLY_LOADS), the sample of a full-width row loaded before the row's length ("spec", SPECULATIVE_SAMPLE), each
# alone and all four together, against run 20's default; pairs, early and spec are the defaults since. Listed now
# (run 22-topk): the default against run 20's and against pairs alone, the 1M shapes twice; the cut calls for both
# defaults. Run 23-topk: the pair search deciding two bits per count ("two bits", PAIR_BITS = 2), the finish's segment
# ends read with one gather ("one gather", FINISH_ONE_GATHER), the finish run by the last filter program ("fused",
# FUSED_FINISH_MAX_ROWS = 1: 8-warp filter programs on 4096-entry tiles; "tile 4096 8 warps": those programs without
# the finish), the three together ("all"), and the B=1 finish at 16 warps, against the default (run 22's), the 1M
# shapes twice (B=1 first); the cut calls for the default and all three. All three are the defaults since (each alone
# was no slower; raw/sparse_sweep_run23-topk.json). Run 24-topk (raw/sparse_sweep_run24-topk.json): the finish's taken
# positions stored as inline PTX ("ptx store", FINISH_PTX_STORE), its histogram start as one int32 maximum ("packed",
# PACKED_HIST_START), its threshold loaded with its slot count ("early thresh", FINISH_EARLY_THRESH), the threshold
# launch's resets before its search ("reset first": slower, removed since) and, with pdl, the threshold launch a
# dependent of the kernel before it at every row count ("pdl threshold": one row only since, PDL_THRESHOLD_MAX_ROWS),
# all five on ("default" there) against run 23's default and each one off alone, B=1 x 1M three times, B=32 twice; and
# at B=1 both defaults after a plain torch kernel. Listed now: the default against run 23's (B=1 x 1M three times, B=32
# twice), and at B=1 both after a plain torch kernel (a one-entry fill_, which lets no dependent launch early, as a
# kernel before topk in a model may not): what the dependent threshold launch leaves there.
RUN23_DEFAULT = dict(_ptx_store=False, _packed=False, _early_thresh=False, _pdl_threshold_rows=0)
DEFAULT_AND_BEFORE = [("default", {}), ("run 23 default", RUN23_DEFAULT)]  # the other shapes
AFTER_PLAIN = [("default after plain kernel", dict(_after_plain=True)),
               ("run 23 default after plain kernel", dict(RUN23_DEFAULT, _after_plain=True))]
TOPK_VARIANTS = {(1, 1 << 20): DEFAULT_AND_BEFORE * 3 + AFTER_PLAIN, (32, 1 << 20): DEFAULT_AND_BEFORE * 2}
# B=1 x 1M first (the tighter target), then B=32: a run cut by its time limit keeps what it measured
TOPK_SHAPES = [(1, 1 << 20, "randn"), (32, 1 << 20, "randn"), (8, 262144, "randn"), (1, 4096, "randn"),
               (1, 65536, "randn"), (1, 262144, "randn"), (1, 1 << 20, "recent")]
LAUNCH_CONSTANTS = {"_threshold_warps": "THRESHOLD_WARPS", "_finish_warps": "FINISH_WARPS", "_vec": "VECTOR_LOADS",
                    "_hist_max": "HISTOGRAM_MAX_ENTRIES", "_max_tiles": "MAX_TILES",
                    "_filter_programs": "FILTER_PROGRAMS", "_flt_min_rows": "FLOAT_FILTER_MIN_ROWS",
                    "_half_scan": "HALF_SCAN", "_pairs": "PAIR_SEARCH", "_early": "FINISH_EARLY_LOADS",
                    "_spec": "SPECULATIVE_SAMPLE", "_pair_bits": "PAIR_BITS", "_one_gather": "FINISH_ONE_GATHER",
                    "_fused_rows": "FUSED_FINISH_MAX_ROWS", "_ptx_store": "FINISH_PTX_STORE",
                    "_packed": "PACKED_HIST_START", "_early_thresh": "FINISH_EARLY_THRESH",
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
            _time_threshold_alone(scores, lengths, k, shape, tk.THRESHOLD_WARPS)  # run 18 also timed 32 warps
            for label, cfg in (("", {}), (" (run 23 default)", RUN23_DEFAULT)):
                try:
                    _time_launch_prefixes(scores, lengths, k, shape, label, cfg)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    sb.log(f"topk {shape} cut calls{label}: ERROR {exc!r:.200}")
        variants = TOPK_VARIANTS.get((b, n), DEFAULT_AND_BEFORE) if kind == "randn" else DEFAULT_AND_BEFORE
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
