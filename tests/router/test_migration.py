"""Mid-stream migration (`zoe_cluster.router.migration`): the pure parts with plain values, then the router in
front of simulated engines (`zoe sim serve` processes) that crash or hang while streams run on them: every
stream must reach the client whole (every token once, one usage block counting the whole request)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time

import httpx
import pytest

from tests.conftest import free_port
from tests.router.fake_backend import ServerThread
from tests.router.test_sim_e2e import start_sim, wait_up
from zoe_cluster.router.app import build_router
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.router.membership import MemberReplica, Membership
from zoe_cluster.router.migration import (
    EngineErrorEvent,
    NotContinuable,
    SpliceRewriter,
    StreamLedger,
    ask_token_ids,
    continuable,
    continuation_body,
    final_usage_event,
    strip_token_ids,
)


def sse(*events) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e, separators=(",", ":")).encode())
                    + b"\n\n" for e in events)


def events_of(text: str) -> list:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_the_ledger_forwards_whole_events_only_and_strips_the_ids_it_asked_for():
    ledger = StreamLedger("completions", strip_token_ids=True)
    raw = sse({"id": "c1", "created": 5, "model": "m",
               "choices": [{"index": 0, "text": "ab", "prompt_token_ids": [1, 2, 3], "token_ids": [7]}]},
              {"id": "c1", "choices": [{"index": 0, "text": "cd", "token_ids": [8]}]})
    out = ledger.take(raw[:30]) + ledger.take(raw[30:-3])  # the second event arrives cut short
    assert out.count(b"data: ") == 1 and b"token_ids" not in out and b'"text":"ab"' in out
    out += ledger.take(raw[-3:])
    assert out.count(b"data: ") == 2 and b"token_ids" not in out
    ledger.settle()
    assert ledger.prompt_ids == [1, 2, 3] and ledger.gen_ids == [7, 8] and "".join(ledger.text) == "abcd"
    assert ledger.generated_tokens == 2 and ledger.first == {"id": "c1", "created": 5, "model": "m"}


@pytest.mark.parametrize("prompt_ids", [[1, 2], list(range(5000)), None])
def test_token_ids_are_cut_from_events_of_any_size_and_nothing_else(prompt_ids):
    choice = {"index": 0, "text": 'say ,"token_ids":[1] please', "prompt_token_ids": prompt_ids, "token_ids": [9, 8]}
    ev = sse({"id": "c", "choices": [choice, {"index": 1, "text": "", "token_ids": None}]})
    out = strip_token_ids(ev)
    assert json.loads(out[6:]) == {"id": "c", "choices": [{"index": 0, "text": 'say ,"token_ids":[1] please'},
                                                          {"index": 1, "text": ""}]}


def test_an_engine_error_event_with_a_5xx_code_breaks_the_stream_and_a_4xx_one_reaches_the_client():
    ledger = StreamLedger("completions", strip_token_ids=True)
    tok = {"id": "c", "choices": [{"index": 0, "text": "a", "prompt_token_ids": [1], "token_ids": [5]}]}
    dead = {"error": {"message": "EngineCore encountered an issue", "type": "InternalServerError", "param": None,
                      "code": 500}}
    with pytest.raises(EngineErrorEvent) as e:
        ledger.take(sse(tok, dead, b"[DONE]"))
    assert b'"text":"a"' in e.value.before and b"error" not in e.value.before and "EngineCore" in e.value.message
    ledger.settle()
    assert ledger.gen_ids == [5] and not ledger.done
    bad = {"error": {"message": "bad", "type": "BadRequestError", "param": None, "code": 400}}
    assert b'"code":400' in StreamLedger("completions", strip_token_ids=False).take(sse(bad, b"[DONE]"))


def test_a_completion_continues_from_token_ids_with_the_tokens_left():
    ledger = StreamLedger("completions", strip_token_ids=True)
    ledger.take(sse({"id": "c", "choices": [{"index": 0, "text": "x", "prompt_token_ids": [1, 2], "token_ids": [9]}]}))
    ledger.settle()
    body = {"model": "m", "prompt": "hi", "max_tokens": 5, "min_tokens": 3, "temperature": 0, "stream": True}
    kind, cont = continuation_body(body, "completions", ledger, want_ids=True)
    assert kind == "completions" and json.loads(cont) == {**body, "prompt": [1, 2, 9], "max_tokens": 4, "min_tokens": 2, "return_token_ids": True}
    # without the engine's ids, a text prompt continues from text; a token-id prompt cannot
    text_only = StreamLedger("completions", strip_token_ids=False)
    text_only.take(sse({"id": "c", "choices": [{"index": 0, "text": " there"}]}))
    text_only.settle()
    assert json.loads(continuation_body(body, "completions", text_only, False)[1])["prompt"] == "hi there"
    with pytest.raises(NotContinuable):
        continuation_body({**body, "prompt": [1, 2]}, "completions", text_only, False)
    ask = ask_token_ids(b' {"prompt": "a"}')
    assert json.loads(ask) == {"prompt": "a", "return_token_ids": True}


def test_ids_whose_text_the_engine_held_back_are_generated_again():
    """vLLM sends a token's ids before its text when the token ends inside a UTF-8 character: the continuation
    starts after the last token whose text the client has, so that character is decoded whole."""
    ledger = StreamLedger("completions", strip_token_ids=True)
    ledger.take(sse({"id": "c", "choices": [{"index": 0, "text": "a", "prompt_token_ids": [1], "token_ids": [5]}]},
                    {"id": "c", "choices": [{"index": 0, "text": "", "token_ids": [200]}]}))
    ledger.settle()
    assert ledger.gen_ids == [5] and ledger.generated_tokens == 1
    body = {"model": "m", "prompt": "p", "max_tokens": 10, "stream": True}
    assert json.loads(continuation_body(body, "completions", ledger, True)[1])["prompt"] == [1, 5]


def test_a_chat_with_known_token_ids_continues_as_a_completion_and_reads_as_chat():
    ledger = StreamLedger("chat", strip_token_ids=True)
    ledger.take(sse({"id": "k", "created": 3, "model": "m", "prompt_token_ids": [1, 2],
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                    {"id": "k", "choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": [7]}]}))
    ledger.settle()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 4,
            "temperature": 0, "stream": True}
    kind, cont = continuation_body(body, "chat", ledger, want_ids=True)
    assert kind == "completions"
    assert json.loads(cont) == {"model": "m", "prompt": [1, 2, 7], "max_tokens": 3, "temperature": 0,
                                "stream": True, "return_token_ids": True}
    splice = SpliceRewriter(ledger, client_wants_ids=False, as_chat=True)
    out = splice.take(sse({"id": "c9", "object": "text_completion", "model": "m",
                           "choices": [{"index": 0, "text": " there", "token_ids": [8], "finish_reason": None,
                                        "prompt_token_ids": [1, 2, 7]}]}))
    ev = json.loads(events_of(out.decode())[0])
    assert ev["object"] == "chat.completion.chunk" and ev["id"] == "k"
    assert ev["choices"] == [{"index": 0, "finish_reason": None, "delta": {"content": " there"}}]
    assert ledger.gen_ids == [7, 8] and "".join(ledger.text) == "Hi there"


def test_a_stream_whose_output_ended_still_gets_its_usage_block():
    ledger = StreamLedger("completions", strip_token_ids=True)
    ledger.take(sse({"id": "c", "created": 2, "model": "m",
                     "choices": [{"index": 0, "text": "ab", "prompt_token_ids": [1, 2, 3], "token_ids": [7, 8],
                                  "finish_reason": "length"}]}))
    ledger.settle()
    assert ledger.output_ended
    body = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    ev = json.loads(events_of(final_usage_event(body, ledger).decode())[0])
    assert ev["id"] == "c" and ev["choices"] == []
    assert ev["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert final_usage_event({**body, "stream_options": None}, ledger) == b""


def test_a_chat_continues_the_partial_assistant_message():
    ledger = StreamLedger("chat", strip_token_ids=False)
    ledger.take(sse({"id": "k", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                    {"id": "k", "choices": [{"index": 0, "delta": {"content": "Hel"}}]}))
    ledger.settle()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
            "stream": True}
    kind, cont = continuation_body(body, "chat", ledger, want_ids=False)
    cont = json.loads(cont)
    assert kind == "chat" and cont["messages"][-1] == {"role": "assistant", "content": "Hel"} and cont["max_completion_tokens"] == 3
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert continuable({**body, "n": 2}, "chat") and continuable({**body, "response_format": {"type": "json_object"}},
                                                                 "chat")
    assert continuable(body, "chat") is None


def test_the_continuation_is_spliced_as_the_same_stream_with_usage_for_the_whole_request():
    ledger = StreamLedger("chat", strip_token_ids=False)
    ledger.take(sse({"id": "k1", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                    {"id": "k1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}}]},
                    {"id": "k1", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "b"}}]}))
    ledger.settle()
    splice = SpliceRewriter(ledger, client_wants_ids=False)
    cont = sse({"id": "k2", "created": 9, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                           "content": ""}}]},
               {"id": "k2", "created": 9, "model": "m",
                "choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "length"}]},
               {"id": "k2", "created": 9, "model": "m", "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}},
               b"[DONE]")
    out = splice.take(cont[:17]) + splice.take(cont[17:])
    evs = events_of(out.decode())
    assert evs[-1] == "[DONE]" and len(evs) == 3  # the role-only opening is dropped
    first, usage = json.loads(evs[0]), json.loads(evs[1])
    assert first["id"] == "k1" and first["created"] == 1 and first["choices"][0]["delta"] == {"content": "c"}
    assert usage["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    assert "".join(ledger.text) == "abc" and ledger.done


# ---------------------------------------------------------------- against simulated engines
MODEL = "glm-5.3"


def _cluster(flags: list[tuple[str, ...]], **cfg):
    ports = [free_port() for _ in flags]
    procs = [start_sim(p, "--time-scale", "1", *f) for p, f in zip(ports, flags)]
    for p, proc in zip(ports, procs):
        wait_up(f"http://127.0.0.1:{p}", proc)
    m = Membership(version=1, replicas=[MemberReplica(id=f"sim/{i}/1", url=f"http://127.0.0.1:{p}", engine="sim",
                                                      models=[MODEL]) for i, p in enumerate(ports)])
    cfg = {"policy": "round_robin", "health_interval_s": 0, "eject_s": 60, **cfg}
    return procs, build_router(RouterConfig(**cfg), membership=m)


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _check_stream(r: httpx.Response, chat: bool, max_tokens: int, prompt_tokens: int) -> None:
    """A whole stream: no error event, every token once (the sim's tokens are 4 characters), one usage block."""
    assert r.status_code == 200, r.text[:300]
    evs = events_of(r.text)
    assert evs[-1] == "[DONE]" and evs.count("[DONE]") == 1
    objs = [json.loads(e) for e in evs[:-1]]
    assert not [o for o in objs if "error" in o], r.text[-400:]
    assert len({o["id"] for o in objs}) == 1
    text = "".join((c["delta"].get("content") or "") if chat else c["text"] for o in objs for c in o["choices"])
    assert len(text) == 4 * max_tokens
    usages = [o["usage"] for o in objs if o.get("usage")]
    assert len(usages) == 1 and usages[0]["completion_tokens"] == max_tokens
    assert usages[0]["prompt_tokens"] == prompt_tokens
    assert all("token_ids" not in c for o in objs for c in o["choices"])


@pytest.mark.slow
def test_streams_on_a_crashing_engine_finish_on_another_one():
    """Engine 0 exits at its 4th request, while the streams it took before run: each continues on engine 1."""
    procs, router = _cluster([("--crash-after", "4"), ()], max_retries=2)
    try:
        with ServerThread(router.app) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
            prompt = "words " * 100  # 600 characters: 150 tokens on the simulated engine

            def one(i: int):
                chat = i % 2 == 1
                body = {"model": MODEL, "max_tokens": 200, "stream": True, "stream_options": {"include_usage": True}}
                if chat:
                    body["messages"] = [{"role": "user", "content": prompt}]
                else:
                    body["prompt"] = prompt
                time.sleep(0.3 * i)
                return i, chat, client.post("/v1/chat/completions" if chat else "/v1/completions", json=body)

            with cf.ThreadPoolExecutor(8) as pool:
                results = list(pool.map(one, range(8)))
            for i, chat, r in results:
                # a chat prompt is the rendered messages: 150 tokens of text and the roles' markup
                _check_stream(r, chat, 200, 154 if chat else 150)
        assert procs[0].poll() is not None  # the crash happened
        assert router.metrics.migrations.labels("continued")._value.get() >= 2
        assert router.metrics.migrations.labels("failed")._value.get() == 0
    finally:
        _stop(procs)


@pytest.mark.slow
def test_streams_on_a_hung_engine_continue_after_the_stall_timeout():
    procs, router = _cluster([("--hang-after", "3"), ()], stall_timeout_s=1.0, max_retries=2)
    try:
        with ServerThread(router.app) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
            body = {"model": MODEL, "prompt": "words " * 100, "max_tokens": 300, "stream": True,
                    "stream_options": {"include_usage": True}}

            def one(i: int):
                time.sleep(0.4 * i)
                return client.post("/v1/completions", json=body)

            t0 = time.monotonic()
            with cf.ThreadPoolExecutor(6) as pool:  # engine 0 hangs at its 3rd request, with 2 streams running
                results = list(pool.map(one, range(6)))
            assert time.monotonic() - t0 < 30
            for r in results:
                _check_stream(r, False, 300, 150)
        assert router.metrics.migrations.labels("continued")._value.get() >= 1
    finally:
        _stop(procs)


def _engine_that_dies_with_an_error_event(tokens_before: int):
    """A stand-in for a vLLM whose engine core died while its API server lives: `tokens_before` token events in
    vLLM's format (with the token ids the router asked for), then vLLM's EngineDeadError event and [DONE]."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def complete(request):
        body = await request.json()
        assert body["return_token_ids"] is True

        async def events():
            for i in range(tokens_before):
                choice = {"index": 0, "text": "tok" + "abcdefghij"[i % 10], "logprobs": None, "finish_reason": None,
                          "stop_reason": None, "prompt_token_ids": list(range(1, 31)) if i == 0 else None,
                          "token_ids": [100 + i]}
                yield sse({"id": "cmpl-dead", "object": "text_completion", "created": 1, "model": MODEL,
                           "choices": [choice]})
            yield sse({"error": {"message": "EngineCore encountered an issue. See stack trace for the root cause.",
                                 "type": "InternalServerError", "param": None, "code": 500}}, b"[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])


@pytest.mark.slow
def test_a_stream_ending_in_an_engine_error_event_continues_on_another_engine():
    port = free_port()
    proc = start_sim(port, "--time-scale", "0.05")
    try:
        wait_up(f"http://127.0.0.1:{port}", proc)
        with ServerThread(_engine_that_dies_with_an_error_event(7)) as dying:
            m = Membership(version=1, replicas=[
                MemberReplica(id="dying/0/1", url=dying.url, engine="vllm", models=[MODEL]),
                MemberReplica(id="sim/0/1", url=f"http://127.0.0.1:{port}", engine="sim", models=[MODEL])])
            router = build_router(RouterConfig(policy="round_robin", health_interval_s=0), membership=m)
            with ServerThread(router.app) as srv, httpx.Client(base_url=srv.url, timeout=60) as client:
                body = {"model": MODEL, "prompt": "x" * 120, "max_tokens": 20, "stream": True,
                        "stream_options": {"include_usage": True}}
                r = client.post("/v1/completions", json=body)
                assert r.headers["x-zoe-replica"] == "dying/0/1"
                _check_stream(r, False, 20, 30)  # 7 tokens from the dying engine, 13 from the sim; 30 prompt ids
        assert router.metrics.migrations.labels("continued")._value.get() == 1
        assert router.metrics.upstream_errors.labels(replica="dying/0/1", kind="error_event")._value.get() == 1
    finally:
        _stop([proc])
