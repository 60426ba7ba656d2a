"""Typed recipe model: a model's architecture facts and its named serving variants.

A recipe file (recipes/<model>.yaml) is parsed into `Recipe`. Every performance number carries where it
comes from (`Figure.source`, e.g. "seed table A8"); a number that the source does not give is marked
`estimate: true` with its reasoning, and is never presented as measured.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Quantization = Literal["bf16", "fp8", "mxfp4", "w4a16"]
KernelName = Literal["fused_moe", "lightning_indexer", "csa_topk", "csa_dual_scope"]
AttentionKind = Literal["dsa", "csa", "mla", "full", "hybrid_linear_mla"]
SpeculativeMethod = Literal["mtp", "eagle", "dspark"]

KERNEL_NAMES: tuple[str, ...] = KernelName.__args__  # type: ignore[attr-defined]
# A parser name as the engines register them (vLLM `glm47`, SGLang `deepseekv31`); which names exist is the
# engine's to say (tests/engines check them against the installed engines' registries).
_PARSER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Figure(_Strict):
    """One number with its provenance."""

    value: float = Field(description="The number, in the unit named by the field that holds it.")
    std: float | None = Field(default=None, description="One standard deviation, where the source gives it.")
    source: str = Field(description="Where the number comes from, e.g. 'seed table A8' or 'HF model card'.")
    estimate: bool = Field(default=False, description="True when the source does not give this number.")
    reasoning: str | None = Field(default=None, description="How an estimate was derived (required for estimates).")

    @model_validator(mode="after")
    def _estimate_needs_reasoning(self) -> "Figure":
        if self.estimate and not self.reasoning:
            raise ValueError("an estimate needs 'reasoning' that says how it was derived")
        return self


class IndexerSpec(_Strict):
    """DSA lightning indexer: scores every past position with FP8 keys, keeps the top-k."""

    heads: int = Field(gt=0, description="Indexer query heads (H): 32 for GLM-5.x, 64 for DeepSeek-V3.2.")
    head_dim: int = Field(gt=0, description="Indexer head dimension (D), 128 in the seed's models.")
    top_k: int = Field(gt=0, description="KV entries main attention reads per query (2048 for DSA).")


class CsaSpec(_Strict):
    """Compressed sparse attention (DeepSeek-V4): top-K compressed entries plus a local window."""

    top_k: int = Field(gt=0, description="Compressed entries selected per query (512).")
    window_tokens: int = Field(gt=0, description="Recent tokens attended densely (about 128).")
    compression_ratio: int = Field(gt=0, description="Tokens per compressed entry.")


class Architecture(_Strict):
    """Facts about the model that sizing, the simulated engine and the kernels depend on."""

    total_params_b: Figure = Field(description="Total parameters, billions.")
    active_params_b: Figure = Field(description="Parameters active per token, billions.")
    num_layers: int = Field(gt=0, description="Transformer layers.")
    num_moe_layers: int = Field(ge=0, description="Layers whose MLP is a mixture of experts.")
    hidden_size: int = Field(gt=0, description="Model width H.")
    routed_experts: int = Field(gt=0, description="Routed experts per MoE layer (E).")
    shared_experts: int = Field(ge=0, description="Always-active shared experts per MoE layer.")
    experts_per_token: int = Field(gt=0, description="Routed experts chosen per token (top-k).")
    moe_intermediate_size: int = Field(gt=0, description="Width I of one expert's gate/up projection.")
    attention: AttentionKind = Field(description="Attention kind: dsa, csa, mla, full or hybrid_linear_mla.")
    indexer: IndexerSpec | None = Field(default=None, description="DSA indexer shape (attention: dsa).")
    csa: CsaSpec | None = Field(default=None, description="CSA shape (attention: csa).")
    kv_bytes_per_token: Figure = Field(description="KV-cache bytes per token summed over all layers.")
    max_context_tokens: int = Field(gt=0, description="Longest context the model serves, tokens.")

    @model_validator(mode="after")
    def _consistent(self) -> "Architecture":
        if self.num_moe_layers > self.num_layers:
            raise ValueError("num_moe_layers cannot exceed num_layers")
        if self.experts_per_token > self.routed_experts:
            raise ValueError("experts_per_token cannot exceed routed_experts")
        if self.attention == "dsa" and self.indexer is None:
            raise ValueError("attention 'dsa' needs an 'indexer' section")
        if self.attention == "csa" and self.csa is None:
            raise ValueError("attention 'csa' needs a 'csa' section")
        return self


class Weights(_Strict):
    repo: str = Field(description="Checkpoint (Hugging Face repo id or path) the engine loads.")
    quantization: Quantization = Field(description="Expert weight format: bf16, fp8, mxfp4 or w4a16.")
    size_gb: Figure = Field(description="Checkpoint size on disk and in HBM, GB.")


class Parallelism(_Strict):
    tp: int = Field(default=1, ge=1, description="Tensor-parallel size.")
    dp: int = Field(default=1, ge=1, description="Data-parallel engine ranks inside one replica.")
    pp: int = Field(default=1, ge=1, description="Pipeline-parallel size.")
    ep: int = Field(default=1, ge=1, description="Expert-parallel size (1 = experts sharded by TP).")
    nodes: int = Field(default=1, ge=1, description="Nodes one replica spans.")
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs the replica takes on each node.")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @model_validator(mode="after")
    def _fits(self) -> "Parallelism":
        if self.tp * self.pp * self.dp != self.gpus:
            raise ValueError(
                f"tp*pp*dp = {self.tp}*{self.pp}*{self.dp} = {self.tp * self.pp * self.dp} must equal "
                f"nodes*gpus_per_node = {self.nodes}*{self.gpus_per_node} = {self.gpus}"
            )
        if self.ep > 1 and self.ep != self.tp * self.dp:
            raise ValueError(f"ep ({self.ep}) must be 1 or tp*dp ({self.tp * self.dp})")
        return self


class Speculative(_Strict):
    method: SpeculativeMethod = Field(description="Drafting method: mtp, eagle or dspark.")
    num_speculative_tokens: int = Field(gt=0, description="Tokens proposed per step.")
    mean_accepted_tokens: Figure | None = Field(
        default=None, description="Mean tokens emitted per target step (1 + accepted drafts)."
    )


class DecodePoint(_Strict):
    concurrency: int = Field(gt=0, description="Concurrent requests.")
    tok_s_per_node: Figure = Field(description="Output tokens/s of the whole node.")
    tok_s_per_user: Figure | None = Field(default=None, description="Output tokens/s seen by one request.")
    prompt: str = Field(default="apex", description="Prompt the seed used ('apex' or 'gsm8k').")


class TtftPoint(_Strict):
    input_tokens: int = Field(gt=0, description="Prompt length, tokens.")
    hit_rate: float = Field(ge=0, le=1, description="Share of the prompt already in the prefix cache.")
    ttft_s: Figure = Field(description="Time to first token of a single request, seconds.")


class ContextDecodePoint(_Strict):
    context_tokens: int = Field(gt=0, description="Context length during single-user decode, tokens.")
    tok_s_per_user: Figure = Field(description="Single-user decode tokens/s at that context.")


class Profile(_Strict):
    """What the seed measured for this variant on one MI355X node (or what is estimated, marked so)."""

    image: str = Field(description="Engine image the measurements were taken with.")
    decode: list[DecodePoint] = Field(default_factory=list, description="Decode tok/s by concurrency.")
    ttft: list[TtftPoint] = Field(default_factory=list, description="Single-request TTFT by length x hit rate.")
    context_decode: list[ContextDecodePoint] = Field(
        default_factory=list, description="Single-user decode tok/s by context length."
    )
    weights_load_s: Figure | None = Field(default=None, description="Time from process start to ready, s.")
    ttft_from: str | None = Field(
        default=None,
        description="Another variant of this recipe whose measured TTFT table applies to this one "
        "(when this variant's prefill was not measured); `notes` must say why it applies.",
    )
    notes: str | None = Field(default=None, description="Caveats: image differences, reused tables, estimates.")

    @model_validator(mode="after")
    def _ttft_one_source(self) -> "Profile":
        if self.ttft_from and self.ttft:
            raise ValueError("give either 'ttft' points or 'ttft_from', not both")
        if self.ttft_from and not self.notes:
            raise ValueError("'ttft_from' needs 'notes' saying why that table applies")
        return self


class Intended(_Strict):
    concurrency: tuple[int, int] = Field(description="Concurrency range per replica the variant is meant for.")
    context_tokens: tuple[int, int] = Field(description="Context range the variant is meant for, tokens.")

    @field_validator("concurrency", "context_tokens")
    @classmethod
    def _ordered(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 0 or v[0] > v[1]:
            raise ValueError(f"range {list(v)} must be [low, high] with 0 <= low <= high")
        return v


class _VariantBase(_Strict):
    description: str = Field(description="One line: what this variant is for.")
    image: str = Field(description="Container image the engine runs in.")
    weights: Weights = Field(description="Checkpoint, format and size.")
    parallelism: Parallelism = Field(description="How one replica is split over GPUs and nodes.")
    kernels: list[KernelName] = Field(default_factory=list, description="zoe_kernels the engine runs.")
    speculative: Speculative | None = Field(default=None, description="Speculative decoding, if enabled.")
    kv_cache_dtype: Literal["auto", "fp8", "bf16"] = Field(default="fp8", description="KV-cache storage type.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="Share of HBM the engine takes.")
    max_num_seqs: int = Field(default=256, gt=0, description="Most sequences in one engine step.")
    max_num_batched_tokens: int = Field(default=16384, gt=0, description="Most tokens in one engine step.")
    extra_engine_args: list[str] = Field(
        default_factory=list, description="More engine flags; checked against the engine's real parser."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for the engine process.")
    trust_remote_code: bool = Field(
        default=False,
        description="Let the engine run Python code shipped with the checkpoint (`--trust-remote-code`); only for "
        "checkpoints whose model card asks for it (a custom tokenizer or model class).",
    )
    tool_call_parser: str | None = Field(
        default=None,
        pattern=_PARSER_NAME,
        description="The engine's parser that turns the model's tool-call text into OpenAI `tool_calls` "
        "(`--tool-call-parser`; vLLM also gets `--enable-auto-tool-choice`), as the model card names it for this "
        "engine; None serves without tool calling. Names differ per engine and are checked against its registry.",
    )
    reasoning_parser: str | None = Field(
        default=None,
        pattern=_PARSER_NAME,
        description="The engine's parser that splits the model's thinking into `reasoning_content` "
        "(`--reasoning-parser`), as the model card names it for this engine; None leaves thinking in the content.",
    )
    accelerator_type: str | None = Field(
        default="AMD-Instinct-MI355X-OAM", description="Ray accelerator type the replica's nodes must have."
    )
    gpu_memory_gb: float = Field(default=288.0, gt=0, description="HBM per GPU, GB (MI355X: 288).")
    profile: Profile = Field(description="Measured performance of this variant.")
    intended: Intended = Field(description="Concurrency and context ranges this variant is meant for.")

    @field_validator("kernels")
    @classmethod
    def _unique_kernels(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"kernels listed twice: {v}")
        return v


class VllmVariant(_VariantBase):
    engine: Literal["vllm"] = Field(description="Serve with vLLM (`vllm serve`).")
    block_size: int | None = Field(default=None, description="KV block size in tokens (engine default if unset).")
    long_prefill_token_threshold: int = Field(
        default=0,
        ge=0,
        description="Most prefill tokens one request gets in an engine step while others are queued or running "
        "(`--long-prefill-token-threshold`), so a short prompt shares the step with a long one; 0: no cap.",
    )


class SglangVariant(_VariantBase):
    engine: Literal["sglang"] = Field(description="Serve with SGLang (`python -m sglang.launch_server`).")
    enable_dp_attention: bool = Field(default=False, description="SGLang data-parallel attention.")
    attention_backend: str | None = Field(default=None, description="SGLang --attention-backend, if set.")


Variant = Annotated[Union[VllmVariant, SglangVariant], Field(discriminator="engine")]
VARIANT_ENGINES = frozenset(get_args(cls.model_fields["engine"].annotation)[0] for cls in get_args(get_args(Variant)[0]))
"""The engines a recipe variant is written for: the tags of the `Variant` union (each has an engine adapter)."""


class Recipe(_Strict):
    """One model: its architecture and the named variants zoe can serve it with."""

    schema_version: Literal[1] = Field(default=1, description="Recipe format version.")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="Model id used on the CLI, e.g. glm-5.3.")
    display_name: str = Field(description="Human-readable model name.")
    served_model_name: str = Field(description="Model name clients send in OpenAI requests.")
    architecture: Architecture = Field(description="Model architecture facts.")
    default_variant: str = Field(description="Variant used when neither --variant nor --concurrency is given.")
    variants: dict[str, Variant] = Field(min_length=1, description="Named serving variants.")

    @model_validator(mode="after")
    def _default_exists(self) -> "Recipe":
        if self.default_variant not in self.variants:
            raise ValueError(
                f"default_variant '{self.default_variant}' is not one of the variants: {sorted(self.variants)}"
            )
        for vname, v in self.variants.items():
            if self.architecture.attention != "dsa" and "lightning_indexer" in v.kernels:
                raise ValueError(f"variant '{vname}': lightning_indexer needs a DSA model")
            if self.architecture.attention != "csa" and {"csa_topk", "csa_dual_scope"} & set(v.kernels):
                raise ValueError(f"variant '{vname}': CSA kernels need a CSA model")
            src = v.profile.ttft_from
            if src is not None and (src not in self.variants or not self.variants[src].profile.ttft):
                raise ValueError(f"variant '{vname}': profile.ttft_from '{src}' must name a variant with ttft points")
        return self

    def ttft_points(self, variant: str) -> list[TtftPoint]:
        """The TTFT table that applies to `variant` (its own, or the one `ttft_from` names)."""
        prof = self.variant(variant).profile
        return list(self.variants[prof.ttft_from].profile.ttft) if prof.ttft_from else list(prof.ttft)

    def variant(self, name: str) -> VllmVariant | SglangVariant:
        try:
            return self.variants[name]
        except KeyError:
            raise KeyError(f"model '{self.name}' has no variant '{name}'; known: {sorted(self.variants)}") from None
