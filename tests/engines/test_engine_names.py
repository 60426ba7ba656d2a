"""No module outside `zoe_cluster.engines` decides by an engine's name: it asks the engine's adapter.

The source of every module of `zoe_cluster` is read with `ast` and searched for a decision keyed on an engine-name
string literal (one of `ENGINE_NAMES`): a comparison (`engine == "sim"`, `engine in ("vllm", "sglang")`), a
`match` case, a `startswith`/`endswith` test, or a dict literal keyed by two or more engine names (a dispatch table).
Exempt: `engines/` (where each adapter states its own name) and `recipes/schema.py` (whose variant union is tagged
by the engine a variant is written for). Comparing two engine values (`v.engine == engine`) is not a name written
down twice and is allowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from zoe_cluster.engines import ENGINE_NAMES

PACKAGE = Path(__file__).resolve().parents[2] / "zoe_cluster"
EXEMPT = (PACKAGE / "engines", PACKAGE / "recipes" / "schema.py")


def _names_in(node: ast.AST) -> list[str]:
    """Engine names written as string literals in `node` itself or in a tuple/list/set literal it is."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in items if isinstance(e, ast.Constant) and e.value in ENGINE_NAMES]


def name_decisions(source: str) -> list[tuple[int, str]]:
    """(line, engine name) of every decision in `source` keyed on an engine-name literal."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Compare):
            names = [n for side in (node.left, *node.comparators) for n in _names_in(side)]
        elif isinstance(node, ast.MatchValue):
            names = _names_in(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith"):
            names = [n for a in node.args for n in _names_in(a)]
        elif isinstance(node, ast.Dict):
            keys = [n for k in node.keys if k is not None for n in _names_in(k)]
            names = keys if len(keys) >= 2 else []
        found += [(node.lineno, n) for n in names]
    return sorted(found, key=lambda f: f[0])


def test_the_detector_finds_each_kind_of_name_decision():
    source = """
if engine == "sim": pass
if "vllm" != e.engine: pass
ok = engine in ("vllm", "sglang")
match engine:
    case "sglang": pass
flag = url.startswith("sim")
parsers = {"vllm": parse_a, "sglang": parse_b}
same = v.engine == engine
label = {"vllm": 1, "other": 2}
"""
    assert name_decisions(source) == [(2, "sim"), (3, "vllm"), (4, "vllm"), (4, "sglang"), (6, "sglang"),
                                      (7, "sim"), (8, "vllm"), (8, "sglang")]


def test_no_module_outside_engines_decides_by_an_engine_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path == e or e in path.parents for e in EXEMPT):
            continue
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{line}: compares to engine name {name!r} (ask the "
                      f"adapter: zoe_cluster.engines.get_adapter)" for line, name in name_decisions(path.read_text())]
    assert not offenders, "\n".join(offenders)
