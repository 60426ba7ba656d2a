"""vLLM's fused-MoE experts, routed to zoe's fused MoE below the measured crossover (dispatch by M).

vLLM 0.29 and 0.32 run routed experts through a modular kernel whose experts object has
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

Per call the wrapper routes to zoe when the call is one zoe's kernel covers (SiLU gate, no expert map, no
biases, no LoRA, router weights applied after the experts) and `moe_impl_for(M, fmt, device)` says "zoe";
everything else goes to vLLM's own `apply`, with the reason counted in the report.
"""

from __future__ import annotations

import os
from typing import Callable

from zoe_kernels.integrations.patching import PatchSpec
from zoe_kernels.integrations.report import KernelReporter, log
from zoe_kernels.integrations.support import engine_span, ranges

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


def cpu_impl() -> str:
    """What zoe's path runs on the CPU: the Triton kernel when the engine runs under Triton's interpreter
    (`TRITON_INTERPRET=1` in its environment; it must be set before Triton is first imported, so the
    plugin cannot switch it on itself), else the float32 PyTorch reference of the fused MoE."""
    return CPU_TRITON if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else CPU_REFERENCE


def make_apply_wrapper(reporter: KernelReporter, on_cpu: bool) -> Callable[[Callable], Callable]:
    from zoe_kernels.dispatch import moe_impl_for
    from zoe_kernels.moe.formats import dequantize_act_fp8
    from zoe_kernels.moe.fused_moe import fused_moe
    from zoe_kernels.moe.reference import fused_moe_reference
    from zoe_kernels.platform import device_name

    cpu_moe = fused_moe if cpu_impl() == CPU_TRITON else fused_moe_reference
    devices: dict[str, str] = {}
    broken: list[str] = []  # set once zoe's path raised: this process then stays on vLLM's path

    def run_zoe(self, fmt, hidden_states, w1, w2, topk_weights, topk_ids, a1q_scale):
        if on_cpu:  # the interpreter holds bf16 as raw integers: compute in float32 (weights kept so)
            x = hidden_states.float()
            return cpu_moe(x, self._zoe_w13, self._zoe_w2, topk_weights, topk_ids, fmt=fmt)
        if fmt == "fp8":  # vLLM quantized the activations already; zoe quantizes them itself, identically
            x = dequantize_act_fp8(hidden_states, a1q_scale).to(torch_dtype(self))
            return fused_moe(x, w1, w2, topk_weights, topk_ids, fmt=fmt, w13_scale=self.w1_scale,
                             w2_scale=self.w2_scale)  # fmt: skip
        return fused_moe(hidden_states, w1, w2, topk_weights, topk_ids, fmt=fmt)

    def wrap(original: Callable) -> Callable:
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
            if why is None and broken:
                why = "zoe_error"
            if why is None:
                dev = str(hidden_states.device)
                if dev not in devices:
                    devices[dev] = device_name(hidden_states.device)
                if moe_impl_for(hidden_states.shape[0], fmt, devices[dev]) == "zoe":
                    try:
                        out = run_zoe(self, fmt, hidden_states, w1, w2, topk_weights, topk_ids, a1q_scale)
                    except Exception as e:  # serve on vLLM's path rather than fail the request; say so loudly
                        log.exception("fused_moe: zoe's kernel raised; this process stays on vLLM's MoE")
                        broken.append(repr(e))
                        reporter.fallback("fused_moe", type(self).__name__ + ".apply", "runtime_error", repr(e))
                        why = "zoe_error"
                    else:
                        output.copy_(out.view_as(output))
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
    apply = make_apply_wrapper(reporter, on_cpu=platform == "cpu")
    specs = []
    for versions in ranges("fused_moe", "vllm", platform):
        specs.append(PatchSpec("fused_moe", EXPERTS_BASE, EXPERTS_INIT_PARAMS, versions, watch, impl=impl))
        if platform == "cpu":
            specs.append(PatchSpec("fused_moe", f"{cls}.process_weights_after_loading", ("self", "layer"), versions,
                                   _keep_weights, impl=impl))  # fmt: skip
        specs.append(PatchSpec("fused_moe", f"{cls}.apply", EXPERTS_APPLY_PARAMS, versions, apply, impl=impl))
    return specs
