"""The SGLang hook: routes SGLang's DeepSeek-V4 CSA top-K and decode attention to zoe_kernels when `ZOE_KERNELS`
asks for it.

SGLang (0.5.19 and 0.5.23) has a general-plugin mechanism: it calls every `sglang.srt.plugins` entry point early in each
of its processes (engine, scheduler/TP workers, detokenizer, DP controller: `sglang.srt.plugins.load_plugins`).
zoe's entry point is `zoe_kernels = zoe_kernels.integrations.sglang_hook:register`, so no `.pth` or
sitecustomize is needed. Without `ZOE_KERNELS` it does nothing.

What is patched (checked against the SGLang version and each function's parameters, all or nothing):
- `csa_topk`: the DeepSeek-V4 C4 indexer's paged top-k, `topk_transform_paged` and `topk_transform_paged_v2`
  (0.5.23; `topk_transform_512` and `topk_transform_512_v2` in 0.5.19, whose v2 has no `out_raw_indices`)
  as `sglang.srt.layers.attention.dsv4.indexer` calls them: the top 512 of each request's float32
  compressed-entry scores (`zoe_kernels.csa.topk`), then SGLang's page-table transform
  (`slot = page_table[pos // page_size] * page_size + pos % page_size`, -1 where fewer than 512 entries).
  bf16 scores keep SGLang's DeepSelect path (SGLang routes them elsewhere before these functions).
- `csa_dual_scope`: DeepSeek-V4's sparse decode attention (FlashMLA's `flash_mla_with_kvcache` on CUDA, the
  HIP entry point on ROCm) over the packed FP8 paged pools, through zoe's paged kernel
  (`zoe_kernels.csa.paged_dual_scope`, which reads the pool pages itself); see `sglang_dual_scope`.
- `fused_moe`, `lightning_indexer`: zoe's recipes serve the models that use them on vLLM; on SGLang they
  are recorded as `unsupported` fallbacks.
"""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path
from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec, install_kernel
from zoe_kernels.integrations.report import REPORT_DIR_ENV, KernelReporter, ReportCollector, log, requested_kernels
from zoe_kernels.integrations.sglang_dual_scope import csa_dual_scope_specs, sglang_platform
from zoe_kernels.integrations.support import SGLANG_0519, SGLANG_0523, engine_span, ranges

SGLANG_VERSIONS = engine_span("sglang")
"""The span of SGLang releases the hook was verified on (per kernel and platform: `support.SUPPORT`)."""
INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
TOPK_V1_PARAMS = ("scores", "seq_lens", "page_tables", "out_page_indices", "page_size", "out_raw_indices")
TOPK_V2_PARAMS = ("scores", "seq_lens", "page_tables", "out_page_indices", "page_size", "metadata",
                  "out_raw_indices")  # fmt: skip
TOPK_V2_PARAMS_0519 = TOPK_V2_PARAMS[:-1]
TOPK_TARGETS = {
    SGLANG_0519: (f"{INDEXER}:topk_transform_512", f"{INDEXER}:topk_transform_512_v2", TOPK_V2_PARAMS_0519),
    SGLANG_0523: (f"{INDEXER}:topk_transform_paged", f"{INDEXER}:topk_transform_paged_v2", TOPK_V2_PARAMS),
}
"""Per verified release range: the indexer's two paged top-K functions (renamed from `topk_transform_512*`
between 0.5.19 and 0.5.23, when v2 also gained `out_raw_indices`) and v2's parameters."""
UNSUPPORTED = {
    "fused_moe": "no SGLang integration: zoe's recipes run the fused-MoE models on vLLM",
    "lightning_indexer": "no SGLang integration: zoe's recipes run the DSA models on vLLM",
}


def paged_topk(topk: Callable, scores, seq_lens, page_tables, out_page_indices, page_size: int, out_raw_indices):
    """zoe's top-K of each row's first seq_lens[b] scores, written the way SGLang's kernels write it."""
    import torch

    k = out_page_indices.shape[1]
    raw = topk(scores, seq_lens, k)  # int32 [B, k], positions ascending, -1 padded
    if page_tables is None:
        out_page_indices.copy_(raw)
    else:
        pos = raw.clamp(min=0).long()
        phys = torch.gather(page_tables.long(), 1, pos // page_size)
        slots = (phys * page_size + pos % page_size).masked_fill(raw < 0, -1)
        out_page_indices.copy_(slots.to(out_page_indices.dtype))
    if out_raw_indices is not None:
        out_raw_indices.copy_(raw)


def _csa_topk_specs(reporter: KernelReporter, platform: str | None = None) -> list[PatchSpec]:
    """The top-K patches, one set per verified release range for `platform` (default: this process's)."""
    from zoe_kernels.csa.topk import topk

    def zoe_ok(scores) -> bool:
        import torch

        return scores.dtype == torch.float32 and scores.dim() == 2

    def wrap_v1(original: Callable) -> Callable:
        def topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
            if zoe_ok(scores):
                paged_topk(topk, scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
                reporter.count("csa_topk", "zoe")
                return None
            reporter.count("csa_topk", "engine", "dtype")
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)

        return topk_transform_paged

    def wrap_v2(original: Callable) -> Callable:
        def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                    out_raw_indices=None):  # fmt: skip
            if zoe_ok(scores):  # zoe needs no routing plan: `metadata` is SGLang's, unused here
                paged_topk(topk, scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
                reporter.count("csa_topk", "zoe")
                return None
            reporter.count("csa_topk", "engine", "dtype")
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, out_raw_indices)

        return topk_transform_paged_v2

    def wrap_v2_0519(original: Callable) -> Callable:
        def topk_transform_512_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata):
            if zoe_ok(scores):
                paged_topk(topk, scores, seq_lens, page_tables, out_page_indices, page_size, None)
                reporter.count("csa_topk", "zoe")
                return None
            reporter.count("csa_topk", "engine", "dtype")
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata)

        return topk_transform_512_v2

    specs = []
    for versions in ranges("csa_topk", "sglang", platform or sglang_platform()):
        v1, v2, v2_params = TOPK_TARGETS[versions]
        specs += [
            PatchSpec("csa_topk", v1, TOPK_V1_PARAMS, versions, wrap_v1),
            PatchSpec("csa_topk", v2, v2_params, versions, wrap_v2 if v2_params == TOPK_V2_PARAMS else wrap_v2_0519),
        ]
    return specs


KERNEL_SPECS: dict[str, Callable[[KernelReporter], list[PatchSpec]]] = {
    "csa_topk": _csa_topk_specs,
    "csa_dual_scope": csa_dual_scope_specs,
}


def source_params(target: str, package_dir: str | Path) -> tuple[str, ...] | None:
    """The parameters of `target` read from the installed source (no import), or None if it is absent.

    For a function imported by name into the target module (`from x import f`), this follows the import
    to the module that defines it. Used where SGLang cannot be imported (its CUDA dependencies missing)."""
    module, _, name = target.partition(":")
    root = Path(package_dir).parent
    for _ in range(4):  # follow up to a few re-exports
        rel = Path(*module.split("."))
        path = next((p for p in (root / rel.with_suffix(".py"), root / rel / "__init__.py") if p.exists()), None)
        if path is None:
            return None
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                a = node.args
                star = [a.vararg] if a.vararg else []
                stars = [a.kwarg] if a.kwarg else []  # in inspect.signature's order
                return tuple(x.arg for x in a.posonlyargs + a.args + star + a.kwonlyargs + stars)
        nxt = None
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any((al.asname or al.name) == name for al in node.names):
                base = module if path.name == "__init__.py" else module.rpartition(".")[0]
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                nxt = node.module if node.level == 0 else ".".join(p for p in (base, node.module) if p)
                break
        if nxt is None:
            return None
        module = nxt
    return None


def sglang_version() -> str:
    import sglang

    return str(getattr(sglang, "__version__", "unknown"))


def patch_sglang(kernels: list[str], reporter: KernelReporter, version: str) -> list[str]:
    patched = []
    for kernel in kernels:
        builder = KERNEL_SPECS.get(kernel)
        if builder is None:
            known = kernel in UNSUPPORTED
            reporter.fallback(kernel, "-", "unsupported" if known else "unknown_kernel",
                              UNSUPPORTED.get(kernel, f"zoe has no kernel named {kernel!r}"))  # fmt: skip
            continue
        try:
            specs = builder(reporter)
        except ImportError as e:
            reporter.fallback(kernel, "zoe_kernels", "kernel_unavailable", f"{type(e).__name__}: {e}")
            continue
        if install_kernel(kernel, specs, "sglang", version, reporter, sglang_platform()):
            patched.append(kernel)
    return patched


def register() -> None:
    """Entry point `sglang.srt.plugins: zoe_kernels`."""
    kernels = requested_kernels()
    if not kernels:
        return
    folder = os.environ.get(REPORT_DIR_ENV)
    if not folder:
        folder = tempfile.mkdtemp(prefix="zoe-kernels-")
        os.environ[REPORT_DIR_ENV] = folder
    version = sglang_version()
    reporter = KernelReporter("sglang", version, kernels, folder)
    try:
        patched = patch_sglang(kernels, reporter, version)
    except Exception as e:  # never take SGLang down: it serves on its own kernels
        log.exception("SGLang hook failed; SGLang keeps its own kernels")
        for k in kernels:
            if k not in reporter.report.patched:
                reporter.fallback(k, "-", "plugin_error", f"{type(e).__name__}: {e}")
        patched = []
    try:
        from prometheus_client import REGISTRY

        REGISTRY.register(ReportCollector(folder))
    except (ImportError, ValueError):
        pass
    reporter.flush()
    log.info("SGLang %s process %d runs zoe kernels %s (asked for %s; report in %s)",
             version, os.getpid(), patched, kernels, folder)  # fmt: skip
