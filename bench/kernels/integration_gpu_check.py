"""GPU check of the engine integration: a tiny MoE layer through the patched experts matches the unpatched one.

    python bench/kernels/integration_gpu_check.py [--out bench/kernels/results/integration_gpu_check.json]

What it runs for the fused MoE, per format (bf16; fp8 with 128x128 block scales) and M in
{1, 8, 64, 256, 512, 1024}:
1. "vllm": when vLLM is importable with a GPU, a real `TritonExperts` (vLLM's Triton MoE experts, the class
   the zoe plugin patches on CUDA/ROCm): its own `apply` (unpatched), then the same call after
   `install_kernel` put zoe's wrapper in (patched: zoe's kernel below the crossover, vLLM's above).
2. "stand-in": always. A class with vLLM's experts `apply` signature whose own path is zoe's float32
   PyTorch reference; patched with the same wrapper (`vllm_moe.make_apply_wrapper`). This checks the
   wrapper's plumbing (format detection, FP8 activation hand-over, dispatch by M, output copy) on the GPU
   without vLLM.
Each row records the path the wrapper took (from the kernel report), and the error of the patched output
against the unpatched one relative to the unpatched output's largest magnitude. The run fails (exit 1) if
any row is over its tolerance (bf16 2e-2, fp8 6e-2) or if the path taken contradicts `moe_impl_for`.

For the lightning indexer (GPU only): vLLM's CUDA indexer wrapper around a float32 torch stand-in for
DeepGEMM's logits, at a prefill (512 x 4096 keys) and a decode-like (4 x 65536) shape, H=64: the patched
call must take zoe's path and match within 1e-3 (relative to the largest logit) with -inf outside [ks, ke).

On the CPU (`--device cpu`, with TRITON_INTERPRET=1) it runs the MoE stand-in at tiny shapes as a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from zoe_kernels.dispatch import moe_impl_for  # noqa: E402
from zoe_kernels.integrations import vllm_moe  # noqa: E402
from zoe_kernels.integrations.patching import PatchSpec, install_kernel, uninstall  # noqa: E402
from zoe_kernels.integrations.report import KernelReporter  # noqa: E402
from zoe_kernels.moe.formats import quantize_act_fp8_torch, quantize_fp8_block  # noqa: E402
from zoe_kernels.moe.reference import fused_moe_reference  # noqa: E402
from zoe_kernels.platform import device_name  # noqa: E402

TOL = {"bf16": 2e-2, "fp8": 6e-2}
SHAPES = {  # name: (E, H, I, top_k)
    "tiny": (8, 256, 128, 2),
    "dsv3-tp8-slice": (256, 7168, 256, 8),
}


class StandInQuant:
    """The attributes of vLLM's FusedMoEQuantConfig that the wrapper reads."""

    def __init__(self, fmt: str, w1_scale=None, w2_scale=None, fp8=torch.float8_e4m3fn):
        self.is_quantized = fmt == "fp8"
        self.weight_quant_dtype = fp8 if fmt == "fp8" else None
        self.quant_dtype = fp8 if fmt == "fp8" else None
        self.block_shape = [128, 128] if fmt == "fp8" else None
        self.w1_bias = self.w2_bias = None
        self.w1_scale, self.w2_scale = w1_scale, w2_scale


class StandInExperts:
    """vLLM's experts interface; its own path is zoe's float32 reference (the unpatched output here)."""

    def __init__(self, fmt: str, dtype: torch.dtype, w1_scale=None, w2_scale=None):
        self.fmt = fmt
        self.quant_config = StandInQuant(fmt, w1_scale, w2_scale)
        self.w1_scale, self.w2_scale = w1_scale, w2_scale
        self.moe_config = types.SimpleNamespace(in_dtype=dtype)
        self._lora_context = None

    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):  # fmt: skip
        x = hidden_states
        if self.fmt == "fp8":  # vLLM hands the experts fp8 activations with per-token-group scales
            from zoe_kernels.moe.formats import dequantize_act_fp8

            x = dequantize_act_fp8(hidden_states, a1q_scale)
        out = fused_moe_reference(x.float(), w1, w2, topk_weights, topk_ids, fmt=self.fmt,
                                  w13_scale=self.w1_scale, w2_scale=self.w2_scale)  # fmt: skip
        output.copy_(out.to(output.dtype))


def make_inputs(shape, fmt, m, dev, dtype, seed):
    e, h, i, k = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.randn(m, h, generator=g) * 0.5).to(dev, dtype)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h**0.5).to(dev, dtype)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(dev, dtype)
    logits = torch.randn(m, e, generator=g)
    topk_w, topk_ids = torch.topk(torch.softmax(logits, dim=-1), k, dim=-1)
    topk_w = (topk_w / topk_w.sum(-1, keepdim=True)).to(dev, torch.float32)
    topk_ids = topk_ids.to(dev, torch.int32)
    s1 = s2 = a_scale = None
    if fmt == "fp8":
        w13, s1 = quantize_fp8_block(w13)
        w2, s2 = quantize_fp8_block(w2)
        x, a_scale = quantize_act_fp8_torch(x)
    return x, w13, w2, topk_w, topk_ids, s1, s2, a_scale


def call_apply(experts, out, x, w13, w2, topk_w, topk_ids, a_scale, activation):
    e = w13.shape[0]
    experts.apply(out, x, w13, w2, topk_w, topk_ids, activation, e, None, a_scale, None, None, None, None, False)
    return out


def run_stand_in(shape_name, fmt, m, dev, dtype, reporter, seed):
    shape = SHAPES[shape_name]
    x, w13, w2, topk_w, topk_ids, s1, s2, a_scale = make_inputs(shape, fmt, m, dev, dtype, seed)
    experts = StandInExperts(fmt, dtype, s1, s2)
    target = f"{__name__}:StandInExperts.apply"
    out_engine = call_apply(experts, torch.empty(m, shape[1], device=dev, dtype=dtype), x, w13, w2, topk_w, topk_ids,
                            a_scale, "silu")  # fmt: skip
    spec = PatchSpec("fused_moe", target, vllm_moe.EXPERTS_APPLY_PARAMS, ("0", "999"),
                     vllm_moe.make_apply_wrapper(reporter, on_cpu=False))  # fmt: skip
    assert install_kernel("fused_moe", [spec], "stand-in", "1", reporter)
    try:
        out_patched = torch.full((m, shape[1]), float("nan"), device=dev, dtype=dtype)
        call_apply(experts, out_patched, x, w13, w2, topk_w, topk_ids, a_scale, "silu")
    finally:
        uninstall(target)
    return out_engine, out_patched


def make_vllm_experts(shape, fmt, dev, dtype, s1, s2):
    """A real vLLM TritonExperts for the shape (vLLM 0.32 constructors)."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FusedMoEConfig,
        FusedMoEParallelConfig,
        FusedMoEQuantConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    e, h, i, k = shape
    par = FusedMoEParallelConfig.make_no_parallel()
    moe = FusedMoEConfig(num_experts=e, experts_per_token=k, hidden_dim=h, intermediate_size=i,
                         num_local_experts=e, num_logical_experts=e, activation=MoEActivation.SILU, device=dev,
                         routing_method=RoutingMethodType.Renormalize, moe_parallel_config=par,
                         in_dtype=dtype)  # fmt: skip
    if fmt == "fp8":
        quant = FusedMoEQuantConfig.make(torch.float8_e4m3fn, w1_scale=s1, w2_scale=s2, block_shape=[128, 128])
    else:
        quant = FusedMoEQuantConfig.make()
    return TritonExperts(moe, quant), MoEActivation.SILU


def run_vllm(shape_name, fmt, m, dev, dtype, reporter, seed):
    shape = SHAPES[shape_name]
    x, w13, w2, topk_w, topk_ids, s1, s2, a_scale = make_inputs(shape, fmt, m, dev, dtype, seed)
    experts, act = make_vllm_experts(shape, fmt, dev, dtype, s1, s2)
    import vllm

    e, h, i, k = shape
    out_engine = torch.empty(m, h, device=dev, dtype=dtype)
    shape1, shape2, _ = experts.workspace_shapes(m, 2 * i, h, k, e, e, None, act)
    ws13 = torch.empty(shape1, device=dev, dtype=dtype)
    ws2 = torch.empty(shape2, device=dev, dtype=dtype)

    def call(out):
        experts.apply(out, x, w13, w2, topk_w, topk_ids, act, e, None, a_scale, None, ws13, ws2, None, False)
        return out

    call(out_engine)
    specs = vllm_moe.fused_moe_specs("cuda", reporter)
    if not install_kernel("fused_moe", specs, "vllm", vllm.__version__, reporter):
        raise RuntimeError(f"the plugin did not patch this vLLM: {reporter.report.fallbacks[-1]}")
    try:
        out_patched = call(torch.full((m, h), float("nan"), device=dev, dtype=dtype))
    finally:
        uninstall(vllm_moe.GPU_EXPERTS + ".apply")
        uninstall(vllm_moe.EXPERTS_BASE)
    return out_engine, out_patched


INDEXER_SHAPES = {"prefill": (512, 64, 4096), "decode": (4, 64, 65536)}  # (M rows, H heads, N keys), D = 128


def run_indexer(shape_name, dev, reporter, seed):
    """The vLLM CUDA indexer wrapper (`vllm_indexer._cuda_wrap`) around a float32 torch stand-in for
    DeepGEMM's `fp8_mqa_logits`: the wrapper sends FP8 calls to zoe's lightning indexer."""
    from zoe_kernels.integrations.vllm_indexer import _cuda_wrap
    from zoe_kernels.platform import fp8_dtype

    m, h, n = INDEXER_SHAPES[shape_name]
    g = torch.Generator(device="cpu").manual_seed(seed)
    f8 = fp8_dtype(dev)
    q = (torch.randn(m, h, 128, generator=g) * 0.5).to(dev).to(f8)
    k = (torch.randn(n, 128, generator=g) * 0.5).to(dev).to(f8)
    k_scale = (torch.rand(n, 1, generator=g) + 0.5).to(dev)
    w = torch.randn(m, h, generator=g).to(dev)
    ke = torch.randint(1, n + 1, (m,), generator=g, dtype=torch.int32).to(dev)
    ks = (ke - torch.randint(1, n, (m,), generator=g, dtype=torch.int32).to(dev)).clamp(min=0)

    def engine_logits(q_, kv, weights, cu_ks, cu_ke, clean_logits):
        qv, kf = q_[0].float(), kv[0].float()
        s = torch.einsum("mhd,nd->mhn", qv, kf) * kv[1].reshape(1, 1, -1)
        out = (s.relu() * weights[:, :, None]).sum(1)
        j = torch.arange(n, device=out.device)
        return out.masked_fill((j[None] < cu_ks[:, None]) | (j[None] >= cu_ke[:, None]), float("-inf"))

    ref = engine_logits((q, None), (k, k_scale), w, ks, ke, False)
    got = _cuda_wrap(reporter)(engine_logits)((q, None), (k, k_scale), w, ks, ke, False)
    return ref, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench/kernels/results/integration_gpu_check.json"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--ms", default="1,8,64,256,512,1024")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    dev = torch.device(args.device)
    ms = [int(v) for v in args.ms.split(",")]
    shapes = args.shapes.split(",")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the interpreter computes bf16 wrongly
    fmts = ["bf16", "fp8"]
    dname = device_name(dev)
    drivers = [("stand-in", run_stand_in)]
    vllm_note = None
    if dev.type == "cuda":
        try:
            import vllm

            drivers.insert(0, ("vllm", run_vllm))
            vllm_note = f"vllm {vllm.__version__}"
        except Exception as e:  # no vLLM on the measurement GPU: the stand-in still runs
            vllm_note = f"vllm not importable: {type(e).__name__}: {e}"
    rows, failures = [], []
    for driver, fn in drivers:
        for shape_name in shapes:
            for fmt in fmts:
                for m in ms:
                    reporter = KernelReporter(driver, "check", ["fused_moe"], None)
                    t0 = time.perf_counter()
                    try:
                        ref, got = fn(shape_name, fmt, m, dev, dtype, reporter, seed=m)
                    except Exception as e:  # record and go on: one broken driver must not hide the rest
                        rows.append({"driver": driver, "shape": shape_name, "fmt": fmt, "m": m,
                                     "error": f"{type(e).__name__}: {e}"})  # fmt: skip
                        failures.append(rows[-1])
                        continue
                    calls = reporter.report.calls.get("fused_moe", {})
                    path = "zoe" if calls.get("zoe") else "engine"
                    expected = "zoe" if moe_impl_for(m, fmt, dname) == "zoe" else "engine"
                    scale = ref.float().abs().max().item() or 1.0
                    err = (got.float() - ref.float()).abs().max().item() / scale
                    ok = bool(err <= TOL[fmt] and path == expected and torch.isfinite(got.float()).all())
                    row = {"driver": driver, "kernel": "fused_moe", "shape": shape_name, "fmt": fmt, "m": m,
                           "path": path,
                           "expected_path": expected, "rel_max_err": err, "tolerance": TOL[fmt], "ok": ok,
                           "seconds": round(time.perf_counter() - t0, 3)}  # fmt: skip
                    rows.append(row)
                    if not ok:
                        failures.append(row)
                    print(json.dumps(row), flush=True)
    if dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        for shape_name in ([s for s in INDEXER_SHAPES] if dev.type == "cuda" else []):
            reporter = KernelReporter("stand-in", "check", ["lightning_indexer"], None)
            try:
                ref, got = run_indexer(shape_name, dev, reporter, seed=1)
            except Exception as e:
                rows.append({"driver": "stand-in", "kernel": "lightning_indexer", "shape": shape_name,
                             "error": f"{type(e).__name__}: {e}"})  # fmt: skip
                failures.append(rows[-1])
                continue
            inside = torch.isfinite(ref)
            err = ((got - ref).abs()[inside].max() / ref[inside].abs().max()).item()
            path = "zoe" if reporter.report.calls.get("lightning_indexer", {}).get("zoe") else "engine"
            ok = bool(err <= 1e-3 and path == "zoe" and torch.equal(torch.isinf(got), ~inside))
            row = {"driver": "stand-in", "kernel": "lightning_indexer", "shape": shape_name,
                   "m_h_n": INDEXER_SHAPES[shape_name], "path": path, "rel_max_err": err, "tolerance": 1e-3,
                   "ok": ok}  # fmt: skip
            rows.append(row)
            if not ok:
                failures.append(row)
            print(json.dumps(row), flush=True)
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": dname,
        "torch": torch.__version__,
        "host": platform.node(),
        "vllm": vllm_note,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "rows": rows,
        "failures": len(failures),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(rows) - len(failures)}/{len(rows)} rows ok -> {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
