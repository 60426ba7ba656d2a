"""The parameters of every vLLM patch target of zoe's plugin, read from a vLLM source tree without importing it.

    python scripts/vllm_patch_signatures.py SOURCE [--commit COMMIT] [--out PATH]

SOURCE is a vLLM wheel (`pip download --no-deps vllm==X`), a folder holding the `vllm` package (site-packages),
or a vLLM git directory (with --commit: the files are read with `git show COMMIT:path`, so a bare mirror will do).
Prints JSON: {"source", "command", "targets": {target: [parameter, ...] or null when absent}, "matches": {kernel:
{platform: [verified release ranges whose patch targets all have exactly these parameters]}}}, the targets being
those of every patch spec the plugin builds for vLLM on every platform (`vllm_plugin.KERNEL_SPECS`), with the
engine functions each replacement calls (`PatchSpec.calls`). A signature match is necessary, not sufficient: a
release can keep a target's parameters and change what it does (vLLM 0.33's `TritonExperts.apply` kept its
parameters and gained a post-GEMM2 hook).
The parameters are in `inspect.signature`'s order, so they compare with a PatchSpec's `params` as the plugin's
own check does. A method is looked up in its class and, when the class does not define it, in the classes it
names as bases (in this module, imported by name, or as `module_alias.Class`); a function imported into the
target module is followed to its definition.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable

Reader = Callable[[str], "str | None"]
"""Source text of a repository-relative path such as `vllm/_custom_ops.py`, None when absent."""


def wheel_reader(path: Path) -> Reader:
    zf = zipfile.ZipFile(path)
    names = set(zf.namelist())
    return lambda rel: zf.read(rel).decode() if rel in names else None


def folder_reader(root: Path) -> Reader:
    return lambda rel: (root / rel).read_text() if (root / rel).is_file() else None


def git_reader(git_dir: Path, commit: str) -> Reader:
    def read(rel: str) -> str | None:
        out = subprocess.run(["git", "-C", str(git_dir), "show", f"{commit}:{rel}"], capture_output=True)
        return out.stdout.decode() if out.returncode == 0 else None

    return read


def _module_tree(read: Reader, module: str) -> tuple[ast.Module, bool] | None:
    """(parsed module, is a package __init__) or None."""
    rel = module.replace(".", "/")
    for path, is_pkg in ((f"{rel}.py", False), (f"{rel}/__init__.py", True)):
        text = read(path)
        if text is not None:
            return ast.parse(text), is_pkg
    return None


def _imported_from(tree: ast.Module, module: str, is_pkg: bool, name: str) -> tuple[str, str] | None:
    """(module, original name) that `name` is imported from in `tree`, or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = module if is_pkg else module.rpartition(".")[0]
                    for _ in range(max(node.level - 1, 0)):
                        base = base.rpartition(".")[0]
                    src = node.module if node.level == 0 else ".".join(p for p in (base, node.module) if p)
                    return src, alias.name
    return None


def _module_named(tree: ast.Module, module: str, is_pkg: bool, name: str) -> str | None:
    """The module that `name` is bound to in `tree` (`import a.b as name`, `from a import b as name`), or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name or (alias.asname is None and alias.name == name):
                    return alias.name
    src = _imported_from(tree, module, is_pkg, name)
    return None if src is None else f"{src[0]}.{src[1]}"


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    star = [a.vararg] if a.vararg else []
    stars = [a.kwarg] if a.kwarg else []
    return [x.arg for x in a.posonlyargs + a.args + star + a.kwonlyargs + stars]


def _find(read: Reader, module: str, path: list[str], hops: int = 8) -> list[str] | None:
    """Parameters of `path` (["f"] or ["Class", "method"]) in `module`, following imports and bases."""
    if hops == 0:
        return None
    found = _module_tree(read, module)
    if found is None:
        return None
    tree, is_pkg = found
    head = path[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head and len(path) == 1:
            return _params(node)
        if isinstance(node, ast.ClassDef) and node.name == head and len(path) == 2:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == path[1]:
                    return _params(item)
            for base in node.bases:  # an inherited method: the first base that defines it
                got = None
                if isinstance(base, ast.Name):
                    got = _find(read, module, [base.id, path[1]], hops - 1)
                elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):  # `mk.Base`
                    owner = _module_named(tree, module, is_pkg, base.value.id)
                    got = None if owner is None else _find(read, owner, [base.attr, path[1]], hops - 1)
                if got is not None:
                    return got
            return None
    src = _imported_from(tree, module, is_pkg, head)
    if src is None:
        return None
    return _find(read, src[0], [src[1], *path[1:]], hops - 1)


def target_params(read: Reader, target: str) -> list[str] | None:
    """Parameters of `module:attr.path`, or None when the target does not exist in the source."""
    module, _, attr = target.partition(":")
    return _find(read, module, attr.split("."))


def plugin_specs() -> dict[tuple[str, str], list]:
    """(kernel, platform) -> the plugin's vLLM PatchSpecs there (one set per verified release range)."""
    from zoe_kernels.integrations.report import KernelReporter
    from zoe_kernels.integrations.support import PLATFORMS
    from zoe_kernels.integrations.vllm_plugin import KERNEL_SPECS

    reporter = KernelReporter("vllm", "signatures", [], None)
    found = {(k, p): build(p, reporter) for k, build in KERNEL_SPECS.items() for p in PLATFORMS}
    return {key: specs for key, specs in found.items() if specs}


def matching_ranges(targets: dict[str, list[str] | None]) -> dict[str, dict[str, list[list[str]]]]:
    """kernel -> platform -> the verified release ranges whose every patch target has, in `targets`, exactly the
    parameters its wrapper was written for (the spec sets this source is indistinguishable from by signature)."""
    out: dict[str, dict[str, list[list[str]]]] = {}
    for (kernel, platform), specs in plugin_specs().items():
        by_range: dict[tuple[str, str], bool] = {}
        for s in specs:
            ok = all(targets.get(t) == list(params) for t, params in s.checked())
            by_range[s.versions] = by_range.get(s.versions, True) and ok
        out.setdefault(kernel, {})[platform] = [list(r) for r, ok in by_range.items() if ok]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", type=Path, help="a vLLM wheel, a folder holding the vllm package, or a git dir")
    ap.add_argument("--commit", help="with a git dir: the commit to read")
    ap.add_argument("--out", type=Path, help="write the JSON here instead of printing it")
    args = ap.parse_args(argv)
    if args.commit:
        read, source = git_reader(args.source, args.commit), f"vllm commit {args.commit}"
    elif args.source.suffix == ".whl":
        read, source = wheel_reader(args.source), args.source.name
    elif (args.source / "vllm").is_dir():
        read, source = folder_reader(args.source), str(args.source)
    else:
        ap.error(f"{args.source}: not a wheel, a folder holding vllm/, or a git dir with --commit")
    if read("vllm/__init__.py") is None:
        ap.error(f"{source}: no vllm/__init__.py there")
    names = {t for v in plugin_specs().values() for s in v for t, _ in s.checked()}
    targets = {t: target_params(read, t) for t in sorted(names)}
    data = {"source": source, "command": "python scripts/vllm_patch_signatures.py " + " ".join(argv or sys.argv[1:]),
            "targets": targets, "matches": matching_ranges(targets)}  # fmt: skip
    text = json.dumps(data, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
