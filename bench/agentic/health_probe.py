"""How long a simulated engine's /health waits while the engine prepares one large prompt: `zoe sim serve`
(GLM-5.3, time scale 0.001) gets one request at a time of each size while a client asks GET /health every 5 ms;
each row is one request with the slowest /health answer seen while it was in flight. The router ejects a replica
after `unhealthy_after` (2) checks in a row that take over `health_timeout_s` (2 s).

    python bench/agentic/health_probe.py     # writes bench/agentic/health_probe.json

Kinds: `chat` (a chat request whose one message is the prompt, what the agentic benchmarks send) and `ids` (a
completion with `return_token_ids`, which also derives and returns every prompt token id).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from zoe_cluster.bench.loopback import free_port, spawn, stop, wait_http  # noqa: E402


def one(url: str, kb: int, kind: str) -> dict:
    text = "abcdefgh" * (kb * 128)
    if kind == "chat":
        path, body = "/v1/chat/completions", {"model": "glm", "messages": [{"role": "user", "content": text}]}
    else:
        path, body = "/v1/completions", {"model": "glm", "prompt": text, "return_token_ids": True}
    waits: list[float] = []
    failures: list[str] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as c:
            while not done.is_set():
                t = time.perf_counter()
                try:
                    c.get(url + "/health").raise_for_status()
                except httpx.HTTPError as e:
                    failures.append(f"{type(e).__name__}: {e}")
                waits.append(time.perf_counter() - t)
                time.sleep(0.005)

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.05)
    t = time.perf_counter()
    r = httpx.post(url + path, json={**body, "max_tokens": 1}, timeout=120)
    request_s = time.perf_counter() - t
    done.set()
    th.join()
    r.raise_for_status()
    return {"kind": kind, "prompt_kb": kb, "request_s": round(request_s, 4), "health_checks": len(waits),
            "health_max_s": round(max(waits), 4) if waits else None, "health_failures": failures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-kb", default="600,2000")
    ap.add_argument("--kinds", default="chat,ids")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "health_probe.json"))
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = Path(f"/tmp/health_probe_{port}.log")
    proc = spawn([sys.executable, "-m", "zoe_cluster.cli.main", "sim", "serve", "--host", "127.0.0.1", "--port",
                  str(port), "--model", "glm-5.3", "--variant", "fp8-tp8", "--time-scale", "0.001", "--startup-s",
                  "0", "--served-model-name", "glm", "--max-model-len", "2000000"], log, cwd=REPO)
    try:
        wait_http(url + "/health", proc=proc)
        rows = []
        for kind in args.kinds.split(","):
            for kb in (int(s) for s in args.sizes_kb.split(",")):
                for _ in range(args.repeats):
                    rows.append(one(url, kb, kind))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        stop(proc)
    doc = {"command": "python bench/agentic/health_probe.py " + " ".join(sys.argv[1:]),
           "load_average_at_end": os.getloadavg(), "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
