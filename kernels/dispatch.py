"""Dispatch by M: run zoe's fused MoE below the measured crossover and the fallback above it.

The crossover table is data (`moe/crossover.json`), written by `bench/kernels/moe_bench.py` from
measurements per device and format. For a format, zoe runs when M <= `zoe_max_m` (null: at every M).
A device that was never measured uses the table's "default" entry.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from zoe_kernels.moe.formats import FORMATS

CROSSOVER_PATH = Path(__file__).resolve().parent / "moe" / "crossover.json"


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
