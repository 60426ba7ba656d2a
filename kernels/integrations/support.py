"""Where each zoe kernel can run inside an engine: kernel -> engine -> platform -> verified release ranges.

This table is the single statement of the plugin's support. The patch specs take their `versions` from it
(`ranges`), the tests check every listed release's patch targets against that release's real modules, and
zoe_cluster reads a generated copy (`zoe_cluster/recipes/kernel_support.json`, written by
`python -m zoe_kernels.integrations.support --write PATH`) so the planner never picks a kernel variant whose
kernels cannot activate on its image. Pure Python: no torch, no engine import.

A range is `[lowest, first unsupported)` on the numeric release ("0.29.0+rocm" is 0.29.0). `GAPS` records what
was checked and found different in a release (the reason a kernel is not supported there); a release that is
neither verified nor a gap was simply not checked.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINES = ("vllm", "sglang")
PLATFORMS = ("rocm", "cuda", "cpu")
KERNELS = ("fused_moe", "lightning_indexer", "csa_topk", "csa_dual_scope")

VLLM_029 = ("0.29.0", "0.30.0")
VLLM_032 = ("0.32.0", "0.33.0")
VLLM_033 = ("0.33.0", "0.34.0")
SGLANG_0519 = ("0.5.19", "0.5.20")
SGLANG_0523 = ("0.5.23", "0.5.24")


@dataclass(frozen=True)
class Verified:
    """Releases of `engine` on which every patch of `kernel` for `platforms` was checked against the real modules."""

    kernel: str
    engine: str
    platforms: tuple[str, ...]
    versions: tuple[str, str]


@dataclass(frozen=True)
class Gap:
    """A release range where a kernel's patch target was checked and differs: the kernel is unsupported there."""

    kernel: str
    engine: str
    platforms: tuple[str, ...]
    versions: tuple[str, str]
    reason: str


SUPPORT: tuple[Verified, ...] = (
    Verified("fused_moe", "vllm", ("rocm", "cuda"), VLLM_029),
    Verified("fused_moe", "vllm", ("rocm", "cuda", "cpu"), VLLM_032),
    Verified("fused_moe", "vllm", ("rocm", "cuda"), VLLM_033),
    Verified("lightning_indexer", "vllm", ("rocm", "cuda"), VLLM_029),
    Verified("lightning_indexer", "vllm", ("rocm", "cuda"), VLLM_032),
    Verified("lightning_indexer", "vllm", ("rocm", "cuda"), VLLM_033),
    Verified("csa_topk", "sglang", ("rocm", "cuda"), SGLANG_0519),
    Verified("csa_topk", "sglang", ("rocm", "cuda"), SGLANG_0523),
    Verified("csa_dual_scope", "sglang", ("rocm",), SGLANG_0519),
    Verified("csa_dual_scope", "sglang", ("rocm", "cuda"), SGLANG_0523),
)

GAPS: tuple[Gap, ...] = (
    Gap("fused_moe", "vllm", ("cpu",), VLLM_029,
        "vLLM 0.29's CPUUnquantizedExperts.apply routes inside the experts (it takes router_logits, not topk_ids)"),
    Gap("csa_dual_scope", "sglang", ("cuda",), SGLANG_0519,
        "SGLang 0.5.19 has no sglang.kernels.ops.attention.flash_mla_interface (its CUDA backend imports "
        "sgl_kernel's FlashMLA inside the call)"),
)  # fmt: skip


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "0.32.0+cpu" -> (0, 32, 0), "v0.5.19-rocm720" -> (0, 5, 19)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if not m:
        raise ValueError(f"cannot read a release number from version {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def in_range(version: str, versions: tuple[str, str]) -> bool:
    """True when `version`'s release lies in [lowest, first unsupported); False when it has no release number."""
    try:
        v = release(version)
    except ValueError:
        return False
    lo, hi = release(versions[0]), release(versions[1])
    pad = max(len(v), len(lo), len(hi))

    def fill(t: tuple[int, ...]) -> tuple[int, ...]:  # "0.32" compares as "0.32.0"
        return t + (0,) * (pad - len(t))

    return fill(lo) <= fill(v) < fill(hi)


def ranges(kernel: str, engine: str, platform: str) -> list[tuple[str, str]]:
    """The verified release ranges of `kernel` on `engine` on `platform`, lowest first (empty: not supported)."""
    found = [s.versions for s in SUPPORT if (s.kernel, s.engine) == (kernel, engine) and platform in s.platforms]
    return sorted(found, key=lambda r: release(r[0]))


def gap_reason(kernel: str, engine: str, platform: str, version: str) -> str | None:
    """Why `kernel` is known not to work on `engine` `version` on `platform` (None: no checked gap there)."""
    for g in GAPS:
        if (g.kernel, g.engine) == (kernel, engine) and platform in g.platforms and in_range(version, g.versions):
            return g.reason
    return None


def engine_span(engine: str) -> tuple[str, str]:
    """The lowest and the first unsupported release over every verified range of `engine` (gaps inside it are
    releases the plugin falls back on, loudly)."""
    rs = [s.versions for s in SUPPORT if s.engine == engine]
    return min((r[0] for r in rs), key=release), max((r[1] for r in rs), key=release)


def table() -> dict:
    """The support table as JSON-ready data (what zoe_cluster's copy holds)."""
    kernels: dict[str, dict] = {}
    for k in KERNELS:
        for e in ENGINES:
            for p in PLATFORMS:
                rs = ranges(k, e, p)
                if rs:
                    kernels.setdefault(k, {}).setdefault(e, {})[p] = [list(r) for r in rs]
    return {
        "generated_by": "python -m zoe_kernels.integrations.support --write zoe_cluster/recipes/kernel_support.json",
        "kernels": kernels,
        "gaps": [{"kernel": g.kernel, "engine": g.engine, "platforms": list(g.platforms), "versions": list(g.versions),
                  "reason": g.reason} for g in GAPS],  # fmt: skip
    }


def render() -> str:
    return json.dumps(table(), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoe_kernels.integrations.support", description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="PATH", help="write the table as JSON to PATH")
    group.add_argument("--check", metavar="PATH", help="exit 1 when PATH differs from the table")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    elif args.check:
        path = Path(args.check)
        if not path.exists() or path.read_text() != text:
            print(f"{path} is out of date: run python -m zoe_kernels.integrations.support --write {path}",
                  file=sys.stderr)  # fmt: skip
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
