"""No module of zoe_cluster imports, directly or through others, a module that imports it back.

Every import counts, at module level or inside a function (a deferred import is still a dependency; it only
hides the cycle until the function runs), except those under `if TYPE_CHECKING:`, which never run. The graph is
read from the source with `ast`, so the test imports nothing of zoe_cluster and sees modules whose optional
dependencies are absent here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zoe_cluster"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The zoe_cluster modules `module` imports at run time (a `from pkg import sub` names the submodule)."""
    out: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                pending.extend(child.orelse)
                continue
            pending.append(child)
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (child.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in known]
                out.update(subs if subs else [base])
    return {m for m in out if m in known and m != module}


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    return {m: _imports(ast.parse(p.read_text(), str(p)), m, p.name == "__init__.py", known)
            for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert "zoe_cluster.cluster.controller" in graph
    assert "zoe_cluster.cluster.spec" in graph["zoe_cluster.cluster.controller"]


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_type_checking_imports_do_not_count():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import B\nimport p.c\n")
    assert _imports(tree, "p.a", False, {"p.a", "p.b", "p.c"}) == {"p.c"}


@pytest.mark.parametrize("graph", [import_graph()], ids=["zoe_cluster"])
def test_no_import_cycle_in_zoe_cluster(graph):
    found = cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found)
    assert not found, f"import cycles in zoe_cluster:\n{detail}"
