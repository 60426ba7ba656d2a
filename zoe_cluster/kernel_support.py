"""Which zoe kernels can activate on a variant's engine image: zoe_cluster's copy of the plugin's support table.

`zoe_cluster/recipes/kernel_support.json` is generated from `zoe_kernels.integrations.support` (`python -m
zoe_kernels.integrations.support --write zoe_cluster/recipes/kernel_support.json`; a test fails while the copy is
stale), so zoe_cluster reads it without importing zoe_kernels or torch. A variant's engine release and platform
come from its recipe's `image`: the release from the tag (`vllm/vllm-openai-rocm:v0.29.0` -> 0.29.0,
`lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910` -> 0.5.19; a nightly tag names none), the platform from
the image name (ROCm images say so; others are CUDA builds).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent / "recipes" / "kernel_support.json"

Range = tuple[str, str]


@dataclass(frozen=True)
class ImageEngine:
    """What an engine image's reference says about the engine inside it."""

    image: str
    release: str | None
    """The engine release its tag names ("0.29.0"), None when the tag names none (a nightly, `latest`)."""
    platform: str
    """"rocm" or "cuda": the accelerator stack the image is built for."""


def image_engine(image: str) -> ImageEngine:
    """The engine release and platform of an image reference such as `vllm/vllm-openai-rocm:v0.29.0`."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:  # no tag, or the colon belongs to a registry's port
        name, tag = image, ""
    m = re.match(r"v?(\d+(?:\.\d+){1,2})(?:$|[-+_])", tag)
    return ImageEngine(image, m.group(1) if m else None, "rocm" if "rocm" in name.lower() else "cuda")


def release(version: str) -> tuple[int, ...]:
    """"0.29.0" -> (0, 29, 0); a release shorter than another compares as padded with zeros."""
    return tuple(int(p) for p in version.split("."))


def in_range(version: str, r: Range) -> bool:
    v, lo, hi = release(version), release(r[0]), release(r[1])
    pad = max(len(v), len(lo), len(hi))
    fill = lambda t: t + (0,) * (pad - len(t))  # noqa: E731
    return fill(lo) <= fill(v) < fill(hi)


def _fmt(ranges: list[Range]) -> str:
    """"[0.29.0, 0.30.0), [0.32.0, 0.33.0)": each range from its lowest release up to its first unsupported one."""
    return ", ".join(f"[{lo}, {hi})" for lo, hi in ranges)


@dataclass(frozen=True)
class KernelSupport:
    """kernel -> engine -> platform -> verified [lowest, first unsupported) ranges, plus known gaps with reasons."""

    kernels: dict[str, dict[str, dict[str, list[Range]]]]
    gaps: tuple[dict, ...] = ()
    source: str = "kernel_support.json"

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> "KernelSupport":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            kernels = {k: {e: {p: [(lo, hi) for lo, hi in rs] for p, rs in plats.items()}
                           for e, plats in engines.items()}
                       for k, engines in data["kernels"].items()}  # fmt: skip
            gaps = tuple(data.get("gaps", ()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a kernel support table ({type(e).__name__}: {e}); regenerate it with "
                             f"python -m zoe_kernels.integrations.support --write {path}") from e  # fmt: skip
        return cls(kernels, gaps, str(path))

    def ranges(self, kernel: str, engine: str, platform: str) -> list[Range]:
        return list(self.kernels.get(kernel, {}).get(engine, {}).get(platform, []))

    def why_not(self, kernel: str, engine: str, image: str) -> str | None:
        """Why `kernel` cannot activate in `engine` on `image`, or None when its patches are verified there."""
        ie = image_engine(image)
        ranges = self.ranges(kernel, engine, ie.platform)
        if not ranges:
            return f"kernel {kernel} has no {engine} integration on {ie.platform}"
        if ie.release is None:
            return (f"kernel {kernel}: image {image} names no {engine} release, so it cannot be checked against the "
                    f"releases the plugin was verified on ({engine} {_fmt(ranges)})")  # fmt: skip
        if any(in_range(ie.release, r) for r in ranges):
            return None
        why = f"kernel {kernel} not supported on {engine} {ie.release} (verified {_fmt(ranges)})"
        for gap in self.gaps:
            if ((gap["kernel"], gap["engine"]) == (kernel, engine) and ie.platform in gap["platforms"]
                    and in_range(ie.release, tuple(gap["versions"]))):  # fmt: skip
                why += f": {gap['reason']}"
        return why

    def blockers(self, kernels: list[str], engine: str, image: str) -> str | None:
        """Why some of a variant's `kernels` cannot activate on its image ("; "-joined), None when all can."""
        reasons = [r for r in (self.why_not(k, engine, image) for k in kernels) if r]
        return "; ".join(reasons) if reasons else None

    def blocked_variants(self, recipe) -> dict[str, str]:
        """{variant: why} for each of `recipe`'s variants whose kernels cannot all activate on its image."""
        found = {n: self.blockers(list(v.kernels), v.engine, v.image) for n, v in recipe.variants.items()}
        return {n: why for n, why in found.items() if why}
