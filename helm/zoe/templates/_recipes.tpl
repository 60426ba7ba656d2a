{{/* Each model's variants and the engine each runs on: generated from the recipes and the routing policy registry by `python -m zoe_cluster.k8s.values_schema --write`; do not edit. */}}
{{- define "zoe.recipes" -}}
{"deepseek-v3.2": {"fp8-tp8": "vllm", "fp8-tp8-zoe": "vllm"}, "deepseek-v4-pro": {"fp8-tp8": "sglang", "fp8-tp8-zoe": "sglang", "fp8-tp8-zoe-mtp": "sglang"}, "glm-5.3": {"fp8-tp8": "vllm", "fp8-tp8-fused-moe": "vllm", "fp8-tp8-mtp": "vllm", "fp8-tp8-nightly": "vllm", "fp8-tp8-zoe": "vllm", "fp8-tp8-zoe-mtp": "vllm", "mxfp4-tp4-dp2": "vllm", "mxfp4-tp8": "vllm"}, "kimi-k3": {"mxfp4-tp8-dspark": "sglang"}}
{{- end -}}
