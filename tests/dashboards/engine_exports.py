"""Metric names the real engines export, read from their installed packages' source, and how Prometheus stores them.

vLLM and SGLang build their metrics with prometheus_client constructors (`Gauge(name="vllm:...")`,
`self._counter_cls(name="vllm:prefix_cache_hits", ...)`); every such call with a literal name is read from the
package's source with `ast`, without importing the engine. prometheus_client then exposes a counter as
`<name without _total>_total` and a histogram as `_bucket`, `_sum` and `_count` series.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

KINDS = ("counter", "gauge", "histogram", "summary")
# Names Prometheus 2.x stores as exposed; any other character is escaped to `_` (measured on 2.42:
# `vllm:num_requests_running` is stored with its colon).
_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def package_dir(python: str, package: str) -> Path:
    """Where `package` is installed for the interpreter `python` (found without importing it)."""
    code = f"import importlib.util; print(importlib.util.find_spec({package!r}).submodule_search_locations[0])"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return Path(out.stdout.strip())


def _literal_name(call: ast.Call) -> str | None:
    node = next((kw.value for kw in call.keywords if kw.arg == "name"), call.args[0] if call.args else None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def constructed_metrics(root: Path, prefix: str) -> dict[str, str]:
    """Metric name -> kind (counter, gauge, histogram, summary) for every constructor call under `root` whose
    literal name starts with `prefix`; the kind is read from the constructor's name (`Gauge`, `_gauge_cls`)."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if prefix not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:  # a file for another Python version: it defines no metric this engine runs with
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            kind = next((k for k in KINDS if k in callee.lower()), None)
            name = _literal_name(node) if kind else None
            if name and name.startswith(prefix):
                found[name] = kind
    return found


def exposed_samples(name: str, kind: str) -> set[str]:
    """The sample names prometheus_client exposes for one metric."""
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {name + s for s in ("_bucket", "_sum", "_count")}
    if kind == "summary":
        return {name, name + "_sum", name + "_count"}
    return {name}


def stored_as(name: str) -> str:
    """The name Prometheus stores a scraped sample under."""
    return name if _LEGACY_NAME.match(name) else re.sub(r"[^a-zA-Z0-9_:]", "_", name)


def engine_series(python: str, package: str, prefix: str) -> set[str]:
    """Every series name, as Prometheus stores it, that the engine installed for `python` can export."""
    metrics = constructed_metrics(package_dir(python, package), prefix)
    return {stored_as(s) for name, kind in metrics.items() for s in exposed_samples(name, kind)}
