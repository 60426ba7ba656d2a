"""Router CPU per long chat request: reading the body, parsing it, the edge checks, rendering and hashing the prompt
(everything the router does before choosing a replica), from 8K to 1M tokens, for this tree and for older commits.

    python bench/router/long_prompt.py --baseline 4a974db --baseline 25f6e3f

Requests are agentic conversations in zoe's token model (`zoe_cluster.sim.tokens`: a token is 4 characters of the
rendered prompt): a system prompt, 8 tools, then turns of a user message, an assistant message with a tool call and
the tool's result, in code-like ASCII text with newlines and quotes (so JSON escapes). Two requests per size:

- cold: the first request of a session the router has not seen (a new `x-session-id`);
- follow-up: the session's next turn, which appends an assistant message with a tool call and its ~1K-token result
  to a body the router parsed just before (unmeasured).

Each is measured isolated (a 10 ms pause and 16 MiB of other memory touched before the call) and back to back
(calls in a row). The time is CPU time of the calling thread (`time.thread_time`), not wall time: the machine is
shared. The call is the router's own code: `Router._read_body` then `Router._context`, driven without a server.
A baseline commit is measured from a `git worktree` of it (created under /tmp if missing) in a subprocess that
imports that tree's zoe_cluster, with the same request bytes; the current tree runs the same way.

Writes bench/router/long_prompt.json and long_prompt.png.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SIZES = [8_192, 32_768, 131_072, 524_288, 1_048_576]
FOLLOW_UP_TOKENS = 1_000
WORDS = ("def return self import class value for in if else the and of to a is that with as on error file path "
         "line test result print None True False async await yield lambda raise except try").split()


def _text(rng: random.Random, chars: int) -> str:
    out, n = [], 0
    while n < chars:
        w = rng.choice(WORDS)
        r = rng.random()
        piece = w + ("\n    " if r < 0.08 else '"' if r < 0.1 else " ")
        out.append(piece)
        n += len(piece)
    return "".join(out)[:chars]


def _turn(rng: random.Random, i: int, result_chars: int) -> list[dict]:
    call = {"id": f"call_{i}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/mod_{i}.py"})}}
    return [
        {"role": "assistant", "content": _text(rng, 300), "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{i}", "content": _text(rng, result_chars)},
    ]


def conversation(tokens: int, seed: int = 0) -> tuple[dict, dict]:
    """(body, follow-up body) of about `tokens` prompt tokens; the follow-up extends the body by one turn."""
    from zoe_cluster.routing.hashing import estimate_tokens, render_chat

    rng = random.Random(seed)
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": _text(rng, 400),
                                               "parameters": {"type": "object",
                                                              "properties": {"path": {"type": "string"}}}}}
             for i in range(8)]
    messages = [{"role": "system", "content": _text(rng, min(8_000, tokens * 2))},
                {"role": "user", "content": _text(rng, 600)}]
    i = 0
    while estimate_tokens(render_chat(messages, tools)) < tokens:
        left = tokens * 4 - len(render_chat(messages, tools))
        messages += _turn(rng, i, max(100, min(6_000, left - 500)))
        i += 1
    body = {"model": "glm-5.3", "messages": messages, "tools": tools, "max_tokens": 512, "stream": True}
    follow = dict(body, messages=messages + _turn(rng, i, FOLLOW_UP_TOKENS * 4))
    return body, follow


# ---------------------------------------------------------------------------------------------- the worker
def _run(coro):
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    raise RuntimeError("the body reader waited on something")


def worker(path: Path, reps: dict[int, int]) -> dict:
    """Measure the importable zoe_cluster on the request files in `path`."""
    import zoe_cluster
    from zoe_cluster.router.app import build_router
    from zoe_cluster.router.config import RouterConfig

    router = build_router(RouterConfig())
    new_style = "endpoint" in inspect.signature(router._read_body).parameters
    scratch = bytearray(16 * 1024 * 1024)

    def call(raw: bytes, session: str) -> float:
        headers = {b"content-length": str(len(raw)).encode(), b"x-session-id": session.encode()}

        async def receive():
            return {"type": "http.request", "body": raw, "more_body": False}

        t0 = time.thread_time()
        if new_style:
            _, body, prompt = _run(router._read_body("chat", headers, receive))
            ctx = router._context("chat", body, headers, prompt)
        else:
            _, body = _run(router._read_body(headers, receive))
            ctx = router._context("chat", body, headers)
        dt = time.thread_time() - t0
        assert ctx.prompt_tokens > 0
        return dt

    def isolate() -> None:
        time.sleep(0.01)
        for i in range(0, len(scratch), 4096):
            scratch[i] = (scratch[i] + 1) & 0xFF

    out: dict = {"zoe_cluster": zoe_cluster.__file__, "rows": []}
    session = iter(range(10**9))
    for tokens, n in reps.items():
        raw = (path / f"{tokens}.json").read_bytes()
        follow = (path / f"{tokens}.follow.json").read_bytes()
        for mode in ("isolated", "back_to_back"):
            for kind in ("cold", "follow_up"):
                samples = []
                for _ in range(n):
                    s = f"s{next(session)}"
                    if kind == "follow_up":
                        call(raw, s)  # the session's previous turn, not measured
                    if mode == "isolated":
                        isolate()
                    samples.append(call(raw if kind == "cold" else follow, s))
                out["rows"].append({"tokens": tokens, "kind": kind, "mode": mode,
                                    "samples_ms": [x * 1e3 for x in samples]})
    return out


# ---------------------------------------------------------------------------------------------- the driver
def _worktree(commit: str) -> Path:
    sha = subprocess.check_output(["git", "-C", str(REPO), "rev-parse", commit], text=True).strip()
    tree = Path(f"/tmp/zoe-bench-{sha[:12]}")
    if not (tree / "zoe_cluster").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), sha], check=True,
                       stdout=subprocess.DEVNULL)
    return tree


def _summary(samples: list[float]) -> dict:
    s = sorted(samples)
    q = statistics.quantiles(s, n=10)
    return {"median_ms": round(statistics.median(s), 4), "p10_ms": round(q[0], 4), "p90_ms": round(q[-1], 4),
            "n": len(s)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", action="append", default=[], help="a commit to measure beside this tree")
    ap.add_argument("--reps", type=int, default=40, help="repetitions per point up to 128K (half at 512K, 1M)")
    ap.add_argument("--out", type=Path, default=HERE / "long_prompt.json")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker-reps", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        reps = {int(k): v for k, v in json.loads(args.worker_reps).items()}
        print(json.dumps(worker(args.worker, reps)))
        return

    data = Path(f"/tmp/zoe-long-prompt-{os.getpid()}")
    data.mkdir(exist_ok=True)
    sizes = {}
    for tokens in SIZES:
        body, follow = conversation(tokens)
        (data / f"{tokens}.json").write_bytes(json.dumps(body).encode())
        (data / f"{tokens}.follow.json").write_bytes(json.dumps(follow).encode())
        sizes[tokens] = {"body_bytes": (data / f"{tokens}.json").stat().st_size,
                         "follow_up_bytes": (data / f"{tokens}.follow.json").stat().st_size,
                         "messages": len(body["messages"])}
    reps = {t: (args.reps if t <= 131_072 else max(5, args.reps // 2)) for t in SIZES}
    trees = [(f"baseline {c}", _worktree(c)) for c in args.baseline] + [("this tree", REPO)]
    load_before = os.getloadavg()
    results = {}
    for name, tree in trees:
        env = dict(os.environ, PYTHONPATH=str(tree))
        t0 = time.time()
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(data),
                               "--worker-reps", json.dumps(reps)], env=env, cwd=tree, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
        res = json.loads(proc.stdout.splitlines()[-1])
        assert res["zoe_cluster"].startswith(str(tree)), res["zoe_cluster"]
        commit = subprocess.check_output(["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], text=True).strip()
        dirty = name == "this tree" and bool(subprocess.check_output(
            ["git", "-C", str(tree), "status", "--porcelain", "--", "zoe_cluster/routing", "zoe_cluster/router"],
            text=True).strip())
        results[name] = {"commit": commit + (" + uncommitted changes" if dirty else ""),
                         "wall_s": round(time.time() - t0, 1),
                         "rows": [{**{k: r[k] for k in ("tokens", "kind", "mode")}, **_summary(r["samples_ms"])}
                                  for r in res["rows"]]}
        print(f"{name} ({commit}): done in {results[name]['wall_s']} s", file=sys.stderr)
    out = {
        "command": "python bench/router/long_prompt.py" + "".join(f" --baseline {c}" for c in args.baseline)
        + (f" --reps {args.reps}" if args.reps != 40 else ""),
        "measure": "thread CPU time of Router._read_body + Router._context per request, ms",
        "follow_up_tokens": FOLLOW_UP_TOKENS,
        "sizes": sizes,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), ""),
        "python": sys.version.split()[0],
        "results": results,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(out, args.out.with_suffix(".png"))
    print(table(out))


def table(out: dict) -> str:
    names = list(out["results"])
    lines = ["| tokens | request | " + " | ".join(f"{n}: median (p90) ms" for n in names) + " |",
             "|---|---|" + "---|" * len(names)]
    for tokens in SIZES:
        for kind in ("cold", "follow_up"):
            for mode in ("isolated", "back_to_back"):
                cells = []
                for n in names:
                    r = next(r for r in out["results"][n]["rows"]
                             if r["tokens"] == tokens and r["kind"] == kind and r["mode"] == mode)
                    cells.append(f"{r['median_ms']:.2f} ({r['p90_ms']:.2f})")
                lines.append(f"| {tokens // 1024}K | {kind}, {mode.replace('_', ' ')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, kind in zip(axes, ("cold", "follow_up")):
        for name, res in out["results"].items():
            for mode, style in (("isolated", "-o"), ("back_to_back", "--x")):
                rows = [r for r in res["rows"] if r["kind"] == kind and r["mode"] == mode]
                xs = [r["tokens"] for r in rows]
                ax.errorbar(xs, [r["median_ms"] for r in rows],
                            yerr=[[r["median_ms"] - r["p10_ms"] for r in rows],
                                  [r["p90_ms"] - r["median_ms"] for r in rows]],
                            fmt=style, capsize=3, label=f"{name} ({res['commit']}), {mode.replace('_', ' ')}")
        ax.plot([131_072, 1_048_576], [1.0, 5.0], "k*", markersize=12, label="target (128K: 1 ms, 1M: 5 ms)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_title("cold request (new session)" if kind == "cold" else f"follow-up turn (+{FOLLOW_UP_TOKENS} tokens)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("router CPU per request, ms (median, p10-p90)")
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle("Router CPU before routing a long chat request (parse, checks, render, hash)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
