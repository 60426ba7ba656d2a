"""bench/sim/api_server_probe.py against an HTTP server whose first token comes a known time after the request while
its vLLM histograms report a known engine-side TTFT: the probe's client-minus-engine gaps are their difference."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "sim" / "api_server_probe.py"
FIRST_TOKEN_S = 0.030
ENGINE_TTFT_S = 0.010


class _Engine(BaseHTTPRequestHandler):
    finished = 0
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802
        with self.lock:
            n = type(self).finished
        text = "".join(f'vllm:{h}_count{{engine="0"}} {n}.0\nvllm:{h}_sum{{engine="0"}} {n * ENGINE_TTFT_S / 2}\n'
                       for h in ("request_queue_time_seconds", "request_prefill_time_seconds"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(text.encode())

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_TOKEN_S)
        for _ in range(body["max_tokens"]):
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()
            time.sleep(0.001)
        self.wfile.write(b"data: [DONE]\n\n")
        with self.lock:
            type(self).finished += 1

    def log_message(self, *args):  # noqa: D102
        pass


def test_gaps_are_client_ttft_minus_the_engines():
    spec = importlib.util.spec_from_file_location("api_server_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = asyncio.run(mod.probe(f"http://127.0.0.1:{server.server_port}", "tiny", 0))
    finally:
        server.shutdown()
    gap = FIRST_TOKEN_S - ENGINE_TTFT_S
    assert len(res["lone_gap_s"]) == 8
    assert sorted(res["lone_gap_s"])[4] == pytest.approx(gap, abs=0.010)
    assert [b["requests"] for b in res["bursts"]] == [4, 4, 4, 8, 8, 8]
    for b in res["bursts"]:
        assert b["engine_ttft_mean_s"] == pytest.approx(ENGINE_TTFT_S)
        assert min(b["client_ttft_s"]) >= FIRST_TOKEN_S
    assert [u["streams"] for u in res["under_streams"]] == [8, 16]
