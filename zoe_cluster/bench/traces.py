"""Reading request traces: Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids` of
512-token blocks) and Azure LLM inference CSV (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`)."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class TraceRequest:
    index: int
    arrival_s: float
    """Seconds after the trace's first request."""
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] | None = None
    """Mooncake block ids (equal ids = equal 512-token block content); None when the trace has none."""


def _azure_time(text: str) -> float:
    # "2023-11-16 18:17:03.9799600": seven fractional digits, which strptime's %f does not take.
    head, _, frac = text.strip().partition(".")
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def load_mooncake(path: Path) -> list[TraceRequest]:
    out = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(
                    TraceRequest(
                        index=len(out),
                        arrival_s=float(row["timestamp"]) / 1000.0,
                        input_len=int(row["input_length"]),
                        output_len=int(row["output_length"]),
                        hash_ids=tuple(int(h) for h in row.get("hash_ids") or ()) or None,
                    )
                )
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: not a Mooncake trace line ({type(exc).__name__}: {exc})") from None
    return out


def load_azure(path: Path) -> list[TraceRequest]:
    out = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: Azure trace CSV lacks column(s) {', '.join(sorted(missing))}")
        first = None
        for lineno, row in enumerate(reader, 2):
            try:
                t = _azure_time(row["TIMESTAMP"])
                first = t if first is None else first
                out.append(
                    TraceRequest(len(out), t - first, int(row["ContextTokens"]), int(row["GeneratedTokens"]))
                )
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: bad Azure trace row ({exc})") from None
    return out


def load_trace(path: str | Path) -> tuple[str, list[TraceRequest]]:
    """(format, requests sorted by arrival) of a Mooncake `.jsonl` or Azure `.csv` trace. Raises ValueError."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist")
    with path.open() as f:
        head = f.readline().strip()
    if head.startswith("{"):
        fmt, requests = "mooncake", load_mooncake(path)
    elif head.upper().startswith("TIMESTAMP") or path.suffix.lower() == ".csv":
        fmt, requests = "azure", load_azure(path)
    else:
        raise ValueError(f"{path}: neither Mooncake JSONL nor Azure CSV (first line: {head[:80]!r})")
    if not requests:
        raise ValueError(f"{path}: the trace holds no requests")
    requests.sort(key=lambda r: r.arrival_s)
    return fmt, requests
