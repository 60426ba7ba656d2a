"""The closed-loop driver on the virtual clock: prompt synthesis, think-time release, sub-agent nesting,
replacement of finished sessions, and a replay of the real samples behind the router's policy code."""

from __future__ import annotations

import pytest

from tests.agentic.sessions import DATA, req, sub, write_session
from zoe_cluster.agentic.driver import SessionDriver
from zoe_cluster.agentic.prompts import Scaling
from zoe_cluster.agentic.replay import replay_sessions
from zoe_cluster.agentic.trace import load_session, load_sessions
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.tokens import count_text_tokens

KV = 2_000_000  # tokens per simulated replica: small enough to build fast, larger than any sample session


@pytest.fixture(scope="module")
def glm():
    r = RecipeRegistry.default().get("glm-5.3")
    return r, r.default_variant


def drain(driver: SessionDriver, service_s: float = 1.0):
    """Run the driver alone on a fake clock where every request takes `service_s`; (call, start, end) rows."""
    driver.start(0.0)
    rows = []
    inflight = []
    while not driver.done:
        t_rel = driver.next_release_s()
        t_end = min((e for _, e in inflight), default=float("inf"))
        if t_rel <= t_end:
            call = driver.pop()
            inflight.append((call, call.release_s + service_s))
        else:
            done = [x for x in inflight if x[1] == t_end]
            inflight = [x for x in inflight if x[1] != t_end]
            for call, end in done:
                rows.append((call, call.release_s, end))
                driver.finished(call, end)
    return rows


def test_equal_ids_equal_text_and_true_prefix(tmp_path) -> None:
    a = write_session(tmp_path / "a.json", [req(130, 2, [1, 2]), req(200, 2, [1, 2, 3], think=1.0)])
    b = write_session(tmp_path / "b.json", [req(130, 2, [1, 2])])
    d = SessionDriver([load_session(a), load_session(b)], 2, think_cap_s=None)
    calls = [c for c, _, _ in drain(d)]
    a0, a1 = [c for c in calls if c.session_key.endswith(":a")]
    (b0,) = [c for c in calls if c.session_key.endswith(":b")]
    p0, p1 = a0.prompt(), a1.prompt()
    assert count_text_tokens(p0) == 130 and count_text_tokens(p1) == 200
    # the 2 full blocks of the first request are the first 2 blocks of the second; the tail is not shared
    assert p1[: 128 * 4] == p0[: 128 * 4] and p1[: 130 * 4] != p0
    assert a1.reusable_blocks == 2 and a0.reusable_blocks == 0
    # "local" ids: the same ids in another session are other text
    assert b0.prompt()[:256] != p0[:256]
    # a new salt (cache bust) changes every block; the same salt gives the same text again
    again = SessionDriver([load_session(a)], 1, salt=0)
    again.start()
    assert again.pop().prompt() == p0
    bust = SessionDriver([load_session(a)], 1, salt=7)
    bust.start()
    assert bust.pop().prompt()[:256] != p0[:256]


def test_real_sample_prompts_keep_prefixes() -> None:
    (s,) = load_sessions(DATA / "trace_0184.json")
    d = SessionDriver([s], 1, scaling=Scaling(block_tokens=16, max_input_tokens=4000))
    calls = [c for c, _, _ in drain(d)]
    for prev, cur in zip(calls, calls[1:]):
        n = 0
        while n < min(len(prev.block_keys), len(cur.block_keys)) and prev.block_keys[n] == cur.block_keys[n]:
            n += 1
        assert cur.prompt()[: n * 16 * 4] == prev.prompt()[: n * 16 * 4]
        assert count_text_tokens(cur.prompt()) == cur.input_tokens <= 4000


def test_think_time_release_on_the_virtual_clock(tmp_path, glm) -> None:
    p = write_session(tmp_path / "t.json", [req(640, 8, list(range(10))), req(704, 8, list(range(11)), think=5.0),
                                            req(768, 8, list(range(12)), think=500.0)])
    recipe, variant = glm
    d = SessionDriver([load_session(p)], 1, think_cap_s=30.0)
    records: list = []
    rep = replay_sessions(recipe, variant, d, 1, "round_robin", kv_tokens=KV, records_out=records)
    assert rep["completed"] == 3 and rep["dropped"] == 0
    recs = sorted((r.start_s, r.start_s + r.e2e_s) for r in records)
    (s0, e0), (s1, e1), (s2, _) = recs
    assert s0 == 0.0
    assert s1 == pytest.approx(e0 + 5.0)  # released 5 s of think time after the previous response ended
    assert s2 == pytest.approx(e1 + 30.0)  # 500 s capped at 30


def test_subagents_run_together_and_parent_waits(tmp_path) -> None:
    p = write_session(tmp_path / "s.json", [
        req(64, 1, [1]),
        sub("x", req(64, 1, [20]), req(128, 1, [20, 21], think=2.0)),
        sub("y", req(64, 1, [30])),
        req(128, 1, [1, 2], think=3.0),
    ])
    rows = drain(SessionDriver([load_session(p)], 1, think_cap_s=None), service_s=1.0)
    by = {(c.session_key.split(":", 1)[1], c.source.index): (s, e) for c, s, e in rows}
    assert by[("s", "requests[0]")] == (0.0, 1.0)
    # both sub-agents start when the parent's request ends, with their own session keys
    assert by[("s/x", "requests[1].requests[0]")][0] == 1.0 and by[("s/y", "requests[2].requests[0]")][0] == 1.0
    assert by[("s/x", "requests[1].requests[1]")][0] == 2.0 + 2.0
    # the parent resumes after the last sub-agent (x ends at 5) plus its think time
    assert by[("s", "requests[3]")][0] == 5.0 + 3.0


def test_finished_sessions_are_replaced(tmp_path) -> None:
    files = [write_session(tmp_path / f"{n}.json", [req(64, 1, [1])] * k) for n, k in (("a", 1), ("b", 3), ("c", 2))]
    d = SessionDriver([load_session(f) for f in files], 2, think_cap_s=None)
    rows = drain(d, service_s=1.0)
    starts = {}
    for c, s, _ in rows:
        starts.setdefault(c.session_key, s)
    assert starts == {"0:a": 0.0, "1:b": 0.0, "2:c": 1.0}  # c takes a's place when a ends
    assert d.sessions_done == 3 and len(rows) == 6
    # more instances than files: the files cycle as new users
    d2 = SessionDriver([load_session(files[0])], 3)
    assert len(drain(d2)) == 3 and d2.total_sessions == 3


def test_ramp_up_spreads_the_first_sessions_so_repeated_files_are_not_in_lockstep(tmp_path) -> None:
    f = write_session(tmp_path / "a.json", [req(64, 1, [1]), req(128, 1, [1, 2], think=5.0)])
    rows = drain(SessionDriver([load_session(f)], 4, total_sessions=4, think_cap_s=None, ramp_up_s=40.0),
                 service_s=1.0)
    starts = {}
    for c, s, _ in rows:
        starts.setdefault(c.session_key, s)
    assert starts == {"0:a": 0.0, "1:a": 10.0, "2:a": 20.0, "3:a": 30.0}  # the k-th of 4 at k/4 x 40 s
    assert sorted(s for c, s, _ in rows if c.session_key == "1:a") == [10.0, 16.0]  # 1 s served + 5 s think
    with pytest.raises(ValueError, match="ramp-up"):
        SessionDriver([load_session(f)], 1, ramp_up_s=-1.0)


def test_replay_of_real_samples(glm) -> None:
    recipe, variant = glm
    d = SessionDriver(load_sessions(DATA), 2)
    rep = replay_sessions(recipe, variant, d, 2, "prefix", kv_tokens=KV)
    n = sum(len(s.requests()) for s in load_sessions(DATA))
    assert rep["requests"] == rep["completed"] == n and rep["dropped"] == rep["errors"] == 0
    assert 0.5 < rep["reuse_ceiling"] <= 1.0
    assert rep["prefix_hit_rate"] <= rep["reuse_ceiling"] + 1e-9
    assert rep["ttft_p90_s"] >= rep["ttft_floor_p90_s"] * 0.999
    assert rep["output_tok_s_per_gpu"] == pytest.approx(rep["output_tok_s"] / rep["gpus"])
    # deterministic
    again = replay_sessions(recipe, variant, SessionDriver(load_sessions(DATA), 2), 2, "prefix", kv_tokens=KV)
    assert {k: v for k, v in again.items() if k != "wall_s"} == {k: v for k, v in rep.items() if k != "wall_s"}


def test_sim_replay_sessions_cli(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from zoe_cluster.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["sim", "replay", str(DATA), "--sessions", "2", "--model", "glm-5.3", "--replicas", "2",
                              "--kv-tokens", str(KV), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    for k in ("requests", "completed", "dropped", "errors", "prefix_hit_rate", "reuse_ceiling", "ttft_p50_s",
              "ttft_p90_s", "ttft_p99_s", "ttft_floor_p90_s", "itl_p50_s", "itl_p90_s", "e2e_p90_s", "output_tok_s",
              "output_tok_s_per_gpu"):
        assert rep[k] is not None, k
    assert rep["clock"] == "virtual" and rep["live_sessions"] == 2
    bad = write_session(tmp_path / "bad.json", [req(64, 1, [1]), req(64, 1, [1], kind="q")])
    res = runner.invoke(app, ["sim", "replay", str(bad), "--sessions", "1", "--model", "glm-5.3"])
    assert res.exit_code == 2 and "bad.json: requests[1].type: unknown type 'q'" in res.output



def test_sim_replay_slow_factor_cli(glm) -> None:
    """`zoe sim replay --slow-factor` runs the router's slow-replica ejection with the given window and probe
    period, as `replay_sessions(slow_factor=...)` does; its bounds are the router's."""
    import json

    from typer.testing import CliRunner

    from zoe_cluster.cli.main import app

    runner = CliRunner()
    base = ["sim", "replay", str(DATA), "--sessions", "2", "--model", "glm-5.3", "--replicas", "2",
            "--kv-tokens", str(KV)]
    res = runner.invoke(app, [*base, "--slow-factor", "1.5", "--slow-min-samples", "2", "--slow-probe-s", "0.5",
                              "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["slow_factor"], rep["slow_min_samples"], rep["slow_probe_s"]) == (1.5, 2, 0.5)
    recipe, variant = glm
    direct = replay_sessions(recipe, variant, SessionDriver(load_sessions(DATA), 2), 2, "prefix", kv_tokens=KV,
                             slow_factor=1.5, slow_min_samples=2, slow_probe_s=0.5)
    assert {k: v for k, v in rep.items() if k != "wall_s"} == json.loads(json.dumps(
        {k: v for k, v in direct.items() if k != "wall_s"}))
    off = json.loads(runner.invoke(app, [*base, "--json"]).stdout)
    assert "slow_ejections" not in off  # off unless asked, unlike `zoe router` (slow_factor 3)
    for args, says in ((["--slow-factor", "1"], "--slow-factor: Input should be greater than 1"),
                       (["--slow-factor", "2", "--slow-min-samples", "0"], "--slow-min-samples:"),
                       (["--slow-probe-s", "1"], "go with --slow-factor")):
        res = runner.invoke(app, [*base, *args])
        assert res.exit_code == 2 and says in res.output, res.output
    res = runner.invoke(app, ["sim", "replay", str(DATA), "--model", "glm-5.3", "--slow-factor", "2"])
    assert res.exit_code == 2 and "give --sessions" in res.output

def test_short_blocks_still_differ() -> None:
    from zoe_cluster.agentic.prompts import block_key, prompt_text

    keys = tuple(block_key(0, h) for h in range(2000))
    text = prompt_text(keys, 4, 4 * len(keys), "t")
    blocks = [text[i * 16:(i + 1) * 16] for i in range(len(keys))]
    assert len(set(blocks)) == len(blocks)
    assert prompt_text(keys[:10], 4, 40, "a") == text[:160]


def test_sweep_plot_writes_a_png(tmp_path) -> None:
    from zoe_cluster.agentic.plot import plot_sweep

    pts = [{"tok_s_per_user_p90": 50.0 - n, "output_tok_s_per_gpu": float(n), "live_sessions": n} for n in (1, 4)]
    out = plot_sweep({"prefix": pts, "empty": [{"live_sessions": 1}]}, tmp_path / "s.png", "sweep")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_slow_replica_guard_ejects_probes_and_recovers() -> None:
    """The router's slow-replica decisions on the virtual clock: a replica whose median time per token is over
    the factor x its peers' leaves the candidates, gets one probe per probe period, and returns once a probe is
    fast."""
    from zoe_cluster.agentic.replay import SlowReplicaGuard
    from zoe_cluster.routing import get_policy
    from zoe_cluster.routing.context import ReplicaView, RequestContext, RoutingDecision

    guard = SlowReplicaGuard(get_policy("least_load"), factor=3.0, min_samples=2, probe_s=2.0, judge_every_s=0.0)
    views = [ReplicaView(f"r/{i}/0", f"sim://{i}") for i in range(3)]
    n = 0

    def route(now: float) -> RoutingDecision:
        nonlocal n
        n += 1
        ctx = RequestContext(request_id=f"q{n}", model="m", prompt_tokens=10, max_tokens=4, block_hashes=(),
                             block_tokens=16, arrival_s=now)
        d = guard.select(ctx, views)
        guard.on_routed(ctx, d)
        return d

    for t in range(6):  # every replica gets samples: r/0 at 10x the others' time per token
        for v in views:
            ctx = RequestContext(request_id=f"s{t}{v.replica_id}", model="m", prompt_tokens=10, max_tokens=4,
                                 block_hashes=(), block_tokens=16, arrival_s=float(t))
            guard.on_routed(ctx, RoutingDecision(v.replica_id, "least_load"))
            guard.record(ctx.request_id, 0.2 if v.replica_id == "r/0/0" else 0.02, float(t))
    assert set(guard.slow) == {"r/0/0"} and guard.ejections == 1
    assert route(6.0).reason == "probe"  # slow since t=1: its probe is due
    assert all(route(6.1 + i * 0.1).replica_id != "r/0/0" for i in range(5))  # left out until the next period
    probe = route(8.1)
    assert (probe.replica_id, probe.reason) == ("r/0/0", "probe")
    assert route(8.2).replica_id != "r/0/0"  # one probe per period
    guard.record("q%d" % (n - 1), 0.02, 9.0)  # the probe was fast: its sample replaces the window
    assert not guard.slow
