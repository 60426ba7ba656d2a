"""The KV-event publisher zoe asks of engines (precise routing): the engine binds it, with a replay socket, one per
data-parallel rank, on the ports `kv_event_ports` names; checked against vLLM's and SGLang's real parsers."""

from __future__ import annotations

import json

import pytest

from tests.engines.test_commands import _ctx, _parse, _strip, _variants
from zoe_cluster.engines import get_adapter
from zoe_cluster.engines.base import kv_event_ports


def _config(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--kv-events-config") + 1])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_data_parallel_rank_gets_a_bound_publisher_and_replay_port(engine):
    adapter = get_adapter(engine)
    cases = sorted(_variants(engine), key=lambda c: -c[0].variants[c[1]].parallelism.dp)
    r, name = cases[0]  # the most data-parallel ranks
    dp = r.variants[name].parallelism.dp
    argv = adapter.command(r, name, _ctx(kv_events_port=7000, replica_id="glm/3/2")).argv
    cfg = _config(argv)
    assert cfg["endpoint"] == "tcp://*:7000" and cfg["replay_endpoint"] == f"tcp://*:{7000 + dp}"
    assert cfg["topic"] == "glm/3/2" and cfg["publisher"] == "zmq"
    assert kv_event_ports(7000, dp) == [(7000 + k, 7000 + dp + k) for k in range(dp)]
    assert "--kv-events-config" not in adapter.command(r, name, _ctx()).argv  # off unless a port is given


@pytest.mark.vllm
def test_vllm_parses_the_kv_events_config(vllm_python):
    r, name = _variants("vllm")[0]
    argv = _strip("vllm", get_adapter("vllm").command(r, name, _ctx(served_model_name=r.served_model_name,
                                                                      kv_events_port=7000, replica_id="g/0/1")).argv)
    got, = _parse(vllm_python, "vllm", [argv])
    assert got["ok"], got["error"]
    dp = r.variants[name].parallelism.dp
    assert got["values"]["kv_events"] == {"enable_kv_cache_events": True, "publisher": "zmq",
                                          "endpoint": "tcp://*:7000", "replay_endpoint": f"tcp://*:{7000 + dp}",
                                          "topic": "g/0/1"}


@pytest.mark.sglang
def test_sglang_parses_the_kv_events_config(sglang_python):
    r, name = _variants("sglang")[0]
    argv = _strip("sglang", get_adapter("sglang").command(r, name, _ctx(served_model_name=r.served_model_name,
                                                                        kv_events_port=7000, replica_id="g/0/1")).argv)
    got, = _parse(sglang_python, "sglang", [argv])
    assert got["ok"], got["error"]
    dp = r.variants[name].parallelism.dp
    kv = got["values"]["kv_events"]
    assert (kv["publisher"], kv["endpoint"], kv["replay_endpoint"], kv["topic"]) == (
        "zmq", "tcp://*:7000", f"tcp://*:{7000 + dp}", "g/0/1")

