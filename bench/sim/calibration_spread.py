"""How much the twin's error against vLLM depends on which calibration it runs on: the live repeats of committed
validations (`validate_vllm.py`'s JSON) compared with the twin on each of several profiles that `zoe sim calibrate
--url` measured on the same engine at other times (an entry `a.yaml+b.yaml+...` is those calibrations merged as
the passes of one, `sim.calibration_passes.merge_passes`); writes `calibration_spread.json` and prints a table
(README.md in this folder has the command and the current results). No engine needed.

    .venv/bin/python bench/sim/calibration_spread.py --profiles bench/sim/calibration_vllm_cpu.yaml,... \
        --validations bench/sim/validation_agentic.json,bench/sim/validation_mooncake.json
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
from pathlib import Path

from zoe_cluster.sim.calibration_passes import merge_passes
from zoe_cluster.sim.engine_calibration import load_engine_profile

HERE = Path(__file__).resolve().parent
KEYS = ("twin_vs_live_median_abs_pct", "twin_vs_live_max_abs_pct", "engine_side_median_abs_pct",
        "engine_side_max_abs_pct", "hit_rate_max_points", "live_repeat_vs_others_median_abs_pct",
        "live_repeat_vs_others_max_abs_pct")


def _validate_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("validate_vllm", HERE / "validate_vllm.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["validate_vllm"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", required=True, help="Comma-separated calibration profiles (zoe sim calibrate --url); "
                    "a+b+c: those merged as passes of one calibration.")
    ap.add_argument("--validations", required=True, help="Comma-separated validate_vllm.py JSON files.")
    ap.add_argument("--sessions-dir", type=Path, default=None, help="Agentic: the session files (validate_vllm's).")
    ap.add_argument("--out", type=Path, default=HERE / "calibration_spread.json")
    args = ap.parse_args()
    vv = _validate_module()
    ns = argparse.Namespace(sessions_dir=args.sessions_dir or vv.SESSIONS)
    rows = []
    for prof_path in args.profiles.split(","):
        prof = merge_passes([load_engine_profile(p) for p in prof_path.split("+")])
        for val_path in args.validations.split(","):
            done = copy.deepcopy(json.loads(Path(val_path).read_text()))
            vv.retwin(done, prof, ns)
            rows.append({"profile": prof_path, "measured_at": prof.measured_at, "calibration_wall_s": prof.wall_s,
                         "validation": val_path, "workload": done["workload"],
                         **{k: done["summary"].get(k) for k in KEYS}})
            r = rows[-1]
            print(f"{prof_path} ({prof.measured_at[11:16]}) on {done['workload']}: median "
                  f"{r['twin_vs_live_median_abs_pct']:.1f}%, max {r['twin_vs_live_max_abs_pct']:.1f}%, engine-side "
                  f"{r['engine_side_median_abs_pct']:.1f}% / {r['engine_side_max_abs_pct']:.1f}%", flush=True)
    out = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "rows": rows}
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
