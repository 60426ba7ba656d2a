"""The router's edges against bad input and slow clients, on loopback: every bad body gets a 4xx in OpenAI's error
shape, slow headers and bodies are cut at the read timeouts (raw sockets), HTTP/1.0 clients get close-delimited
streams, /metrics can need a key, https replicas are refused at membership, and the simulated engine answers the
same bodies the same way."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.router.test_proxy import ADMIN, Cluster, completion, sse_events
from tests.sim.helpers import sim_server
from zoe_cluster.router.request_checks import RequestError, parse_json_body
from zoe_cluster.routing.json_limits import nested_deeper_than

SHAPE = {"message", "type", "param", "code"}
DEEP = b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HUGE_INT = b'{"model": "m", "prompt": "x", "max_tokens": ' + b"7" * 5000 + b"}"


def _body(**fields):
    return json.dumps({"model": "m", "prompt": "hello", **fields}).encode()


# (body, status, needle in the message, param)
BAD = {
    "nested 100k deep": (DEEP, 400, "nested deeper than 128", None),
    "5000-digit integer": (HUGE_INT, 400, "number longer than 100", None),
    "NaN": (b'{"model": "m", "prompt": "x", "temperature": NaN}', 400, "NaN is not a JSON number", None),
    "max_tokens 0": (_body(max_tokens=0), 400, "max_tokens must be at least 1, got 0.", "max_tokens"),
    "max_tokens string": (_body(max_tokens="5"), 400, "max_tokens must be an integer", "max_tokens"),
    "temperature 2.5": (_body(temperature=2.5), 400, "temperature must be in [0, 2], got 2.5.", "temperature"),
    "temperature -1": (_body(temperature=-1), 400, "temperature must be non-negative", "temperature"),
    "top_p 0": (_body(top_p=0), 400, "top_p must be in (0, 1], got 0.", "top_p"),
    "top_k -2": (_body(top_k=-2), 400, "top_k must be 0 (disable), or at least 1", "top_k"),
    "n 0": (_body(n=0), 400, "n must be at least 1, got 0.", "n"),
    "presence_penalty 3": (_body(presence_penalty=3), 400, "presence_penalty must be in [-2, 2]", "presence_penalty"),
    "stream_options without stream": (_body(stream_options={"include_usage": True}), 400,
                                      "Stream options can only be defined when `stream=True`.", "stream_options"),
    "empty prompt": (_body(prompt=""), 400, "Either prompt or prompt_embeds must be provided", "prompt"),
    "prompt []": (_body(prompt=[]), 400, "Either prompt or prompt_embeds must be provided", "prompt"),
    "negative token id": (_body(prompt=[1, -5]), 400, "token ids must be >= 0, got -5", "prompt"),
    "mixed prompt list": (_body(prompt=["a", 1]), 400, "must hold only strings", "prompt"),
    "prompt object": (_body(prompt={"a": 1}), 400, "prompt must be a string", "prompt"),
    "1025 prompts": (_body(prompt=["a"] * 1025), 400, "prompt list length 1025 exceeds", "prompt"),
}


def test_json_limits_with_plain_values():
    tree = b'[[], [[]], [[[]]]]'  # depth 4
    assert nested_deeper_than(tree, 3) and not nested_deeper_than(tree, 4)
    assert nested_deeper_than(b'{"a": ' * 200 + b"1" + b"}" * 200, 128)
    assert not nested_deeper_than(b'{"m": [' + b'{"b": [1]},' * 500 + b"1]}", 128)  # wide, not deep
    assert parse_json_body(b'{"p": "' + b"9" * 5000 + b'", "x": [1, 2]}', 128, 100)["x"] == [1, 2]  # digits in a string
    for raw, needle in ((b'{"a": 1' + b"0" * 101 + b"}", "number longer than 100"), (b'{"a": -Infinity}', "Infinity"),
                        (b"\xff", "utf-8"), (b"[" * 129 + b"]" * 129, "deeper than 128")):
        with pytest.raises(RequestError, match=needle):
            parse_json_body(raw, 128, 100)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(n=2, header_timeout_s=1.0, body_timeout_s=1.0, metrics_key="mk")
    yield c
    c.close()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_bodies_get_400_in_openai_shape(cluster, name):
    body, status, needle, param = BAD[name]
    r = cluster.client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    err = r.json()["error"]
    assert r.status_code == status and set(err) == SHAPE, (r.status_code, r.text[:300])
    assert needle in err["message"] and err["param"] == param and err["code"] == status
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", [["one prompt", "another"], [[1, 2, 3], [4, 5]], [7, 8, 9], "text"])
def test_every_prompt_form_vllm_accepts_is_routed(cluster, prompt):
    r = cluster.client.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 3})
    assert r.status_code == 200 and r.headers["x-zoe-replica"].startswith("static/")


def test_echo_with_max_tokens_0_passes_as_in_vllm(cluster):
    assert completion(cluster.client, max_tokens=0, echo=True).status_code == 200


def test_router_errors_share_the_shape():
    c = Cluster(n=1)
    try:
        for r in (c.client.post("/v1/completions", json={"model": "nope", "prompt": "x"}),
                  c.client.get("/admin/membership"), c.client.get("/no/such/route"),
                  c.client.put("/admin/membership", json={"version": 1, "replicas": [{"id": "a/0/0",
                                                                                        "url": "https://h:1"}]},
                               headers=ADMIN)):
            assert r.status_code >= 400 and set(r.json()["error"]) == SHAPE, r.text
    finally:
        c.close()


def test_https_replica_is_refused_at_membership_naming_the_reason():
    c = Cluster(n=1)
    try:
        r = c.client.put("/admin/membership", headers=ADMIN,
                         json={"version": 5, "replicas": [{"id": "glm/0/1", "url": "https://10.0.0.5:8000"}]})
        assert r.status_code == 400 and "https upstreams are not supported" in r.json()["error"]["message"]
        assert c.client.get("/admin/membership", headers=ADMIN).json()["version"] == 0  # nothing applied
    finally:
        c.close()


def test_engine_500_is_retried_elsewhere_counted_and_rewrapped():
    c = Cluster(n=2, modes={0: "fail500"}, policy="round_robin", passive_failures=2)
    try:
        for _ in range(4):
            r = completion(c.client)
            assert r.status_code == 200 and r.headers["x-zoe-replica"] == "static/1/0"
        assert c.metric("zoe_router_upstream_errors_total", replica="static/0/0", kind="status") >= 2
        assert c.metric("zoe_router_ejections_total", replica="static/0/0", cause="passive") == 1
    finally:
        c.close()
    c = Cluster(n=1, modes={0: "fail500"}, max_retries=0)  # nowhere else to go: the engine's 500, in the shape
    try:
        r = completion(c.client)
        err = r.json()["error"]
        assert r.status_code == 500 and set(err) == SHAPE and err["type"] == "server_error"
        assert "static/0/0 answered HTTP 500: Internal Server Error" in err["message"]
    finally:
        c.close()


def test_metrics_need_the_metrics_key(cluster):
    assert cluster.client.get("/metrics").status_code == 401
    r = cluster.client.get("/metrics", headers={"Authorization": "Bearer mk"})
    assert r.status_code == 200 and "zoe_router_requests_total" in r.text


def _slow_client(port: int, fast: bytes, slow: bytes, out: list, i: int) -> None:
    """Send `fast` at once, then `slow` one byte every 0.2 s; record how long until the server closed the
    connection, and what it answered."""
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    got = b""
    try:
        s.sendall(fast)
        s.setblocking(False)
        for b in slow:
            s.sendall(bytes([b]))
            time.sleep(0.2)
            try:
                chunk = s.recv(4096)
            except BlockingIOError:
                continue
            got += chunk
            if not chunk:
                break
    except OSError:  # reset by the server
        pass
    finally:
        out[i] = (time.monotonic() - t0, got)
        s.close()


def test_slow_headers_and_bodies_are_cut_at_the_read_timeouts(cluster):
    """100 clients send a header at one byte per 0.2 s, 100 others a body: all are answered 408 and closed within
    the 1 s timeouts (plus the 0.2 s step in which the client notices), where the whole send would take 20 s."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 60\r\n\r\n"
    body = b'{"model": "m", "prompt": "' + b"x" * 32 + b'"}'
    n = 100
    out: list = [None] * (2 * n)
    threads = [threading.Thread(target=_slow_client, args=(cluster.server.port, b"", head, out, i)) for i in range(n)]
    threads += [threading.Thread(target=_slow_client, args=(cluster.server.port, head, body, out, n + i))
                for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for part in (out[:n], out[n:]):
        assert max(o[0] for o in part) < 2.0, max(o[0] for o in part)
        assert all(o[1].startswith(b"HTTP/1.1 408") for o in part)
    assert completion(cluster.client).status_code == 200  # the router still serves


def test_slow_body_after_a_fast_header_gets_408():
    c = Cluster(n=1, body_timeout_s=0.5)
    try:
        s = socket.create_connection(("127.0.0.1", c.server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{")
        t0 = time.monotonic()
        s.settimeout(5)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        assert data.startswith(b"HTTP/1.1 408") and 0.4 < time.monotonic() - t0 < 2
        assert set(json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]) == SHAPE
        s.close()
    finally:
        c.close()


def test_http10_client_gets_a_close_delimited_stream(cluster):
    s = socket.create_connection(("127.0.0.1", cluster.server.port))
    body = json.dumps({"model": "m", "prompt": "x", "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    s.settimeout(5)
    data = b""
    while chunk := s.recv(4096):  # the server closes the connection to end the body
        data += chunk
    s.close()
    head, payload = data.split(b"\r\n\r\n", 1)
    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head.lower()
    assert payload.endswith(b"data: [DONE]\n\n") and sse_events(payload.decode())[-1] == "[DONE]"


def test_the_simulated_engine_answers_the_same_bodies_with_400_and_has_a_body_limit():
    with sim_server("--model", "glm-5.3", "--time-scale", "0.001", "--startup-s", "0",
                    "--served-model-name", "m") as (url, _):
        for name in ("nested 100k deep", "5000-digit integer", "max_tokens 0", "temperature 2.5", "negative token id"):
            body, status, needle, param = BAD[name]
            r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
            err = r.json()["error"]
            assert r.status_code == status and set(err) == SHAPE and needle in err["message"], (name, r.text[:200])
            assert err["type"] == "BadRequestError" and err["param"] == param
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": ["a", "b"]})
        assert r.status_code == 400 and "one prompt per request" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": [[1, 2, 3]], "max_tokens": 2})
        assert r.status_code == 200
        r = httpx.post(url + "/v1/completions", content=b" " * (33 * 1024 * 1024),
                       headers={"content-type": "application/json"})
        assert r.status_code == 413 and set(r.json()["error"]) == SHAPE
        r = httpx.post(url + "/sim/faults", json={"slowdown": 2})  # no fault endpoint without --fault-endpoint
        assert r.status_code == 404 and set(r.json()["error"]) == SHAPE


def test_a_failure_inside_the_router_is_answered_in_the_shape():
    c = Cluster(n=1)

    def broken(ctx, views):
        raise ZeroDivisionError("policy bug")

    c.router.policy.select = broken
    try:
        r = completion(c.client)
        err = r.json()["error"]
        assert r.status_code == 500 and set(err) == SHAPE and "ZeroDivisionError: policy bug" in err["message"]
        assert completion(c.client).status_code == 500  # and it keeps serving
    finally:
        c.close()
