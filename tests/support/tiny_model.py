"""A tiny random-weight model with a real tokenizer, built locally (no model can be downloaded here).

`build_tiny_model(out_dir, python, arch)` runs `_build_tiny_model.py` under `python` (the vllm venv's, which has
transformers and tokenizers) and returns the folder. Results are cached per arch: with `out_dir=None` the model
lands in a shared temp folder, so every test (and every test session on the machine) builds it once.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ARCHS = ("llama", "qwen3_moe")
BUILDER = Path(__file__).with_name("_build_tiny_model.py")
_DONE = ".zoe-tiny-model-ready"


def tiny_model_cache_dir() -> Path:
    """Where models built with `out_dir=None` live: $ZOE_TINY_MODEL_DIR or <tmp>/zoe-tiny-models."""
    return Path(os.environ.get("ZOE_TINY_MODEL_DIR", Path(tempfile.gettempdir()) / "zoe-tiny-models"))


def build_tiny_model(out_dir: str | Path | None, python: str, arch: str = "llama", timeout_s: float = 300) -> Path:
    """Build (or reuse) a tiny `arch` model and return its folder.

    The model folder is `out_dir/arch` (or the shared cache's `arch` when `out_dir` is None); a finished build
    leaves a marker file and is reused. Concurrent callers are serialised by a file lock, and a build goes into a
    scratch folder that is renamed into place, so nobody sees a half-written model.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny-model arch {arch!r}; known: {', '.join(ARCHS)}")
    root = Path(out_dir) if out_dir is not None else tiny_model_cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / arch
    if (target / _DONE).exists():
        return target
    with open(root / f".{arch}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _DONE).exists():
            return target
        scratch = Path(tempfile.mkdtemp(prefix=f".{arch}-", dir=root))
        try:
            proc = subprocess.run(
                [python, str(BUILDER), str(scratch), arch],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
            )
            if proc.returncode != 0:
                raise RuntimeError(f"building tiny {arch} model failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
            (scratch / _DONE).write_text(arch + "\n")
            shutil.rmtree(target, ignore_errors=True)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target
