"""bench/sim/api_server_probe.py against an HTTP server whose first token comes a known time after the request while
its vLLM histograms report known engine-side and API-server TTFTs: the probe reads each beside the client's; and its
twin side on the committed calibration (a request waits out the step in progress, which the engine-side figure leaves
out; the first step after the engine idled pays the wake-up)."""

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
API_TTFT_S = 0.020
PROFILE = SCRIPT.with_name("calibration_vllm_cpu.yaml")


class _Engine(BaseHTTPRequestHandler):
    finished = 0
    lock = threading.Lock()

    def do_GET(self):  # noqa: N802
        with self.lock:
            n = type(self).finished
        text = "".join(f'vllm:{h}_count{{engine="0"}} {n}.0\nvllm:{h}_sum{{engine="0"}} {n * t}\n'
                       for h, t in (("request_queue_time_seconds", ENGINE_TTFT_S / 2),
                                    ("request_prefill_time_seconds", ENGINE_TTFT_S / 2),
                                    ("time_to_first_token_seconds", API_TTFT_S)))
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


def _module():
    spec = importlib.util.spec_from_file_location("api_server_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_probe_reads_client_api_and_engine_ttft():
    mod = _module()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res = asyncio.run(mod.probe(f"http://127.0.0.1:{server.server_port}", "tiny", 0, n=2))
    finally:
        server.shutdown()
    assert [(a["prompt_tokens"], a["engine"]) for a in res["alone"]] == [(16, "idle"), (16, "busy"), (594, "idle"),
                                                                        (594, "busy")]
    for a in res["alone"]:
        assert a["rows"], a
        for r in a["rows"]:
            assert r["engine_s"] == pytest.approx(ENGINE_TTFT_S) and r["api_s"] == pytest.approx(API_TTFT_S)
            assert FIRST_TOKEN_S <= r["client_s"] < FIRST_TOKEN_S + 0.05
    assert [(b["requests"], b["prompt_tokens"]) for b in res["bursts"]] == list(mod.BURSTS)
    for b in res["bursts"]:
        assert b["engine_ttft_mean_s"] == pytest.approx(ENGINE_TTFT_S)
        assert b["api_ttft_mean_s"] == pytest.approx(API_TTFT_S)
        assert min(b["client_ttft_s"]) >= FIRST_TOKEN_S
    assert [u["streams"] for u in res["under_streams"]] == list(mod.STREAMS)
    summary = mod.summarize(mod.merge([res, json.loads(json.dumps(res))]))
    assert summary["idle engine, 16 tokens"]["engine"] == pytest.approx(ENGINE_TTFT_S * 1e3, abs=0.01)
    assert summary["burst of 10 x 594 tokens"]["api"] == pytest.approx(API_TTFT_S * 1e3, abs=0.01)


def test_twin_scenarios_on_the_committed_calibration():
    from zoe_cluster.sim.engine_calibration import load_engine_profile

    prof = load_engine_profile(PROFILE)
    m = prof.calibration().model
    twin = _module().twin_scenarios(prof)
    idle, busy = twin["idle engine, 16 tokens"], twin["busy engine, 16 tokens"]
    # alone on the idle engine: one 16-token prefill step plus the wake-up, the API server's share on the client
    step = m.prefill_step_s(16, 16 * 15 / 2, 0.0, kv_read_tokens=16)
    assert idle["engine"] == pytest.approx((step + m.idle_wake_s) * 1e3, abs=0.01)
    assert idle["client"] == pytest.approx((step + m.idle_wake_s + m.frontend_s) * 1e3, abs=0.01)
    # while a stream decodes: no wake-up; the step shares with one decode token; the client also waits out the
    # decode step in progress (a uniform point of it: on average half of it)
    shared = m.prefill_step_s(16, 16 * 15 / 2, 0.0, 1, 0.0, 16)
    assert busy["engine"] == pytest.approx(shared * 1e3, abs=0.01)
    wait = busy["client"] - busy["engine"] - m.frontend_s * 1e3
    assert 0.3 * m.decode_step_s(1) * 1e3 < wait < 0.7 * m.decode_step_s(1) * 1e3
    burst = twin["burst of 8 x 16 tokens"]
    assert burst["client_first"] == pytest.approx(idle["client"], abs=0.01)  # the first request steps alone
    assert burst["client"] > burst["client_first"]
