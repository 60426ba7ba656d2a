"""The JSON a benchmark writes: what ran (the full command, versions, server), its settings, and result rows.

Each row is one cell of the sweep (prefill: input length x hit rate; decode: concurrency; trace: the whole
replay) holding `summarize()` dicts (mean, std, percentiles) for every measured quantity. `compare` and
`plots` read only this file, so results measured elsewhere can be compared later.
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

Kind = Literal["prefill", "decode", "trace"]
SCHEMA_VERSION = 1


class ServerInfo(BaseModel):
    url: str = Field(description="Base URL that was measured.")
    model: str = Field(description="Model name sent in every request.")
    engine: str | None = Field(None, description="Engine family seen in /metrics (vllm, sglang) or None.")
    version: str | None = Field(None, description="What the server's /version answered, if anything.")
    token_counter: str | None = Field(None, description="How prompt lengths were set (server /tokenize, ratio).")
    sim: dict[str, Any] | None = Field(
        None, description="zoe's simulated engine: model, variant and time_scale from its /sim/info; else None.")


class BenchReport(BaseModel):
    schema_version: int = SCHEMA_VERSION
    kind: Kind = Field(description="Which workload produced this report.")
    label: str = Field(description="Short name used in plots and comparisons (defaults to the model).")
    command: str = Field(description="The exact command line that produced this report.")
    created_at: str = Field(description="UTC time the run finished, ISO 8601.")
    versions: dict[str, str] = Field(description="zoe, python, platform and client library versions.")
    server: ServerInfo
    config: dict[str, Any] = Field(description="The workload's settings.")
    rows: list[dict[str, Any]] = Field(description="One row per cell of the sweep.")
    requests: list[dict[str, Any]] = Field(default_factory=list, description="Per-request results (trace).")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path


def load_report(path: str | Path) -> BenchReport:
    """Read a report; raises ValueError naming the file and the field that is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    try:
        return BenchReport.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: field {where}: {first['msg']}") from None


def versions() -> dict[str, str]:
    def version_of(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "zoe": version_of("zoe-cluster"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "aiohttp": version_of("aiohttp"),
    }


def command_line(argv: list[str] | None = None) -> str:
    """The command as the user typed it (`zoe bench ...`), quoted so it can be pasted back."""
    args = list(sys.argv if argv is None else argv)
    if args and Path(args[0]).name in ("zoe", "__main__.py", "main.py"):
        args[0] = "zoe"
    return shlex.join(args)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
