"""CSA dual-scope decode (`zoe_kernels.csa.dual_scope_decode`) against a float64 reference."""

import pytest
import torch

from tests.kernels._sparse_device import DEVICE, FP8, ON_GPU
from zoe_kernels.csa import dual_scope_decode, topk
from zoe_kernels.csa.reference import dual_scope_decode_reference

pytestmark = pytest.mark.kernels

# relative-error bounds: fp32 operands (ieee dots) far under 1e-3; fp16/bf16 dot operands round K, V and P
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def _case(b, h, d, w, nc, k, dtype, fp8_kv, gen):
    q = torch.randn(b, h, d, generator=gen).to(dtype)
    win_len = torch.randint(0, w + 1, (b,), generator=gen)
    win_len[0] = w
    idx = torch.stack([torch.randperm(nc, generator=gen)[:k] for _ in range(b)]).int()
    if b > 1:
        idx[1, k // 2:] = -1  # fewer selected entries than k
    if b > 2:
        idx[2] = -1
        win_len[2] = 0  # no entry at all: zeros (or the sink alone)
    args = {"q": q, "win_len": win_len, "comp_idx": idx}
    for scope, n in (("win", w), ("comp", nc)):
        kv = {"k": torch.randn(b, n, d, generator=gen), "v": torch.randn(b, n, d, generator=gen)}
        for name, t in kv.items():
            if fp8_kv or name == "k":  # keys are always fp8 here; values fp8 too when fp8_kv
                scale = torch.rand(b, n, generator=gen) + 0.5
                args[f"{scope}_{name}"] = (t / scale[..., None]).to(FP8)
                args[f"{scope}_{name}_scale"] = scale
            else:
                args[f"{scope}_{name}"] = t.to(dtype)
    return args


def _run(args, **kw):
    dev = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
    q, wk, wv, wl, ck, cv, ci = (dev.pop(n) for n in ("q", "win_k", "win_v", "win_len", "comp_k", "comp_v", "comp_idx"))
    kw = {n: (t.to(DEVICE) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    return dual_scope_decode(q, wk, wv, wl, ck, cv, ci, **dev, **kw)


def _reference(args, **kw):
    a = dict(args)
    q, wk, wv, wl, ck, cv, ci = (a.pop(n) for n in ("q", "win_k", "win_v", "win_len", "comp_k", "comp_v", "comp_idx"))
    kw = {n: v for n, v in kw.items() if n in ("sink", "sm_scale")}
    return dual_scope_decode_reference(q, wk, wv, wl, ck, cv, ci, **a, **kw)


def _check(out, ref, dtype):
    out = out.cpu().double()
    assert torch.isfinite(out).all()
    err = (out - ref).norm() / ref.norm()
    assert err < TOL[dtype], f"relative error {err:.2e} for {dtype}"


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])  # bf16: GPU only (interpreter)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("splits", [1, 3, None])
def test_dual_scope_decode_matches_reference(dtype, with_sink, splits):
    gen = torch.Generator().manual_seed(hash((str(dtype), with_sink, splits)) % 2**31)
    b, h, d, w, nc, k = 3, 8, 64, 20, 90, 40
    args = _case(b, h, d, w, nc, k, dtype, fp8_kv=False, gen=gen)
    kw = {"sink": torch.randn(h, generator=gen)} if with_sink else {}
    out = _run(args, splits=splits, block_kv=16, **kw)
    assert out.shape == (b, h, d) and out.dtype == dtype
    ref = _reference(args, **kw)
    _check(out, ref, dtype)
    if not with_sink:
        assert (out[2].cpu() == 0).all()  # no entries and no sink


# the entry loop's schedules (dual_scope_decode.py): 0 two loops, 2 one compiler-pipelined loop with the
# indices loaded up front, 3 two passes (dual_scope_two_pass.py: scores, then values by column block)


@pytest.mark.parametrize("schedule", [0, 2, 3])
@pytest.mark.parametrize("splits,qk_fp16", [(1, False), (3, True)])
def test_entry_loop_schedules_match_reference(schedule, splits, qk_fp16):
    # odd sizes: a window of 21 (not a tile multiple), 37 selected entries with -1 holes, 12 heads, a row
    # with no entry and one with a short window; fresh draws per case, the sink in half of them
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(100 * schedule + 10 * qk_fp16 + splits)
    b, h, d, w, nc, k = 4, 12, 64, 21, 75, 37
    args = _case(b, h, d, w, nc, k, dtype, fp8_kv=False, gen=gen)
    args["comp_idx"][3, ::5] = -1
    kw = {"sink": torch.randn(h, generator=gen)} if splits == 3 else {}
    # qk_fp16: the score dots in fp16 on a power-of-two scaled q (the keys are fp8)
    out = _run(args, splits=splits, block_kv=16, schedule=schedule, qk_fp16=qk_fp16, **kw)
    assert out.shape == (b, h, d) and out.dtype == dtype
    _check(out, _reference(args, **kw), dtype)
    if not kw:
        assert (out[2].cpu() == 0).all()  # no entries and no sink


@pytest.mark.parametrize("schedule", [0, 2])
@pytest.mark.parametrize("lazy_rescale,defer_sum,qk_fp16", [(True, False, False), (False, True, True),
                                                           (True, True, True)])
def test_lazy_rescale_and_deferred_sums_match_reference(schedule, lazy_rescale, defer_sum, qk_fp16):
    # keys scaled up along the compressed sequence and a large sm_scale: row maxima grow by more than 2^8 on
    # later tiles (the rescale branch runs mid-loop) and by less on others (probabilities above 1 against a
    # stale maximum); -1 holes, a short window, a row with no entry, the sink and splits in some cases
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(300 + 100 * schedule + 10 * lazy_rescale + defer_sum)
    b, h, d, w, nc, k = 4, 12, 64, 21, 75, 37
    args = _case(b, h, d, w, nc, k, dtype, fp8_kv=False, gen=gen)
    args["comp_k_scale"] = args["comp_k_scale"] * torch.linspace(0.5, 3.0, nc)
    args["comp_idx"][0] = args["comp_idx"][0].sort().values  # ascending key scales: the maximum keeps growing
    args["comp_idx"][3, ::5] = -1
    splits = 3 if defer_sum else 1
    kw = {"sink": torch.randn(h, generator=gen)} if splits == 3 else {}
    out = _run(args, splits=splits, block_kv=16, schedule=schedule, qk_fp16=qk_fp16, lazy_rescale=lazy_rescale,
               defer_sum=defer_sum, sm_scale=0.5, **kw)
    _check(out, _reference(args, sm_scale=0.5, **kw), dtype)
    if not kw:
        assert (out[2].cpu() == 0).all()  # no entries and no sink


def test_lazy_rescale_with_fp16_q_and_fp8_values():
    # fp16 q with value scales keeps the eager rescale (P times a scale could pass fp16's range)
    gen = torch.Generator().manual_seed(44)
    args = _case(3, 20, 32, 33, 70, 25, torch.float16, fp8_kv=True, gen=gen)
    out = _run(args, splits=2, block_kv=16, block_h=16, lazy_rescale=True, defer_sum=True)
    _check(out, _reference(args), torch.float16)


def test_one_loop_schedule_with_fp8_values_and_fp32():
    # fp8 values (value scales on the probabilities) and fp32 operands (ieee dots)
    gen = torch.Generator().manual_seed(42)
    args = _case(3, 20, 32, 33, 70, 25, torch.float32, fp8_kv=True, gen=gen)
    out = _run(args, splits=2, block_kv=16, block_h=16, sm_scale=0.3, schedule=2)
    _check(out, _reference(args, sm_scale=0.3), torch.float32)


@pytest.mark.parametrize("splits", [1, 3])
def test_two_pass_fp8_score_dots(splits):
    # the scores pass's fp8 MMAs on q split into two e4m3 parts per head, heads of magnitudes 1e-3 to 1e2. On
    # the GPU the split is exact for bf16 q: the output matches the bf16 score dots' to accumulation order. The
    # CPU interpreter misrounds float32 -> e4m3 (127.5 -> 64 in Triton 3.9's), so there it takes fp16 q holding
    # bf16 values and a looser bound
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(90 + splits)
    args = _case(4, 12, 64, 21, 75, 37, dtype, fp8_kv=False, gen=gen)
    args["q"] = (args["q"].float() * torch.logspace(-3, 2, 12)[None, :, None]).to(torch.bfloat16).to(dtype)
    args["comp_idx"][3, ::5] = -1
    kw = {"sink": torch.randn(12, generator=gen)} if splits == 3 else {}
    out = _run(args, schedule=3, qk_fp8=True, block_kv=16, splits=splits, sm_scale=0.2, **kw)
    ref = _reference(args, sm_scale=0.2, **kw)
    err = (out.cpu().double() - ref).norm() / ref.norm()
    assert torch.isfinite(out.cpu()).all() and err < (TOL[dtype] if ON_GPU else 1e-2)
    if ON_GPU:
        plain = _run(args, schedule=3, qk_fp8=False, block_kv=16, splits=splits, sm_scale=0.2, **kw)
        assert ((out - plain).float().norm() / plain.float().norm()) < 2e-3
    if not kw:
        assert (out[2].cpu() == 0).all()


@pytest.mark.skipif(not ON_GPU, reason="the Gluon passes need a Hopper GPU")
@pytest.mark.parametrize("block_dv,values_warps,stages,splits,with_sink", [(128, 4, 3, None, False),
                                                                          (64, 4, 4, 3, True),
                                                                          (256, 8, 2, 1, True)])
def test_two_pass_gluon_on_gpu(block_dv, values_warps, stages, splits, with_sink):
    # the Hopper passes (dual_scope_two_pass_gluon.py) against the reference and against the Triton passes on
    # the same inputs: 70 heads (a second, part-masked head block), a ragged window, -1 holes, a sequence with
    # no entry, tiles past the selection's end; the scores pass alone in Gluon too
    from zoe_kernels.csa.dual_scope_two_pass import gluon_values_supported

    gen = torch.Generator().manual_seed(70 + block_dv + stages)
    args = _case(5, 70, 512, 100, 600, 300, torch.bfloat16, fp8_kv=False, gen=gen)
    args["comp_idx"][3, ::7] = -1
    kw = {"sink": torch.randn(70, generator=gen)} if with_sink else {}
    cfg = dict(schedule=3, block_dv=block_dv, values_warps=values_warps, num_stages=stages, values_stages=stages,
               splits=splits, **kw)
    probe = torch.empty(1, dtype=torch.bfloat16, device=DEVICE)
    if not gluon_values_supported(probe, probe, probe, 64, block_dv, 64):
        pytest.skip("no sm_90 GPU with Gluon")
    out = _run(args, gluon_values=True, gluon_scores=True, **cfg)
    _check(out, _reference(args, **kw), torch.bfloat16)
    plain = _run(args, gluon_values=False, gluon_scores=False, **cfg)
    scores_only = _run(args, gluon_values=False, gluon_scores=True, **cfg)
    for other in (plain, scores_only):
        assert ((out.float() - other.float()).norm() / other.float().norm()) < 2e-3
    if not with_sink:
        assert (out[2].cpu() == 0).all()


@pytest.mark.skipif(not ON_GPU, reason="the one-pass Gluon kernel needs a Hopper GPU")
@pytest.mark.parametrize("block_dv,block_kv,stages,splits,with_sink", [(256, 64, 3, None, True), (128, 64, 2, 3, True),
                                                                      (256, 32, 3, 2, False), (256, 64, 3, 1, False),
                                                                      (256, 32, 2, 1, True), (512, 32, 3, None, True),
                                                                      (512, 32, 3, 2, False), (512, 32, 2, 1, True),
                                                                      (512, 32, 3, 1, True)])
def test_fused_gluon_on_gpu(block_dv, block_kv, stages, splits, with_sink):
    # the one-pass Hopper kernel (schedule 4; stages: key slots) against the reference and against the two-pass
    # schedule on the same inputs: 70 heads (a second, part-masked head block), a ragged window shorter than its
    # tiles, -1 holes, a sequence with no entry, tiles past the selection's end, one split (the output written by
    # the program) and several (partials merged); up to 256 value columns: one compute warpgroup and loader warps
    # (dual_scope_fused_ws_gluon.py), 512: two warpgroups (dual_scope_fused_gluon.py), with two key slots or three
    from zoe_kernels.csa.dual_scope_decode import _fused_config, fused_supported
    from zoe_kernels.platform import current_target

    gen = torch.Generator().manual_seed(60 + block_dv + block_kv + stages)
    args = _case(5, 70, 512, 100, 600, 300, torch.bfloat16, fp8_kv=False, gen=gen)
    args["comp_idx"][3, ::7] = -1
    kw = {"sink": torch.randn(70, generator=gen)} if with_sink else {}
    q = torch.empty(1, 1, 512, dtype=torch.bfloat16, device=DEVICE)
    k8 = torch.empty(1, 1, 512, dtype=FP8, device=DEVICE)
    cfg = _fused_config(5, 70, 512, 400, 300, block_dv=block_dv, block_kv=block_kv, splits=splits, num_stages=stages,
                        target=current_target())
    if not fused_supported(q, k8, k8, q, q, False, 0.1, cfg):
        pytest.skip("no sm_90 GPU with Gluon")
    # heads of magnitudes 1e-2 to 1e1: wide score ranges, the running maximum moving across tiles
    args["q"] = (args["q"].float() * torch.logspace(-2, 1, 70)[None, :, None]).to(torch.bfloat16)
    out = _run(args, schedule=4, block_dv=block_dv, block_kv=block_kv, num_stages=stages, splits=splits, **kw)
    ref = _reference(args, **kw)
    _check(out, ref, torch.bfloat16)
    if block_dv == 512:
        # two warpgroups keep four score accumulators, so this form is closer to the reference than the two-pass
        # schedule (H200: 1.9e-3 against 5.4-6.3e-3 on these inputs); the two differ by their errors' sum
        assert (out.cpu().double() - ref).norm() / ref.norm() < 3e-3
    else:
        two = _run(args, schedule=3, **kw)
        assert ((out.float() - two.float()).norm() / two.float().norm()) < 4e-3
    if not with_sink:
        assert (out[2].cpu() == 0).all()


def test_split_q_kernel():
    # q's two e4m3 parts for the one-pass Gluon kernel, heads of magnitudes 1e-3 to 1e2 and a masked head block:
    # (hi + lo) / c is q (on the GPU to 2^-16 of each head's largest; the CPU interpreter misrounds float32 ->
    # e4m3, so there within 1e-2), and the stored score scale is qk_scale_log2 / c with c a power of two
    import triton

    from zoe_kernels.csa.dual_scope_tiles import split_q_kernel

    gen = torch.Generator().manual_seed(31)
    b, h, d = 3, 20, 128
    q = (torch.randn(b, h, d, generator=gen) * torch.logspace(-3, 2, h)[None, :, None]).to(torch.bfloat16)
    qd = q.to(DEVICE) if ON_GPU else q.to(torch.float16)  # the interpreter's numpy has no bfloat16
    q8 = torch.full((b, 2, h, d), float("nan"), device=DEVICE).to(FP8)
    qs = torch.full((b, h), float("nan"), device=DEVICE)
    split_q_kernel[(b, triton.cdiv(h, 16))](qd, q8, qs, h, 0.5, qd.stride(0), qd.stride(1), D=d, BH=16, PDL=False)
    c = 0.5 / qs.cpu().double()
    assert torch.isfinite(c).all() and (torch.log2(c) == torch.log2(c).round()).all()
    back = (q8[:, 0].cpu().double() + q8[:, 1].cpu().double()) / c[..., None]
    err = (back - q.double()).abs().amax(dim=-1) / q.double().abs().amax(dim=-1)
    assert err.max() <= (2**-16 if ON_GPU else 1e-2)  # values under ~2^-11 of their head's largest: 2^-18 absolute


def test_fused_schedule_rejected_where_it_cannot_run():
    # schedule 4 on inputs it cannot take (fp16 q here; on the CPU nothing; a negative softmax scale, which the
    # kernel's maximum-before-scaling cannot take): a clear error, not a wrong answer
    gen = torch.Generator().manual_seed(5)
    args = _case(2, 4, 128, 8, 20, 6, torch.float16, fp8_kv=False, gen=gen)
    with pytest.raises(ValueError, match="schedule 4"):
        _run(args, schedule=4)
    bf16 = _case(2, 4, 128, 8, 20, 6, torch.bfloat16, fp8_kv=False, gen=gen)
    with pytest.raises(ValueError, match="positive sm_scale"):
        _run(bf16, schedule=4, sm_scale=-0.1)


def test_fused_shared_memory_model():
    # the launcher's shared-memory model of the one-pass kernel. One warpgroup with loader warps, H=64, D=512,
    # W=128, k=512: 64-entry tiles, 8 rows of staged validity bytes, 2 key slots (the default) take 197,924 bytes
    # in the sm_90a compile and 3 take 230,980; the model is at most 256 bytes above (the allocator's alignment).
    # D=1024 fits neither
    from zoe_kernels.csa.dual_scope_decode import _fused_config, _fused_shape_ok, _fused_smem_bytes
    from zoe_kernels.platform import TARGETS

    h200 = TARGETS["sm_90"]
    for slots, compiled in ((2, 197_924), (3, 230_980)):
        assert 0 <= _fused_smem_bytes(512, 256, 64, slots, 8) - compiled <= 256
    assert 0 <= _fused_smem_bytes(512, 128, 64, 2, 8) - 165_156 <= 256
    assert _fused_shape_ok(512, 256, 64, 3, 8, h200.lds_bytes) and not _fused_shape_ok(512, 256, 64, 3, 8, 230_979)
    fused = dict(block_dv=None, block_kv=None, splits=None, num_stages=None, target=h200)
    cfg = _fused_config(64, 64, 512, 640, 512, **fused | {"block_dv": 256})
    assert (cfg["block_kv"], cfg["num_stages"], cfg["splits"], cfg["fits"]) == (64, 2, 1, True)
    big_k = _fused_config(64, 64, 512, 2176, 2048, **fused | {"block_dv": 256})
    assert (big_k["num_stages"], big_k["fits"]) == (2, True)
    # two warpgroups over all 512 value columns (the B=128 default): 64-entry tiles pass 227 KB even at 2 key
    # slots; 32-entry ones at 3 key slots, 16 rows of staged indices and the probabilities' hand-over take 186,752
    # bytes, what the sm_90a compile reports
    wide = _fused_config(128, 64, 512, 640, 512, **fused)
    assert (wide["block_dv"], wide["block_kv"], wide["num_stages"], wide["splits"], wide["num_warps"]) == (
        512, 32, 3, 1, 8)
    assert not _fused_shape_ok(512, 512, 64, 2, 8, h200.lds_bytes)
    assert _fused_shape_ok(512, 512, 32, 3, 16, 186_752) and not _fused_shape_ok(512, 512, 32, 3, 16, 186_751)
    assert not _fused_config(64, 64, 1024, 640, 512, **fused)["fits"]
    # the shared memory comes from the target: D=512 passes gfx950's 160 KiB of LDS even at 2 key slots
    # (199,168 bytes), D=256 fits it at 3 (150,272); gfx942's 64 KiB holds neither
    for arch, fits in (("gfx950", (False, True)), ("gfx942", (False, False))):
        amd = fused | {"target": TARGETS[arch]}
        assert (_fused_config(64, 64, 512, 640, 512, **amd)["fits"],
                _fused_config(64, 64, 256, 640, 512, **amd)["fits"]) == fits


@pytest.mark.parametrize("block_h,block_dv,splits", [(16, 16, 1), (32, 64, 4)])
def test_two_pass_head_and_column_blocks(block_h, block_dv, splits):
    # two passes over 20 heads in blocks of 16 or 32 (the last one part-masked), value columns in blocks,
    # fp8 values (their scales folded into the stored probabilities), fp32 operands (ieee dots), the sink, a
    # window of 33 (not a tile multiple)
    gen = torch.Generator().manual_seed(80 + block_h + splits)
    args = _case(3, 20, 64, 33, 70, 25, torch.float32, fp8_kv=True, gen=gen)
    sink = torch.randn(20, generator=gen)
    out = _run(args, schedule=3, block_h=block_h, block_dv=block_dv, block_kv=16, splits=splits, sm_scale=0.3,
               sink=sink)
    _check(out, _reference(args, sm_scale=0.3, sink=sink), torch.float32)


@pytest.mark.parametrize("block_kv,splits", [(16, 1), (32, 2)])
def test_all_heads_per_program(block_kv, splits):
    # block_h=64 over 40 heads (the masked head rows carry no state into the output), one-loop schedule
    dtype = torch.bfloat16 if ON_GPU else torch.float16
    gen = torch.Generator().manual_seed(60 + block_kv + splits)
    args = _case(3, 40, 64, 27, 80, 45, dtype, fp8_kv=False, gen=gen)
    sink = torch.randn(40, generator=gen)
    out = _run(args, block_h=64, block_kv=block_kv, splits=splits, schedule=2, sink=sink)
    _check(out, _reference(args, sink=sink), dtype)


def test_schedules_fall_back_when_scopes_differ_in_dtype():
    # the one-loop schedule selects between the scopes' row pointers: an fp16 window with fp8 compressed keys
    # takes the two-loop schedule instead
    gen = torch.Generator().manual_seed(77)
    args = _case(2, 8, 64, 16, 50, 20, torch.float16, fp8_kv=False, gen=gen)
    args["win_k"] = (args["win_k"].float() * args.pop("win_k_scale")[..., None]).to(torch.float16)
    out = _run(args, block_kv=16, schedule=2)
    _check(out, _reference(args), torch.float16)


@pytest.mark.parametrize("splits", [1, 2])
def test_value_column_blocks_with_sink(splits):
    # block_dv < D: each program owns part of the value columns and recomputes the scores over all of D
    gen = torch.Generator().manual_seed(23 + splits)
    args = _case(3, 16, 64, 24, 60, 30, torch.float16, fp8_kv=False, gen=gen)
    sink = torch.randn(16, generator=gen)
    out = _run(args, splits=splits, block_kv=16, block_dv=16, block_h=16, sink=sink)
    _check(out, _reference(args, sink=sink), torch.float16)


def test_fp8_values_odd_heads_and_custom_scale():
    gen = torch.Generator().manual_seed(5)
    args = _case(2, 20, 32, 33, 70, 25, torch.float32, fp8_kv=True, gen=gen)
    out = _run(args, splits=2, block_kv=16, sm_scale=0.3, block_h=16)
    _check(out, _reference(args, sm_scale=0.3), torch.float32)


def test_topk_indices_feed_dual_scope_decode():
    gen = torch.Generator().manual_seed(9)
    b, h, d, w, nc, k = 2, 4, 32, 16, 300, 32
    args = _case(b, h, d, w, nc, k, torch.float32, fp8_kv=False, gen=gen)
    scores = torch.randn(b, nc, generator=gen)
    lengths = torch.tensor([300, 20])  # the second request has fewer entries than k: -1 padded
    args["comp_idx"] = topk(scores.to(DEVICE), lengths.to(DEVICE), k, tile=512).cpu()
    assert (args["comp_idx"][1, 20:] == -1).all()
    _check(_run(args, block_kv=16), _reference(args), torch.float32)


def test_bad_inputs_raise_clear_errors():
    gen = torch.Generator().manual_seed(3)
    args = _case(2, 4, 32, 8, 20, 8, torch.float32, fp8_kv=False, gen=gen)
    missing = dict(args)
    missing.pop("win_k_scale")
    with pytest.raises(ValueError, match="win_k is fp8"):
        _run(missing)
    with pytest.raises(ValueError, match="sink must be"):
        _run(args, sink=torch.zeros(5))
    bad = dict(args)
    bad["comp_v"] = bad["comp_v"][:, :, :16].contiguous()
    with pytest.raises(ValueError, match="comp_v must be"):
        _run(bad)
    with pytest.raises(ValueError, match="schedule must be"):
        _run(args, schedule=1)


def test_launch_config_batch_regimes():
    # the defaults measured fastest on the H200 at H=64, D=512 (launch_config's docstring)
    from zoe_kernels.csa.dual_scope_decode import launch_config

    pick = ("block_h", "num_warps", "block_kv", "schedule", "num_stages", "splits")
    cfg = {b: tuple(launch_config(b, 64, 512, 640)[k] for k in pick) for b in (1, 8, 32, 64, 128)}
    assert cfg[1] == (16, 4, 64, 2, 2, 10)
    assert cfg[8] == (32, 8, 64, 0, 2, 10) and cfg[32] == (32, 8, 64, 0, 2, 1)
    assert cfg[64] == (32, 4, 32, 0, 2, 2)
    assert cfg[128] == (64, 8, 32, 2, 3, 1)
    # scopes of different dtypes keep the two loops; fp32 q keeps 32 heads and 8 warps
    assert launch_config(128, 64, 512, 640, one_loop=False)["schedule"] == 0
    assert launch_config(128, 64, 512, 640, q_bytes=4)["block_h"] == 32
    # softmax options (qk_fp16, lazy_rescale, defer_sum) by regime; an explicit choice wins
    opts = ("qk_fp16", "lazy_rescale", "defer_sum")
    flags = {b: tuple(launch_config(b, 64, 512, 640)[k] for k in opts) for b in (1, 8, 32, 64, 128)}
    assert flags[1] == (True, False, False) and flags[8] == flags[32] == (False, False, False)
    assert flags[64] == (True, True, True) and flags[128] == (False, False, True)
    assert not launch_config(64, 64, 512, 640, qk_fp16=False)["qk_fp16"]
    # the two-pass schedule: all 64 heads per program, 128-column value blocks, scores programs to fill the GPU
    two = launch_config(8, 64, 512, 640, schedule=3)
    assert (two["block_h"], two["block_dv"], two["block_kv"], two["splits"]) == (64, 128, 64, 10)
    assert launch_config(64, 64, 512, 640, schedule=3)["splits"] == 2  # 128 scores programs: one wave
    assert launch_config(64, 64, 512, 640, schedule=3, one_loop=False)["schedule"] == 0
    # bf16 q over fp8 keys (fp8 score dots): the two-pass schedule from B=32 on
    two_pass = {b: launch_config(b, 64, 512, 640, fp8_scores=True) for b in (16, 32, 64, 128)}
    assert two_pass[16]["schedule"] == 0
    assert [(two_pass[b]["schedule"], two_pass[b]["splits"]) for b in (32, 64, 128)] == [(3, 4), (3, 2), (3, 1)]
    # where Gluon runs (Hopper) the one-pass Gluon kernel from B=8, with 256-column value blocks and 64-entry tiles
    # at 2 key slots (one warpgroup and loader warps) or all value columns and 32-entry tiles (from B=67), and
    # splits to fill a wave; its shared
    # memory does not fit D=1024, which keeps the two passes; B=1 keeps the one pass
    gluon = {b: launch_config(b, 64, 512, 640, fp8_scores=True, gluon=True, selected=512) for b in (1, 4, 8, 16, 64)}
    assert {b: c["schedule"] for b, c in gluon.items()} == {1: 2, 4: 2, 8: 4, 16: 4, 64: 4}
    assert [(gluon[b]["block_dv"], gluon[b]["block_kv"], gluon[b]["num_stages"], gluon[b]["splits"])
            for b in (8, 64)] == [(256, 64, 2, 8), (256, 64, 2, 1)]
    # all value columns in two warpgroups (32-entry tiles, 8 warps) from where one wave of them holds one program a
    # sequence (B > 66 on 132 SMs; MI355X's 256 CUs: B > 128)
    wide = {b: launch_config(b, 64, 512, 640, fp8_scores=True, gluon=True, selected=512) for b in (64, 66, 67, 128)}
    assert {b: (c["block_dv"], c["block_kv"], c["num_warps"]) for b, c in wide.items()} == {
        64: (256, 64, 4), 66: (256, 64, 4), 67: (512, 32, 8), 128: (512, 32, 8)}
    from zoe_kernels.csa.dual_scope_decode import _fused_config
    from zoe_kernels.platform import TARGETS

    gfx950 = TARGETS["gfx950"]
    assert [_fused_config(b, 64, 512, 640, 512, block_dv=None, block_kv=None, splits=None, num_stages=None,
                          target=gfx950)["block_dv"] for b in (128, 129)] == [256, 512]
    assert launch_config(64, 64, 1024, 640, fp8_scores=True, gluon=True, selected=512)["schedule"] == 3
    # schedules have names; the integers still select them
    from zoe_kernels.csa.dual_scope_decode import Schedule

    assert launch_config(1, 64, 512, 640)["schedule"] is Schedule.ONE_LOOP
    assert launch_config(8, 64, 512, 640, schedule=Schedule.TWO_PASS)["schedule"] == 3


def test_launch_config_follows_the_target():
    # the split counts come from the target's compute units: the H200's 132 SMs (the numbers above), MI355X's 256
    # CUs and MI300X's 304 give more splits where a batch leaves the GPU short of programs
    from zoe_kernels.csa.dual_scope_decode import launch_config
    from zoe_kernels.platform import TARGETS, compile_for

    cfg = {arch: [launch_config(b, 64, 512, 640, target=t) for b in (1, 64, 128)] for arch, t in TARGETS.items()}
    assert {arch: [c["splits"] for c in cs] for arch, cs in cfg.items()} == {
        "sm_90": [10, 2, 1], "gfx950": [20, 4, 2], "gfx942": [20, 4, 2]}
    # and the entry tiles from its shared memory: 64-entry fp8 key + bf16 value tiles (96 KiB each) fit the H200's
    # 227 KiB twice over, not gfx950's 160 KiB at two stages (async copies hold both) nor gfx942's 64 KiB; at B=128
    # (three stages) gfx942 holds two 16-entry tiles
    assert {arch: [c["block_kv"] for c in cs] for arch, cs in cfg.items()} == {
        "sm_90": [64, 32, 32], "gfx950": [32, 32, 32], "gfx942": [32, 32, 16]}
    # TWO_PASS's scores tiles per backend: 16 entries on CDNA (larger tiles spill there), so B=8 splits its 40 tiles
    # over 38 programs of gfx942's 304 CUs
    two_pass = [launch_config(b, 64, 512, 640, schedule=3, target=TARGETS["gfx942"]) for b in (8, 64)]
    assert [(c["block_kv"], c["num_stages"], c["splits"]) for c in two_pass] == [(16, 2, 38), (16, 2, 4)]
    # one wave per SIMD on wave64 targets (8-wave programs spill there), the regimes' warps on the H200
    assert [launch_config(b, 64, 512, 640, target=TARGETS["gfx950"])["num_warps"] for b in (1, 8, 128)] == [4, 4, 4]
    assert [launch_config(b, 64, 512, 640, target=TARGETS["sm_90"])["num_warps"] for b in (1, 8, 128)] == [4, 8, 8]
    with compile_for(TARGETS["gfx950"]):  # the default target is the compile target inside compile_for
        assert launch_config(64, 64, 512, 640)["splits"] == 4


@pytest.mark.skipif(not ON_GPU, reason="the production shape needs a GPU")
@pytest.mark.parametrize("schedule,qk_fp16", [(None, None), (3, False), (3, True)])
def test_production_shape_on_gpu(schedule, qk_fp16):
    gen = torch.Generator().manual_seed(17)
    args = _case(8, 64, 512, 128, 4096, 512, torch.bfloat16, fp8_kv=False, gen=gen)
    sink = torch.randn(64, generator=gen)
    out = _run(args, sink=sink, schedule=schedule, qk_fp16=qk_fp16)
    _check(out, _reference(args, sink=sink), torch.bfloat16)
