"""Loading and validating session files: real samples load; every malformed field is named with its file and
request index; an unknown type is an error."""

from __future__ import annotations

import json

import pytest

from tests.agentic.sessions import DATA, req, sub, write_session
from zoe_cluster.agentic.trace import AgentRequest, SessionFileError, SubAgent, load_session, load_sessions


def test_real_samples_load() -> None:
    sessions = load_sessions(DATA)
    assert [s.session_id for s in sessions] == ["trace_0012", "trace_0184"]
    for s in sessions:
        assert s.block_size == 64 and s.hash_id_scope == "local"
        for r in s.requests():
            assert len(r.hash_ids) == r.input_tokens // 64 and r.kind in ("s", "n")


def test_subagents_nest(tmp_path) -> None:
    p = write_session(tmp_path / "a.json", [req(128, 4, [1, 2]), sub("x", req(64, 2, [9]), req(128, 2, [9, 10])),
                                            req(192, 4, [1, 2, 3], think=5.0)])
    s = load_session(p)
    assert isinstance(s.items[1], SubAgent) and s.items[1].agent_id == "x"
    assert [type(i) for i in s.items[1].items] == [AgentRequest, AgentRequest]
    assert s.items[1].items[1].index == "requests[1].requests[1]"
    assert len(s.requests()) == 4


@pytest.mark.parametrize(("mutate", "where"), [
    (lambda r: r.pop("in"), "requests[1].in: missing"),
    (lambda r: r.update({"in": "12"}), "requests[1].in: expected int"),
    (lambda r: r.update({"out": -1}), "requests[1].out: must be >= 0"),
    (lambda r: r.update({"hash_ids": [1]}), "requests[1].hash_ids: 1 ids for in=128"),
    (lambda r: r.update({"hash_ids": [1, "b"]}), "requests[1].hash_ids: every id must be an integer"),
    (lambda r: r.update({"think_time": -2}), "requests[1].think_time: must be >= 0"),
    (lambda r: r.update({"type": "x"}), "requests[1].type: unknown type 'x'"),
])
def test_malformed_request_names_file_index_field(tmp_path, mutate, where) -> None:
    bad = req(128, 4, [1, 2])
    mutate(bad)
    p = write_session(tmp_path / "bad.json", [req(64, 1, [1]), bad])
    with pytest.raises(SessionFileError) as e:
        load_session(p)
    assert str(e.value).startswith(f"{p}: {where}")


def test_malformed_nested_request_and_file_errors(tmp_path) -> None:
    p = write_session(tmp_path / "n.json", [req(64, 1, [1]), sub("a", req(64, 1, [2]), {"type": "n", "t": 0})])
    with pytest.raises(SessionFileError, match=r"n.json: requests\[1\].requests\[1\].in: missing"):
        load_session(p)
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(SessionFileError, match="x.json: not JSON"):
        load_session(tmp_path / "x.json")
    (tmp_path / "b.json").write_text(json.dumps({"block_size": 0, "requests": []}))
    with pytest.raises(SessionFileError, match=r"b.json: session.block_size: must be positive"):
        load_session(tmp_path / "b.json")
    with pytest.raises(SessionFileError, match="no such file"):
        load_sessions(tmp_path / "missing")
