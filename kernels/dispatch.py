"""Dispatch by M: run zoe's fused MoE below the measured crossover and the fallback above it.

The crossover table is data (`moe/crossover.json`), written by `bench/kernels/moe_large_m.py` from
measurements per device and format. For a format, zoe runs when M <= `zoe_max_m` (null: at every M).
Inside zoe, `path_by_m` ({M: "fused" | "dequant"}, optional) names the faster of zoe's paths at each measured M
(`moe_path_for`). A device that was never measured uses the table's "default" entry.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from zoe_kernels.moe.formats import FORMATS

CROSSOVER_PATH = Path(__file__).resolve().parent / "moe" / "crossover.json"
# zoe's paths for one MoE call: its fused kernels, or the 4-bit weights dequantized and the float kernels
ZOE_PATHS = ("fused", "dequant")


@functools.lru_cache(maxsize=4)
def load_crossover_table(path: str | Path = CROSSOVER_PATH) -> dict:
    """The crossover table: {"devices": {device_name: {fmt: {"zoe_max_m": int | None, ...}}}, ...}."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"MoE crossover table missing at {path}: the package was installed without its "
                                "data files (kernels/moe/*.json)")
    table = json.loads(path.read_text())
    if "devices" not in table or "default" not in table["devices"]:
        raise ValueError(f"{path}: field 'devices' must hold a 'default' entry")
    for device, formats in table["devices"].items():
        for fmt, entry in formats.items():
            if fmt not in FORMATS:
                raise ValueError(f"{path}: devices.{device}: unknown format {fmt!r}")
            limit = entry.get("zoe_max_m")
            if limit is not None and (not isinstance(limit, int) or limit < 0):
                raise ValueError(f"{path}: devices.{device}.{fmt}.zoe_max_m must be a non-negative int or null")
            for m, impl in entry.get("path_by_m", {}).items():
                if not m.isdigit() or impl not in ZOE_PATHS:
                    raise ValueError(f"{path}: devices.{device}.{fmt}.path_by_m maps an M (digits) to one of "
                                     f"{ZOE_PATHS}, got {m!r}: {impl!r}")
    return table


def moe_impl_for(m: int, fmt: str, device_name: str, table: dict | None = None) -> str:
    """"zoe" or "fallback" for a MoE call with M tokens in format `fmt` on the named device."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    devices = (table or load_crossover_table())["devices"]
    entry = devices.get(device_name, {}).get(fmt) or devices["default"].get(fmt) or {}
    limit = entry.get("zoe_max_m")
    return "zoe" if limit is None or m <= limit else "fallback"


def moe_path_for(m: int, fmt: str, device_name: str, table: dict | None = None) -> str:
    """"fused" or "dequant": zoe's faster path for M tokens in `fmt` on the named device, the path measured at the
    largest measured M <= m (below the smallest: the smallest's). "fused" where nothing was measured."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    devices = (table or load_crossover_table())["devices"]
    entry = devices.get(device_name, {}).get(fmt) or devices["default"].get(fmt) or {}
    by_m = sorted((int(k), v) for k, v in entry.get("path_by_m", {}).items())
    if not by_m:
        return "fused"
    below = [v for k, v in by_m if k <= m]
    return below[-1] if below else by_m[0][1]
