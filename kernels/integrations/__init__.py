"""zoe_kernels inside the serving engines: the vLLM plugin, the SGLang hook and what they report.

- `vllm_plugin.register`: vLLM's `vllm.general_plugins` entry point (every vLLM process).
- `sglang_hook.register`: SGLang's `sglang.srt.plugins` entry point (every SGLang process).
- `report.read_reports(dir)` / `report.summarize(reports)`: what a replica's processes actually run.
- `support`: where each kernel is verified (kernel -> engine -> platform -> releases); no torch import.
Both hooks do nothing unless `ZOE_KERNELS` names kernels; docs/kernels.md describes the contract.
"""
