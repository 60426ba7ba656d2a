"""Router overhead: zoe's router against sglang-router and smg, with the router on one core and a fast
backend (bench/router/fast_backend.py, no sleeps) plus the load generator (wrk) on the other.

Measures, per router (and "direct": the backend with no router, the baseline):
  - latency at concurrency 1 (wrk -c1 --latency): p50/p99, and added = router - direct;
  - saturation (wrk -c64): requests/s and router CPU per request (utime+stime of the router's process tree
    from /proc, over the run, divided by the requests wrk completed);
  - streaming on one reused keep-alive connection: for each event, the delay between the backend writing it
    (its timestamp) and the client receiving it; first event and last event, p50/p99.

    python bench/router/overhead.py --peer-python /tmp/peers/venv/bin/python --smg /tmp/peers/smg/bin/smg

Writes bench/router/overhead.json and overhead.png. Peers are installed only for the benchmark, by
`bash scripts/setup_peers.sh` (sglang-router 0.3.2 and smg 1.13.0 under /tmp/peers), and `apt-get install -y wrk`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zoe_cluster.bench.loopback import free_port, stop, wait_http  # noqa: F401  (other benches import them here)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = json.dumps({"model": "m", "prompt": "Say hello to the benchmark.", "max_tokens": 1})
STREAM_BODY = json.dumps({"model": "m", "prompt": "Say hello to the benchmark.", "max_tokens": 5, "stream": True})


def tree_cpu_s(pid: int) -> float:
    """utime+stime of pid and every descendant, seconds."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        rest = raw[raw.rindex(")") + 2 :].split()
        ppid = int(rest[1])
        children.setdefault(ppid, []).append(int(d))
        stats[int(d)] = (int(rest[11]) + int(rest[12])) / CLK_TCK
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo += children.get(p, [])
    return total


def spawn(argv: list[str], cpu: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", str(cpu), *argv], stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=REPO)


def _us(v: str, unit: str) -> float:
    return float(v) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


def run_wrk(url: str, conns: int, duration_s: float, cpu: int, script: Path) -> dict:
    cmd = ["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{conns}", f"-d{int(round(duration_s))}s", "--latency", "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    res: dict = {"cmd": shlex.join(cmd[3:])}
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if m:
            res[f"p{pct}_us"] = _us(m.group(1), m.group(2))
    m = re.search(r"(\d+) requests in", out)
    res["requests"] = int(m.group(1)) if m else 0
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    res["rps"] = float(m.group(1)) if m else 0.0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", out)
    res["socket_errors"] = m.group(1) if m else ""
    return res


class StreamClient:
    """One keep-alive connection; sends streaming requests and timestamps each SSE event on arrival."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def _until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            self._read()
        head, self.buf = self.buf.split(sep, 1)
        return head

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._read()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def request(self, path: str, body: str) -> dict:
        b = body.encode()
        req = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(b)}\r\n\r\n").encode() + b
        t_send = time.time()
        self.sock.sendall(req)
        head = self._until(b"\r\n\r\n").decode("latin-1").lower()
        if " 200" not in head.split("\r\n", 1)[0]:
            raise RuntimeError(f"stream request failed: {head[:200]}")
        chunked = "transfer-encoding: chunked" in head
        m = re.search(r"content-length:\s*(\d+)", head)
        text, delays, t_first = "", [], None
        done = False
        while not done:
            if chunked:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    break
                data = self._exact(size)
                self._exact(2)
            else:
                data = self._exact(int(m.group(1))) if m else self._exact(len(self.buf) or 1)
                done = True
            now = time.time()
            text += data.decode()
            while "\n\n" in text:
                ev, text = text.split("\n\n", 1)
                payload = ev.removeprefix("data: ")
                if payload == "[DONE]":
                    continue
                obj = json.loads(payload)
                if "t" in obj:
                    delays.append((now - obj["t"]) * 1e6)
                    t_first = t_first or now
        return {"first_event_delay_us": delays[0], "last_event_delay_us": delays[-1],
                "first_event_after_send_ms": (t_first - t_send) * 1e3, "events": len(delays)}


def stream_probe(port: int, n: int) -> dict:
    c = StreamClient(port)
    rows = [c.request("/v1/completions", STREAM_BODY) for _ in range(n)]
    c.sock.close()
    out = {}
    for k in ("first_event_delay_us", "last_event_delay_us", "first_event_after_send_ms"):
        vals = sorted(r[k] for r in rows[2:])  # the first requests open connections
        out[k.replace("_us", "_p50_us").replace("_ms", "_p50_ms")] = statistics.median(vals)
        out[k.replace("_us", "_p99_us").replace("_ms", "_p99_ms")] = vals[min(len(vals) - 1, int(len(vals) * 0.99))]
    return out


def measure(name: str, bport: int, backend_url: str, args, script: Path, tmp: Path, progress, task) -> dict:
    proc = None
    if name == "direct":
        port = bport
    else:
        port = free_port()
        proc = spawn(router_argv(name, port, backend_url, args), args.router_cpu, tmp / f"{name}.log")
        wait_http(f"http://127.0.0.1:{port}/health")
        time.sleep(1.0)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        run_wrk(url, 4, 2, args.load_cpu, script)  # warm-up
        progress.update(task, advance=1)
        c1 = run_wrk(url, 1, args.duration, args.load_cpu, script)
        progress.update(task, advance=1)
        cpu0 = tree_cpu_s(proc.pid) if proc else 0.0
        sat = run_wrk(url, args.conns, args.duration, args.load_cpu, script)
        cpu1 = tree_cpu_s(proc.pid) if proc else 0.0
        if proc and sat["requests"]:
            sat["router_cpu_per_request_us"] = (cpu1 - cpu0) / sat["requests"] * 1e6
        progress.update(task, advance=1)
        st = stream_probe(port, args.streams)
        progress.update(task, advance=1)
    finally:
        if proc:
            stop(proc)
    return {"concurrency_1": c1, "saturation": sat, "streaming": st}


def median_of(rounds: list[dict]) -> dict:
    """Per-number median over rounds (same nested keys)."""
    out: dict = {}
    for key, val in rounds[0].items():
        if isinstance(val, dict):
            out[key] = median_of([r[key] for r in rounds])
        elif isinstance(val, (int, float)) and not isinstance(val, bool):
            out[key] = statistics.median(r[key] for r in rounds if key in r)
        else:
            out[key] = val
    return out


def router_argv(name: str, port: int, backend: str, args) -> list[str]:
    if name == "zoe":
        return [sys.executable, "-m", "zoe_cluster.cli.main", "router", "--replica", backend, "--port", str(port),
                "--model", "m", "--policy", "prefix"]
    if name == "sglang-router":
        return [args.peer_python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                "--worker-urls", backend, "--policy", "cache_aware", "--log-level", "warn",
                "--prometheus-port", str(free_port())]  # its default 29000 may be taken
    if name == "smg":
        return [args.smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", backend,
                "--policy", "cache_aware", "--log-level", "warn", "--prometheus-port", str(free_port())]
    raise ValueError(name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routers", default="zoe,sglang-router,smg")
    ap.add_argument("--peer-python", default="/tmp/peers/venv/bin/python")
    ap.add_argument("--smg", default="/tmp/peers/smg/bin/smg")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per wrk run")
    ap.add_argument("--conns", type=int, default=64, help="wrk connections at saturation")
    ap.add_argument("--streams", type=int, default=200, help="streamed requests per router")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    ap.add_argument("--router-cpu", type=int, default=0)
    ap.add_argument("--load-cpu", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "overhead.json"))
    args = ap.parse_args()

    from rich.progress import Progress

    names = ["direct", *[n for n in args.routers.split(",") if n]]
    tmp = Path(tempfile.mkdtemp(prefix="zoe-overhead-"))
    script = tmp / "post.lua"
    script.write_text(f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['Content-Type'] = 'application/json'\n")
    bport = free_port()
    backend_url = f"http://127.0.0.1:{bport}"
    backend = spawn([sys.executable, str(HERE / "fast_backend.py"), "--port", str(bport), "--events", "5",
                     "--gap-ms", "10"], args.load_cpu, tmp / "backend.log")
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    try:
        wait_http(backend_url + "/health")
        with Progress() as progress:
            task = progress.add_task("routers", total=len(names) * 4 * args.rounds)
            for rnd in range(args.rounds):  # interleaved rounds: a noisy neighbour hits every router alike
                for name in names:
                    progress.update(task, description=f"round {rnd + 1}: {name}")
                    rounds[name].append(measure(name, bport, backend_url, args, script, tmp, progress, task))
    finally:
        stop(backend)
    results = {name: {**median_of(rs), "rounds": rs} for name, rs in rounds.items()}
    base = results["direct"]
    for name, r in results.items():
        if name != "direct":
            r["added_latency_p50_us"] = r["concurrency_1"]["p50_us"] - base["concurrency_1"]["p50_us"]
            r["added_latency_p99_us"] = r["concurrency_1"]["p99_us"] - base["concurrency_1"]["p99_us"]
            r["stream_first_event_added_p50_us"] = (r["streaming"]["first_event_delay_p50_us"]
                                                    - base["streaming"]["first_event_delay_p50_us"])
    versions = {}
    for pkg, argv in (("sglang-router", [args.peer_python, "-m", "pip", "show", "sglang-router"]),
                      ("smg", [args.smg, "--version"])):  # smg has its own venv (scripts/setup_peers.sh)
        try:
            out = subprocess.run(argv, capture_output=True, text=True).stdout
            versions[pkg] = re.search(r"(?:Version:|smg) (\S+)", out).group(1)  # pip show; smg --version
        except Exception:  # noqa: BLE001  a peer not installed: no version
            pass
    doc = {
        "command": "python " + shlex.join([str(Path(sys.argv[0]).relative_to(REPO)) if Path(sys.argv[0]).is_absolute()
                                           else sys.argv[0], *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_at_end": os.getloadavg()},
        "setup": {"router_cpu": args.router_cpu, "load_cpu": args.load_cpu, "backend": "bench/router/fast_backend.py",
                  "wrk_duration_s": args.duration, "saturation_conns": args.conns, "stream_events": 5,
                  "stream_gap_ms": 10, "streams": args.streams, "rounds": args.rounds,
                  "aggregation": "median over interleaved rounds of each number"},
        "peer_versions": versions,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, Path(args.out).with_suffix(".png"))
    for name, r in results.items():
        print(name, json.dumps({k: v for k, v in r.items() if not isinstance(v, dict)}),
              "rps", r["saturation"]["rps"], "cpu/req", r["saturation"].get("router_cpu_per_request_us"),
              "first-event p50 us", round(r["streaming"]["first_event_delay_p50_us"]))


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = {k: v for k, v in doc["results"].items() if k != "direct"}
    names = list(res)
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    panels = [
        ("added latency, concurrency 1 (us)", [res[n]["added_latency_p50_us"] for n in names],
         [res[n]["added_latency_p99_us"] for n in names], ("p50", "p99")),
        ("router CPU per request at saturation (us)", [res[n]["saturation"].get("router_cpu_per_request_us", 0)
                                                       for n in names], None, None),
        ("requests/s at saturation (router on 1 core)", [res[n]["saturation"]["rps"] for n in names], None, None),
        ("streamed event delay, reused connection (ms)",
         [res[n]["streaming"]["first_event_delay_p50_us"] / 1e3 for n in names],
         [res[n]["streaming"]["last_event_delay_p50_us"] / 1e3 for n in names], ("first event p50", "last event p50")),
    ]
    for ax, (title, a, b, labels) in zip(axes, panels):
        x = range(len(names))
        if b is None:
            ax.bar(x, a, color="tab:blue")
        else:
            ax.bar([i - 0.2 for i in x], a, width=0.4, label=labels[0])
            ax.bar([i + 0.2 for i in x], b, width=0.4, label=labels[1])
            ax.legend(fontsize=8)
        ax.set_xticks(list(x), names)
        ax.set_title(title, fontsize=9)
        if b is not None:
            ax.set_yscale("log")  # p50 and p99 (first and last event) differ by orders of magnitude
    fig.suptitle(f"router overhead ({doc['machine']['cpus']} CPUs; router on cpu {doc['setup']['router_cpu']}, "
                 f"backend + wrk on cpu {doc['setup']['load_cpu']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
