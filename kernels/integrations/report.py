"""What the zoe plugin inside an engine process actually did: kernels patched, fallbacks, call counts.

Every engine process that loads the zoe plugin (vLLM's API server, engine core and workers; SGLang's
scheduler and detokenizer processes) writes one JSON file, `<engine>-<pid>.json`, into
`$ZOE_KERNELS_REPORT_DIR` (one folder per replica). The cluster code reads them with `read_reports(dir)` and
`summarize(reports)`; the same numbers reach the engine's /metrics through `ReportCollector`:

    zoe_kernel_active{kernel}                1 when some live process patched the kernel and none fell back
    zoe_kernel_fallback_total{kernel,reason} processes that fell back to the engine's own path, by reason
    zoe_kernel_calls_total{kernel,path}      calls the patched entry points routed to zoe ("zoe") or to the
                                             engine's own implementation ("engine"), e.g. above the crossover

A report is written when the plugin finishes patching and then at most once per `flush_interval_s` while
calls are counted (from a daemon thread), so counting a call costs a dict increment.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

KERNELS_ENV = "ZOE_KERNELS"
REPORT_DIR_ENV = "ZOE_KERNELS_REPORT_DIR"
REPORT_SCHEMA_VERSION = 1

log = logging.getLogger("zoe_kernels.integrations")

FALLBACK_REASONS = {
    "engine_version": "the engine's version is outside the range the patch was verified against",
    "signature": "the replaced function's parameters differ from the ones the patch was written for",
    "missing_target": "the module, class or function to replace does not exist in this engine",
    "kernel_unavailable": "zoe_kernels cannot provide the kernel here (module missing or import failed)",
    "unsupported": "the kernel has no integration for this engine or platform",
    "unknown_kernel": "ZOE_KERNELS names a kernel zoe does not have",
    "plugin_error": "the plugin itself raised while patching (a bug in zoe: see the engine log)",
    "engine_backend": "the engine built its MoE with a backend zoe does not patch (vLLM: use --moe-backend triton)",
    "runtime_error": "zoe's kernel raised while serving; the process went back to the engine's path",
}


def _ensure_handler() -> None:
    """Engines configure their own loggers, not ours: give ours a stderr handler so INFO lines show too."""
    if not log.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(levelname)s zoe_kernels[%(process)d] %(message)s"))
        log.addHandler(h)
        log.setLevel(logging.INFO)
        log.propagate = False


def requested_kernels(env: dict[str, str] | None = None) -> list[str]:
    """The kernels `ZOE_KERNELS` asks for, in order, without blanks or repeats."""
    raw = (env if env is not None else os.environ).get(KERNELS_ENV, "")
    out: list[str] = []
    for name in raw.split(","):
        name = name.strip()
        if name and name not in out:
            out.append(name)
    return out


@dataclass
class ProcessReport:
    """One engine process's report (the JSON file's content)."""

    engine: str
    engine_version: str
    pid: int
    host: str
    process: str
    """The process's role as far as the plugin can tell (its title or argv[0])."""
    started_at: float
    updated_at: float
    requested: list[str]
    patched: dict[str, dict] = field(default_factory=dict)
    """kernel -> {"targets": [dotted names replaced], "impl": what runs on zoe's path}."""
    fallbacks: list[dict] = field(default_factory=list)
    """[{"kernel", "target", "reason", "detail"}]: patches not installed; the engine's own path runs instead."""
    calls: dict[str, dict[str, int]] = field(default_factory=dict)
    """kernel -> {"zoe": n, "engine": n}: what the patched entry points did per call."""
    engine_path_reasons: dict[str, dict[str, int]] = field(default_factory=dict)
    """kernel -> reason -> n: why calls went to the engine's own implementation (e.g. above_crossover)."""
    notes: list[str] = field(default_factory=list)
    """Changes the plugin made to the engine's own configuration to run zoe's kernels."""
    schema_version: int = REPORT_SCHEMA_VERSION

    @classmethod
    def from_dict(cls, d: dict) -> "ProcessReport":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


class KernelReporter:
    """Collects one process's report and writes it to the report folder (nothing is written without one)."""

    def __init__(
        self,
        engine: str,
        engine_version: str,
        requested: list[str],
        report_dir: str | Path | None,
        flush_interval_s: float = 1.0,
    ):
        _ensure_handler()
        now = time.time()
        self.report = ProcessReport(
            engine=engine,
            engine_version=engine_version,
            pid=os.getpid(),
            host=socket.gethostname(),
            process=_process_name(),
            started_at=now,
            updated_at=now,
            requested=list(requested),
        )
        self.report_dir = Path(report_dir) if report_dir else None
        self.flush_interval_s = flush_interval_s
        self.exporter = MultiprocessExporter.create()
        self._lock = threading.Lock()
        self._dirty = False  # set by count(); the flusher thread writes when it sees it
        self._flusher: threading.Thread | None = None
        # A forked child (vLLM's engine core on some platforms) inherits the patches but not the plugin
        # load, so it must start its own report instead of overwriting its parent's.
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    # -- recording -------------------------------------------------------------------------------------
    def patched(self, kernel: str, target: str, impl: str) -> None:
        entry = self.report.patched.setdefault(kernel, {"targets": [], "impl": impl})
        if target not in entry["targets"]:
            entry["targets"].append(target)
        entry["impl"] = impl
        log.info("%s patched in at %s (impl: %s)", kernel, target, impl)
        if self.exporter:
            self.exporter.active(kernel, True)
        self.flush()

    def fallback(self, kernel: str, target: str, reason: str, detail: str = "") -> None:
        """A patch that was NOT installed: log it loudly, drop the kernel from `patched`, record why.

        `reason` is a short code (a metric label: see FALLBACK_REASONS); `detail` says what exactly differed."""
        self.report.fallbacks.append({"kernel": kernel, "target": target, "reason": reason, "detail": detail})
        self.report.patched.pop(kernel, None)
        log.warning(
            "FALLBACK: %s stays on %s's own path at %s (%s): %s",
            kernel, self.report.engine, target, reason, detail,
        )  # fmt: skip
        if self.exporter:
            self.exporter.active(kernel, False)
            self.exporter.fallback(kernel, reason)
        self.flush()

    def note(self, text: str) -> None:
        """A change the plugin made to the engine's behaviour: logged as a WARNING and kept in the report."""
        self.report.notes.append(text)
        log.warning("%s", text)

    def count(self, kernel: str, path: str, reason: str | None = None) -> None:
        """One call of a patched entry point went to `path` ("zoe" or "engine")."""
        if self.report.pid != os.getpid():
            self._after_fork()
        calls = self.report.calls.setdefault(kernel, {"zoe": 0, "engine": 0})
        calls[path] = calls.get(path, 0) + 1
        if reason is not None:
            reasons = self.report.engine_path_reasons.setdefault(kernel, {})
            reasons[reason] = reasons.get(reason, 0) + 1
        if self.exporter:
            self.exporter.call(kernel, path)
        self._dirty = True
        if self._flusher is None and self.report_dir is not None:
            self._start_flusher()

    # -- writing ---------------------------------------------------------------------------------------
    def path(self) -> Path | None:
        if self.report_dir is None:
            return None
        return self.report_dir / f"{self.report.engine}-{self.report.pid}.json"

    def flush(self) -> None:
        """Write the report now (atomically: a reader never sees half a file)."""
        target = self.path()
        if target is None:
            return
        with self._lock:
            self._dirty = False
            self.report.updated_at = time.time()
            self.report.process = _process_name()  # engines retitle their processes after start-up
            try:
                text = json.dumps(asdict(self.report), indent=1, sort_keys=True)
            except RuntimeError:  # count() added a key while the flusher copied: write on the next tick
                self._dirty = True
                return
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_text(text)
                os.replace(tmp, target)
            except OSError as e:  # the engine must keep serving even if the report folder is gone
                log.warning("cannot write kernel report %s: %s", target, e)

    def _start_flusher(self) -> None:
        def loop() -> None:
            while True:
                time.sleep(self.flush_interval_s)
                if self._dirty:
                    self.flush()

        self._flusher = threading.Thread(target=loop, name="zoe-kernel-report", daemon=True)
        self._flusher.start()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._flusher = None
        r = self.report
        r.pid, r.process, r.started_at = os.getpid(), _process_name(), time.time()
        r.calls, r.engine_path_reasons = {}, {}
        self._dirty = True


def _process_name() -> str:
    try:
        import setproctitle  # vLLM and SGLang name their processes (VLLM::EngineCore, sglang::scheduler)

        title = setproctitle.getproctitle()
        if title:
            return title.split()[0]
    except Exception:
        pass
    import sys

    return Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"


# -- reading (the cluster side) ---------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_reports(report_dir: str | Path, live_only: bool = False) -> list[ProcessReport]:
    """All process reports in `report_dir`, oldest first; unreadable files are skipped with a warning.

    `live_only` keeps the reports of processes still running on this host (the engine's own /metrics
    uses it, so reports of an earlier run in the same folder do not count)."""
    out = []
    here = socket.gethostname()
    folder = Path(report_dir)
    if not folder.is_dir():
        return []
    for p in sorted(folder.glob("*.json")):
        try:
            rep = ProcessReport.from_dict(json.loads(p.read_text()))
        except (OSError, ValueError, TypeError) as e:
            log.warning("skipping unreadable kernel report %s: %s", p, e)
            continue
        if live_only and rep.host == here and not _alive(rep.pid):
            continue
        out.append(rep)
    return sorted(out, key=lambda r: r.started_at)


@dataclass(frozen=True)
class ReplicaKernels:
    """What one replica's processes report together: the answer `zoe status` shows."""

    active: tuple[str, ...]
    """Kernels patched in by at least one process and fallen back in none."""
    requested: tuple[str, ...]
    fallbacks: dict[str, list[str]]
    """kernel -> distinct reasons some process stayed on the engine's own path."""
    calls: dict[str, dict[str, int]]
    """kernel -> {"zoe": n, "engine": n} summed over processes."""
    engine_versions: tuple[str, ...]
    processes: int

    def describe(self) -> str:
        """One line for `zoe status`: each requested kernel with what actually happened to it."""
        if not self.requested:
            return "none requested"
        parts = []
        for kernel in self.requested:
            calls = self.calls.get(kernel, {})
            counts = f" (zoe {calls.get('zoe', 0)}, engine {calls.get('engine', 0)} calls)" if calls else ""
            if kernel in self.active:
                parts.append(f"{kernel}: on{counts}")
            else:
                parts.append(f"{kernel}: OFF ({', '.join(self.fallbacks.get(kernel, ['not reported']))}){counts}")
        return "; ".join(parts)


def summarize(reports: list[ProcessReport]) -> ReplicaKernels:
    requested: list[str] = []
    patched: set[str] = set()
    fallbacks: dict[str, list[str]] = {}
    calls: dict[str, dict[str, int]] = {}
    versions: set[str] = set()
    for r in reports:
        versions.add(f"{r.engine} {r.engine_version}")
        requested += [k for k in r.requested if k not in requested]
        patched |= set(r.patched)
        for fb in r.fallbacks:
            reasons = fallbacks.setdefault(fb["kernel"], [])
            if fb["reason"] not in reasons:
                reasons.append(fb["reason"])
        for kernel, by_path in r.calls.items():
            acc = calls.setdefault(kernel, {"zoe": 0, "engine": 0})
            for path, n in by_path.items():
                acc[path] = acc.get(path, 0) + n
    active = tuple(k for k in requested if k in patched and k not in fallbacks)
    return ReplicaKernels(active, tuple(requested), fallbacks, calls, tuple(sorted(versions)), len(reports))


class MultiprocessExporter:
    """The same metrics as `ReportCollector`, for engines that serve prometheus_client's multiprocess
    registry (`PROMETHEUS_MULTIPROC_DIR`: SGLang with --enable-metrics, vLLM with several API servers).

    There /metrics aggregates the metric files every process writes, not the default registry, so each
    process that loaded the hook writes its own values: `zoe_kernel_active` is the minimum over live
    processes (0 as soon as one fell back), the counters are summed."""

    def __init__(self):
        from prometheus_client import Counter, Gauge

        self._active = Gauge("zoe_kernel_active", "1 when the zoe plugin patched this kernel into the engine",
                             ["kernel"], multiprocess_mode="livemin", registry=None)  # fmt: skip
        self._fallback = Counter("zoe_kernel_fallback", "Engine processes that kept their own path for a kernel",
                                 ["kernel", "reason"], registry=None)  # fmt: skip
        self._calls = Counter("zoe_kernel_calls", "Calls of patched entry points by the path taken",
                              ["kernel", "path"], registry=None)  # fmt: skip
        self._children: dict[tuple[str, str], object] = {}

    @classmethod
    def create(cls) -> "MultiprocessExporter | None":
        """An exporter when this process writes multiprocess metrics, else None."""
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return None
        try:
            from prometheus_client import values

            if values.ValueClass is values.MutexValue:  # prometheus_client loaded before the variable was set
                return None
            return cls()
        except Exception as e:  # metrics are a report channel, never a reason to fail the engine
            log.warning("multiprocess kernel metrics unavailable: %s", e)
            return None

    def active(self, kernel: str, on: bool) -> None:
        self._active.labels(kernel).set(1.0 if on else 0.0)

    def fallback(self, kernel: str, reason: str) -> None:
        self._fallback.labels(kernel, reason).inc()

    def call(self, kernel: str, path: str) -> None:
        child = self._children.get((kernel, path))
        if child is None:
            child = self._children[(kernel, path)] = self._calls.labels(kernel, path)
        child.inc()  # type: ignore[attr-defined]


class ReportCollector:
    """A prometheus_client collector that exports a replica's reports (read from its folder per scrape)."""

    def __init__(self, report_dir: str | Path):
        self.report_dir = Path(report_dir)

    def describe(self):
        """The metric names (no samples), so a second registration in one process is refused."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        return [
            GaugeMetricFamily("zoe_kernel_active", "", labels=["kernel"]),
            CounterMetricFamily("zoe_kernel_fallback", "", labels=["kernel", "reason"]),
            CounterMetricFamily("zoe_kernel_calls", "", labels=["kernel", "path"]),
        ]

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        reports = read_reports(self.report_dir, live_only=True)
        active = GaugeMetricFamily(
            "zoe_kernel_active", "1 when the zoe plugin patched this kernel into the engine", labels=["kernel"]
        )
        fallback = CounterMetricFamily(
            "zoe_kernel_fallback", "Engine processes that kept their own path for a kernel, by reason",
            labels=["kernel", "reason"],
        )  # fmt: skip
        calls = CounterMetricFamily(
            "zoe_kernel_calls", "Calls of patched entry points by the path taken (zoe or engine)",
            labels=["kernel", "path"],
        )  # fmt: skip
        summary = summarize(reports)
        for kernel in summary.requested:
            active.add_metric([kernel], 1.0 if kernel in summary.active else 0.0)
        counts: dict[tuple[str, str], int] = {}
        for r in reports:
            for fb in r.fallbacks:
                key = (fb["kernel"], fb["reason"])
                counts[key] = counts.get(key, 0) + 1
        for (kernel, reason), n in sorted(counts.items()):
            fallback.add_metric([kernel, reason], float(n))
        for kernel, by_path in sorted(summary.calls.items()):
            for path, n in sorted(by_path.items()):
                calls.add_metric([kernel, path], float(n))
        return [active, fallback, calls]
