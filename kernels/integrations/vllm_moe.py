"""vLLM's fused-MoE experts, routed to zoe's fused MoE below the measured crossover (dispatch by M).

vLLM 0.29, 0.32 and 0.33 run routed experts through a modular kernel whose experts object has
`apply(output, hidden_states, w1, w2, topk_weights, topk_ids, activation, ...)` and writes the top-k
weighted sum into `output` [M, H]. Which experts class runs depends on the platform, so the patch does too:

- CUDA and ROCm: `TritonExperts.apply` (vLLM's Triton MoE; unquantized BF16 and FP8 with 128x128 block
  scales). Weights are in `fused_experts` layout (`w13 [E, 2I, H]`, `w2 [E, H, I]`), zoe's layout.
- CPU (vLLM 0.32): `CPUUnquantizedExperts.apply`. vLLM prepacks the CPU weights into its grouped-GEMM layout after
  loading, so `process_weights_after_loading` is wrapped too, to keep a copy of the weights in
  `fused_experts` layout for zoe's path (CPU only: a float32 copy, 3x the MoE weights' memory). On the CPU
  zoe's path is zoe's Triton kernel run by Triton's interpreter when the engine runs with
  `TRITON_INTERPRET=1`, else zoe's float32 PyTorch reference (`zoe_kernels.moe.reference`); both compute
  in float32 (the interpreter computes bf16 wrongly). The report names which one ran (`cpu_impl`).

From vLLM 0.33 `TritonExperts.apply` has two more ways to finish: a `post_gemm2_hook` set on the experts object
takes the unweighted GEMM2 rows, one per (token, slot), wrapped by `route_major_moe_output`, and writes `output`
itself (the top-k reduction fused with what follows it); and a subclass may override the finish
(`_apply_router_weight_in_gemm2`, `_finalize_expert_output`, `moe_sum`). For those calls zoe computes the same
unweighted rows (`zoe_routes`: each (token, slot) as its own top-1 token with weight 1, no kernel change) and
finishes through vLLM's own hook or methods; every other call gets zoe's fused top-k combine.

Per call the wrapper routes to zoe when the call is one zoe's kernel covers (SiLU gate, no expert map, no
biases, no LoRA, router weights applied after the experts, weights in device memory) and
`moe_impl_for(M, fmt, device)` says "zoe"; everything else goes to vLLM's own `apply`, with the reason counted in
the report.
"""

from __future__ import annotations

import os
from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec
from zoe_kernels.integrations.report import KernelReporter, log
from zoe_kernels.integrations.support import engine_span, ranges, release

VLLM_VERSIONS = engine_span("vllm")
"""The span of vLLM releases the plugin was verified on (per kernel and platform: `support.SUPPORT`)."""

EXPERTS_APPLY_PARAMS = (
    "self", "output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
    "global_num_experts", "expert_map", "a1q_scale", "a2_scale", "workspace13", "workspace2",
    "expert_tokens_meta", "apply_router_weight_on_input",
)  # fmt: skip

CPU_TRITON = "triton (interpreter, CPU, float32)"
CPU_REFERENCE = "reference (PyTorch, CPU, float32)"
_FUSED_MOE = "vllm.model_executor.layers.fused_moe"
CPU_EXPERTS = f"{_FUSED_MOE}.experts.cpu_moe:CPUUnquantizedExperts"
GPU_EXPERTS = f"{_FUSED_MOE}.experts.triton_moe:TritonExperts"

POST_GEMM2_HOOK_SINCE = "0.33.0"
"""The first vLLM release whose `TritonExperts.apply` can finish through `post_gemm2_hook` or overridden methods."""
FINISH_METHODS = ("_apply_router_weight_in_gemm2", "_finalize_expert_output", "moe_sum")
POST_GEMM2_CALLS = (
    (f"{GPU_EXPERTS}._uses_post_gemm2_hook", ("self", "num_tokens")),
    (f"{GPU_EXPERTS}._run_post_gemm2_hook", ("self", "unfinalized", "output")),
    (f"{GPU_EXPERTS}._apply_router_weight_in_gemm2", ("self", "apply_router_weight_on_input")),
    (f"{GPU_EXPERTS}._finalize_expert_output", ("self", "expert_output", "output", "topk_ids", "expert_map")),
    (f"{GPU_EXPERTS}.moe_sum", ("self", "input", "output", "topk_ids", "expert_map")),
    (f"{_FUSED_MOE}.moe_output:route_major_moe_output", ("routes", "topk_weights", "topk_ids", "expert_map")),
)  # fmt: skip
"""What the 0.33 wrapper uses of vLLM to finish a hooked call (checked with the patch, `PatchSpec.calls`)."""


def moe_format(experts, hidden_states) -> tuple[str | None, str | None]:
    """(zoe fmt, None) for a call zoe's kernel covers, else (None, why not)."""
    import torch

    qc = experts.quant_config
    if not qc.is_quantized and qc.weight_quant_dtype is None:
        if hidden_states.dtype in (torch.bfloat16, torch.float16, torch.float32):
            return "bf16", None
        return None, f"activation dtype {hidden_states.dtype}"
    fp8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
    if qc.quant_dtype in fp8 and qc.block_shape == [128, 128]:
        return "fp8", None
    return None, f"quantization {qc.weight_quant_dtype}/{qc.quant_dtype} block {qc.block_shape}"


def unsupported_reason(experts, activation, expert_map, apply_router_weight_on_input) -> str | None:
    """Why zoe's kernel cannot take this call (None when it can)."""
    if getattr(activation, "value", activation) != "silu":
        return "activation"
    if expert_map is not None:
        return "expert_map"
    if apply_router_weight_on_input:
        return "router_weight_on_input"
    if getattr(experts, "_lora_context", None) is not None:
        return "lora"
    qc = experts.quant_config
    if qc.w1_bias is not None or qc.w2_bias is not None:
        return "bias"
    if any(getattr(qc, a, None) is not None for a in ("clamp_limit", "gemm1_alpha", "gemm1_clamp_limit")):
        return "swiglu_params"
    return None


def host_resident(*weights) -> bool:
    """True when vLLM reads expert weights from host memory in place (UVA offloading, vLLM 0.33's
    `--offload-backend uva`): zoe's kernels are tuned for device memory, so vLLM's own path takes the call."""
    return any(getattr(w, "_vllm_is_uva_offloaded", False) for w in weights)


def zoe_routes(moe: Callable, x, w1, w2, topk_ids, **kw):
    """The unweighted expert output of every (token, slot), [M, k, H] in `x`'s dtype: what vLLM's GEMM2 writes
    before the top-k reduction, each row rounded to `x`'s dtype as vLLM's are. Each (token, slot) runs as a top-1
    token with weight 1 through `moe` (zoe's fused MoE or its reference): the same expert weights are read once per
    expert as in the fused call, the activations k times."""
    import torch

    m, k = topk_ids.shape
    ones = torch.ones((m * k, 1), dtype=torch.float32, device=x.device)
    rows = moe(x.repeat_interleave(k, dim=0), w1, w2, ones, topk_ids.reshape(m * k, 1), **kw)
    return rows.view(m, k, rows.shape[-1])


def finishes_elsewhere(experts, owner: type, num_tokens: int) -> bool:
    """True when vLLM 0.33's `TritonExperts.apply` would not end in its own top-k sum into `output`: a
    `post_gemm2_hook` is set, or `experts`' class overrides a finish method of `owner` (the patched class)."""
    if experts._uses_post_gemm2_hook(num_tokens):
        return True
    return any(getattr(type(experts), n) is not getattr(owner, n) for n in FINISH_METHODS)


def finish_routes(experts, rows, output, topk_weights, topk_ids) -> None:
    """Finish a call from its unweighted rows [M, k, H] the way vLLM 0.33's `TritonExperts.apply` does (zoe's
    path has no expert map and router weights after the experts)."""
    from vllm.model_executor.layers.fused_moe.moe_output import route_major_moe_output

    if experts._uses_post_gemm2_hook(rows.shape[0]):
        experts._run_post_gemm2_hook(route_major_moe_output(rows, topk_weights, topk_ids, None), output)
        return
    if experts._apply_router_weight_in_gemm2(False):  # vLLM weights in GEMM2's epilogue, in float32
        rows = (rows.float() * topk_weights.float().unsqueeze(-1)).to(rows.dtype)
    experts._finalize_expert_output(rows, output, topk_ids, None)


def cpu_impl() -> str:
    """What zoe's path runs on the CPU: the Triton kernel when the engine runs under Triton's interpreter
    (`TRITON_INTERPRET=1` in its environment; it must be set before Triton is first imported, so the
    plugin cannot switch it on itself), else the float32 PyTorch reference of the fused MoE."""
    return CPU_TRITON if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else CPU_REFERENCE


def make_apply_wrapper(reporter: KernelReporter, on_cpu: bool, owner_target: str | None = None
                       ) -> Callable[[Callable], Callable]:
    """The replacement of an experts class's `apply`. With `owner_target` (`module:Class`, vLLM 0.33's
    `TritonExperts`) calls that vLLM finishes through its post-GEMM2 hook or a subclass's finish methods are
    finished the same way (`finishes_elsewhere`)."""
    from zoe_kernels.dispatch import moe_impl_for
    from zoe_kernels.integrations.patching import resolve
    from zoe_kernels.moe.formats import dequantize_act_fp8
    from zoe_kernels.moe.fused_moe import fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference
    from zoe_kernels.platform import device_name

    cpu_moe = fused_moe if cpu_impl() == CPU_TRITON else fused_moe_reference
    devices: dict[str, str] = {}
    broken: list[str] = []  # set once zoe's path raised: this process then stays on vLLM's path

    def run_zoe(self, owner, fmt, hidden_states, w1, w2, topk_weights, topk_ids, a1q_scale, output) -> None:
        """zoe's MoE for the call, written into `output` (or, with `owner`, the patched class, finished through
        vLLM's hook or methods where vLLM would)."""
        kw: dict = {"fmt": fmt}
        if on_cpu:  # the interpreter holds bf16 as raw integers: compute in float32 (weights kept so)
            moe, x, w1, w2 = cpu_moe, hidden_states.float(), self._zoe_w13, self._zoe_w2
        elif fmt == "fp8":  # vLLM quantized the activations already; zoe quantizes them itself, identically
            moe, x = fused_moe, dequantize_act_fp8(hidden_states, a1q_scale).to(torch_dtype(self))
            kw.update(w13_scale=self.w1_scale, w2_scale=self.w2_scale)
        else:
            moe, x = fused_moe, hidden_states
        if owner is not None and finishes_elsewhere(self, owner, hidden_states.shape[0]):
            rows = zoe_routes(moe, x, w1, w2, topk_ids, **kw)
            finish_routes(self, rows.to(torch_dtype(self)), output, topk_weights, topk_ids)
            return
        output.copy_(moe(x, w1, w2, topk_weights, topk_ids, **kw).view_as(output))

    def wrap(original: Callable) -> Callable:
        owner = None if owner_target is None else resolve(owner_target)[2]

        def apply(
            self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
            expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
            apply_router_weight_on_input,
        ):  # fmt: skip
            why = unsupported_reason(self, activation, expert_map, apply_router_weight_on_input)
            fmt = None
            if why is None:
                fmt, why = moe_format(self, hidden_states)
            if why is None and on_cpu and getattr(self, "_zoe_w13", None) is None:
                why = "weights_not_kept"
            if why is None and not on_cpu and host_resident(w1, w2):
                why = "host_resident_weights"
            if why is None and broken:
                why = "zoe_error"
            if why is None:
                dev = str(hidden_states.device)
                if dev not in devices:
                    devices[dev] = device_name(hidden_states.device)
                if moe_impl_for(hidden_states.shape[0], fmt, devices[dev]) == "zoe":
                    try:
                        run_zoe(self, owner, fmt, hidden_states, w1, w2, topk_weights, topk_ids, a1q_scale, output)
                    except Exception as e:  # serve on vLLM's path rather than fail the request; say so loudly
                        log.exception("fused_moe: zoe's kernel raised; this process stays on vLLM's MoE")
                        broken.append(repr(e))
                        reporter.fallback("fused_moe", type(self).__name__ + ".apply", "runtime_error", repr(e))
                        why = "zoe_error"
                    else:
                        reporter.count("fused_moe", "zoe")
                        return None
                else:
                    why = "above_crossover"
            reporter.count("fused_moe", "engine", why)
            return original(
                self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                apply_router_weight_on_input,
            )  # fmt: skip

        return apply

    return wrap


def torch_dtype(experts):
    """The model's activation dtype (what vLLM's FP8 MoE returns)."""
    return experts.moe_config.in_dtype


def _keep_weights(original: Callable) -> Callable:
    """Wraps the CPU experts' weight prepacking: keep the `fused_experts`-layout weights for zoe first."""

    def process_weights_after_loading(self, layer):
        self._zoe_w13 = layer.w13_weight.detach().float().contiguous()
        self._zoe_w2 = layer.w2_weight.detach().float().contiguous()
        return original(self, layer)

    return process_weights_after_loading


EXPERTS_BASE = f"{_FUSED_MOE}.modular_kernel:FusedMoEExperts.__init__"
EXPERTS_INIT_PARAMS = ("self", "moe_config", "quant_config", "max_num_tokens", "num_dispatchers")


def _watch_experts(patched_class: str, reporter: KernelReporter) -> Callable[[Callable], Callable]:
    """Wraps every MoE experts object's construction: when vLLM builds experts of another class than the
    one zoe patched (DeepGEMM, FlashInfer, CUTLASS or AITER chosen by vLLM's MoE oracle), zoe's kernel
    would never run, so that is recorded as a loud fallback instead of a silent no-op."""
    from zoe_kernels.integrations.patching import resolve

    seen: set[str] = set()

    def wrap(original: Callable) -> Callable:
        def __init__(self, moe_config, quant_config, max_num_tokens=None, num_dispatchers=None):
            original(self, moe_config, quant_config, max_num_tokens, num_dispatchers)
            name = type(self).__name__
            if name in seen:
                return
            seen.add(name)
            owner = resolve(patched_class + ".apply")[0]
            if not isinstance(self, owner):
                reporter.fallback(
                    "fused_moe", f"{type(self).__module__}:{name}", "engine_backend",
                    f"vLLM runs this MoE layer with {name}, not {owner.__name__}; "
                    "on GPUs start vLLM with --moe-backend triton so zoe's dispatch is used",
                )  # fmt: skip

        return __init__

    return wrap


def fused_moe_specs(platform: str, reporter: KernelReporter) -> list[PatchSpec]:
    """The patches that route vLLM's MoE experts to zoe on `platform` ("cpu", "cuda" or "rocm"), one set per
    verified release range (`support.ranges`; the targets are the same in each)."""
    cls = CPU_EXPERTS if platform == "cpu" else GPU_EXPERTS
    impl = cpu_impl() if platform == "cpu" else "triton"
    watch = _watch_experts(cls, reporter)
    on_cpu = platform == "cpu"
    specs = []
    for versions in ranges("fused_moe", "vllm", platform):
        hooked = not on_cpu and release(versions[0]) >= release(POST_GEMM2_HOOK_SINCE)
        apply = make_apply_wrapper(reporter, on_cpu, owner_target=cls if hooked else None)
        specs.append(PatchSpec("fused_moe", EXPERTS_BASE, EXPERTS_INIT_PARAMS, versions, watch, impl=impl))
        if on_cpu:
            specs.append(PatchSpec("fused_moe", f"{cls}.process_weights_after_loading", ("self", "layer"), versions,
                                   _keep_weights, impl=impl))  # fmt: skip
        specs.append(PatchSpec("fused_moe", f"{cls}.apply", EXPERTS_APPLY_PARAMS, versions, apply, impl=impl,
                               calls=POST_GEMM2_CALLS if hooked else ()))  # fmt: skip
    return specs
