"""The closed-loop driver on the wall clock: what it sends (session header, `user`, closed-loop order), and
`zoe bench agentic` through zoe's router in front of two simulated engines on loopback."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from typer.testing import CliRunner

from tests.agentic.sessions import DATA, req, sub, write_session
from tests.router.fake_backend import ServerThread
from tests.sim.helpers import sim_server
from zoe_cluster.agentic.driver import SessionDriver
from zoe_cluster.agentic.live import LiveConfig, run_live
from zoe_cluster.agentic.trace import load_session
from zoe_cluster.cli.main import app
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership


class Recorder:
    """An OpenAI-shaped server that records (arrival time, x-session-id, body) and streams `max_tokens` chunks."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str | None, dict]] = []
        self.ended: list[float] = []
        self.app = Starlette(routes=[Route("/v1/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request):
        body = await request.json()
        self.seen.append((time.monotonic(), request.headers.get("x-session-id"), body))

        async def events():
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': 'abcd'}]})}\n\n"
            usage = {"prompt_tokens": len(body["prompt"]) // 4, "completion_tokens": body["max_tokens"]}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            self.ended.append(time.monotonic())
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def test_live_sends_session_keys_in_closed_loop(tmp_path) -> None:
    p = write_session(tmp_path / "w.json", [req(64, 2, [1]), sub("helper", req(64, 3, [5])), req(128, 2, [1, 2],
                                                                                                  think=0.3)])
    rec = Recorder()
    with ServerThread(rec.app) as srv:
        driver = SessionDriver([load_session(p)], 1)
        report, records = asyncio.run(run_live(driver, LiveConfig(srv.url, "m")))
    assert report["completed"] == report["requests"] == 3 and report["errors"] == 0
    keys = [(hdr, body["user"]) for _, hdr, body in rec.seen]
    assert keys == [("0:w", "0:w"), ("0:w/helper", "0:w/helper"), ("0:w", "0:w")]
    assert [body["max_tokens"] for _, _, body in rec.seen] == [2, 3, 2]
    # closed loop: the sub-agent starts after the first response ended, the parent after the sub-agent + 0.3 s
    assert rec.seen[1][0] >= rec.ended[0] and rec.seen[2][0] >= rec.ended[1] + 0.3
    assert report["prefix_hit_rate"] is None and report["ttft_floor_p90_s"] is None
    assert any("ttft_floor_p90_s: null" in n for n in report["notes"])


def test_bench_agentic_through_the_router_on_simulated_engines(tmp_path) -> None:
    sim = ("--model", "glm-5.3", "--time-scale", "0.01", "--startup-s", "0", "--served-model-name", "glm-5.3")
    with sim_server(*sim) as (url0, _), sim_server(*sim) as (url1, _):
        m = Membership(version=1, replicas=[MemberReplica(id=f"sim/{i}/1", url=u, engine="sim", models=["glm-5.3"])
                                            for i, u in enumerate((url0, url1))])
        router = build_router(RouterConfig(policy="prefix"), membership=m)
        with ServerThread(router.app) as srv:
            out = tmp_path / "agentic.json"
            res = CliRunner().invoke(app, [
                "bench", "agentic", str(DATA), "--url", srv.url, "--sessions", "2", "--model", "glm-5.3",
                "--engine-url", url0, "--engine-url", url1, "--gpus", "16", "--twin-model", "glm-5.3",
                "--think-cap-s", "2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    assert rep["requests"] == rep["completed"] == 18 and rep["errors"] == rep["dropped"] == 0
    assert rep["server_time_scale"] == 0.01  # read from the engines' /sim/info behind the router
    assert rep["prefix_hit_rate_source"].startswith("engine /metrics")
    assert 0.5 < rep["prefix_hit_rate"] <= rep["reuse_ceiling"] + 0.01
    assert rep["ttft_floor_p90_s"] is not None and rep["output_tok_s_per_gpu"] > 0
