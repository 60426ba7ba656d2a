"""What a deployment should be: the desired state the controller reconciles towards.

The CLI builds a `DeploymentSpec` (with the recipe itself inside, so the controller never re-reads recipe
files) and hands it to the deployment's controller actor. Changes (scale, switch) edit the spec in the
controller, which keeps a copy in Ray's key-value store so a restarted controller resumes the latest intent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from zoe_cluster.cluster.placement import GangShape
from zoe_cluster.config_errors import validation_problems
from zoe_cluster.engines import EngineAdapter, EngineName, get_adapter
from zoe_cluster.recipes.schema import Recipe
from zoe_cluster.router.config import RouterConfig
from zoe_cluster.switching.vocabulary import SwitchConfig

LONG_CONTEXT_TOKENS = 131072
"""A variant meant for contexts beyond this (its recipe's `intended.context_tokens`) serves the router's "long" pool."""

PlatformChoice = Literal["auto", "rocm", "cuda", "cpu"]


class HealthConfig(BaseModel):
    """How replicas are watched: readiness, liveness, restarts, draining."""

    model_config = ConfigDict(extra="forbid")

    check_interval_s: float = Field(default=2.0, gt=0, description="Seconds between liveness checks of a ready replica.")
    check_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one /health request, seconds.")
    failures_to_restart: int = Field(
        default=3, ge=1, description="Failed health checks in a row after which a ready replica counts as hung."
    )
    load_timeout_s: float = Field(
        default=1800.0, gt=0, description="Longest time from process start to a healthy /health before giving up."
    )
    placement_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest wait for a replica's GPUs (placement group) before failing it."
    )
    backoff_base_s: float = Field(default=1.0, ge=0, description="First restart delay; doubles per failure in a row.")
    backoff_cap_s: float = Field(default=60.0, ge=0, description="Longest restart delay, seconds.")
    stable_after_s: float = Field(
        default=60.0, ge=0, description="Ready this long resets the failures-in-a-row count (and so the backoff)."
    )
    drain_timeout_s: float = Field(
        default=60.0, ge=0, description="Longest wait for in-flight requests to finish before a replica is stopped."
    )
    stop_grace_s: float = Field(default=10.0, ge=0, description="SIGTERM-to-SIGKILL grace for engine processes.")


class DeploymentRouter(BaseModel):
    """The router the deployment owns (the OpenAI endpoint clients use): whether it runs, where, with what policy;
    `router_config()` turns it into the router's own `RouterConfig` (zoe_cluster.router.config), the one config
    type the router process reads."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="Start a router; off only in tests that talk to replicas directly.")
    host: str = Field(default="0.0.0.0", description="Address the router listens on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port of the OpenAI endpoint.")
    policy: str | None = Field(default=None, description="Routing policy name (router default if unset).")
    kv_events: bool = Field(
        default=False,
        description="Precise routing: engines (vLLM, SGLang) publish their KV-cache events on ports they bind, "
        "membership lists them and every router subscribes (zoe_cluster.router.kv_events).",
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other field of the router's RouterConfig (zoe_cluster.router.config), e.g. "
        '{"max_retries": 1}; validated with the deployment.',
    )


class DeploymentSpec(BaseModel):
    """One deployment's desired state."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.\-]*$", description="Deployment name (defaults to the model name).")
    recipe: Recipe = Field(description="The model's recipe, carried whole so the controller never re-reads files.")
    variant: str = Field(description="Variant new replicas start with.")
    replicas: int = Field(default=1, ge=0, description="Replica count to keep running.")
    replica_variants: dict[int, str] = Field(
        default_factory=dict, description="Per-replica variant overrides set by switches (index -> variant)."
    )
    engine: EngineName = Field(description="vllm, sglang, or sim (the simulated engine; needs no GPUs).")
    platform: PlatformChoice = Field(
        default="auto", description="GPU platform for device pinning; auto detects ROCm/CUDA on each node."
    )
    model_path: str | None = Field(default=None, description="Local checkpoint overriding the recipe's weights repo.")
    max_model_len: int | None = Field(default=None, gt=0, description="Context limit passed to the engine, tokens.")
    launcher: list[str] | None = Field(default=None, description="argv prefix that starts the engine (its binary).")
    engine_args: list[str] = Field(default_factory=list, description="Extra flags appended to every engine argv.")
    engine_env: dict[str, str] = Field(default_factory=dict, description="Extra environment for every engine.")
    host_kv_gb: float = Field(
        default=0.0, ge=0,
        description="Host memory for a second KV tier, GB per replica (vLLM CPU offloading, SGLang HiCache, the "
        "simulated engine's host tier); 0: HBM only. The router sizes its prefix index to the larger tier.",
    )
    host: str | None = Field(
        default=None, description="Address engines bind; default: the node's Ray IP (loopback on a local Ray)."
    )
    health: HealthConfig = Field(default_factory=HealthConfig, description="Readiness, liveness and restarts.")
    router: DeploymentRouter = Field(default_factory=DeploymentRouter, description="The deployment's router.")
    log_dir: str | None = Field(default=None, description="Folder for engine logs on each node (default: Ray's).")
    switching: SwitchConfig | None = Field(
        default=None, description="Recipe switching by concurrency (None: the controller never swaps by itself)."
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Port of the controller's own /metrics (switching); 0 picks a free one; None: not served.",
    )
    worker_images: dict[str, str] = Field(
        default_factory=dict,
        description="Recipe image -> the worker image built FROM it, on a cluster whose nodes advertise the Ray "
        "resource zoe-image/<worker image> (the Helm chart's worker groups): a replica then runs only on nodes of its "
        "variant's image. Empty: any GPU node runs any variant.",
    )

    @model_validator(mode="after")
    def _variants_exist(self) -> "DeploymentSpec":
        for v in {self.variant, *self.replica_variants.values()}:
            if v not in self.recipe.variants:
                raise ValueError(f"model '{self.recipe.name}' has no variant '{v}'; known: {sorted(self.recipe.variants)}")
            if not self.adapter().serves(self.recipe.variants[v].engine):
                raise ValueError(
                    f"variant '{v}' of {self.recipe.name} runs on {self.recipe.variants[v].engine}, not {self.engine}"
                )
            self.worker_image(v)
        if self.switching is not None:
            for v in self.switching.candidates:
                if v not in self.recipe.variants:
                    raise ValueError(f"switching.candidates: model '{self.recipe.name}' has no variant '{v}'; "
                                     f"known: {sorted(self.recipe.variants)}")
                self.worker_image(v)
            if self.switching.classes and self.router.policy not in (None, "slo"):
                raise ValueError(f"router.policy: switching.classes needs the class-aware 'slo' policy (it counts "
                                 f"requests per class for the mix decision), not '{self.router.policy}'")
        if self.router.enabled:
            try:
                self.router_config()
            except ValidationError as e:  # named as the router's config names them (settings are its fields)
                raise ValueError(validation_problems(e, whole="config", prefix="router: ")) from None
        return self

    def router_policy(self) -> tuple[str | None, dict[str, Any]]:
        """The router's policy and its options. With service classes the router runs the `slo` filter, its
        per-class limits derived from the recipe's profiles (`switching.classes.slo_policy_config`), so that
        requests reach the variants that meet their objective and the switcher sees per-class counts."""
        sw = self.switching
        if sw is None or not sw.classes:
            return self.router.policy, {}
        from zoe_cluster.switching.classes import slo_policy_config

        return "slo", slo_policy_config(self.recipe, sw.classes, sw.candidates, sw.slo_headroom)

    def router_config(self, admin_key: str | None = None) -> RouterConfig:
        """The deployment's router as the router process reads it: address, policy, the served model, settings."""
        policy, options = self.router_policy()
        fields: dict[str, Any] = {"host": self.router.host, "port": self.router.port, "policy_config": options,
                                  "models": [self.recipe.served_model_name], "admin_key": admin_key}
        if policy is not None:
            fields["policy"] = policy
        return RouterConfig(**{**fields, **self.router.settings})

    def adapter(self) -> EngineAdapter:
        """The adapter of the deployment's engine (what it can do, how it starts, how its metrics read)."""
        return get_adapter(self.engine)

    def variant_of(self, index: int) -> str:
        return self.replica_variants.get(index, self.variant)

    def worker_image(self, variant: str) -> str | None:
        """The worker image whose nodes run `variant` (`worker_images` of its recipe image), or None where any node
        does (no `worker_images`, or a simulated engine). Raises ValueError when no worker image carries it."""
        if self.adapter().is_simulated or not self.worker_images:
            return None
        image = self.recipe.variant(variant).image
        if image not in self.worker_images:
            have = ", ".join(f"{name} (FROM {base})" for base, name in sorted(self.worker_images.items()))
            raise ValueError(f"variant '{variant}' of {self.recipe.name} runs on {image}, and no worker image of the "
                             f"cluster is built FROM it (worker images: {have})")
        return self.worker_images[image]

    def shape(self, variant: str) -> GangShape:
        v = self.recipe.variant(variant)
        # A simulated engine runs anywhere: it keeps the GPU count (so placement is realistic) but not the type
        # or the image.
        adapter = self.adapter()
        return GangShape.of(v.parallelism, None if adapter.is_simulated else v.accelerator_type,
                            adapter.places_own_workers, self.worker_image(variant))

    def pool(self, variant: str) -> str:
        """Router pool of a replica: "long" when its variant is meant for contexts past LONG_CONTEXT_TOKENS (the
        long-context kernels), else "default"; the router sends long prompts to the long pool first."""
        return "long" if self.recipe.variant(variant).intended.context_tokens[1] > LONG_CONTEXT_TOKENS else "default"
