"""How long one engine step takes on the modelled hardware: the step-time model of the simulated engine.

An engine step (one forward pass of the batch the scheduler picked) costs:

- a pure decode step of n tokens (n = requests, or requests x (1 + proposed tokens) with speculative decoding):
      a + b * experts(n) + c * n + d * sum(context of each decode token)
  where experts(n) = E * (1 - (1 - k/E)^n) is the expected number of distinct routed experts the n tokens
  touch (E routed experts, top-k). A decode step reads the weights of every expert it touches once, so the
  step grows quickly at small n and saturates once every expert is read; at small n this is the straight line
  the seed fits ("17.4 ms + 0.3 ms per token", seed section Speculative decoding, table A7).
- a step that carries a prefill chunk of m tokens at positions p..p+m-1 (plus any decode tokens):
      max(floor, q * m) + d * sum(positions) + e * sum(positions^2) + c * n_decode + d * sum(decode context)
  (plus `prefill_step_base_s` and the decode tokens' own d, `decode_context_per_token_s`, where those were measured
  apart: an engine whose every step pays a fixed overhead, and whose decode attention differs from its prefill's)
  q is the per-token prefill work (MoE, projections, fixed-size sparse attention); the `floor` is the least a
  prefill step costs (small chunks do not fill the GPUs); d is the work that grows with context (the DSA
  lightning indexer scores every earlier position; CSA top-K), e the growth beyond that seen at the longest
  contexts (seed table A5: 5.1x per doubling from 256K to 512K tokens).
- each prefill chunk also pays `prefill_kv_read_s` per token of the context it attends over (its start position
  plus its own tokens), where that was measured: an engine that reads a request's whole KV once per chunk (vLLM on
  CPU: a short suffix after a long cached prefix took longer than its tokens' work at their positions).
- a step carrying a prefill chunk and decode tokens together (a mixed step) pays `mixed_step_s` +
  `mixed_decode_per_token_s` * n_decode more, where those were measured (vLLM on CPU: a chunk sent while streams decode
  takes longer than the chunk and the decode tokens priced apart).
- every request also pays `frontend_s` once (HTTP, tokenization, detokenization, scheduling latency): latency,
  not engine time, so it never occupies the step loop.
- the first step after the engine had nothing to do takes `idle_wake_s` longer (an engine loop that blocks when
  idle and whose worker threads sleep pays for waking up: measured on vLLM, not assumed elsewhere).

All times are seconds of the modelled hardware. `zoe_cluster.sim.calibrate` fits the numbers per recipe variant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepModel:
    """Fitted step-time coefficients of one recipe variant (seconds)."""

    decode_base_s: float
    """a: fixed cost of a decode step (kernel launches, all-reduces, non-expert weights)."""
    decode_per_expert_s: float
    """b: cost per distinct routed expert the step's tokens touch (reading its weights)."""
    decode_per_token_s: float
    """c: compute per token in a step."""
    routed_experts: int
    """E of the model (experts(n) saturates at E)."""
    experts_per_token: int
    """k of the model (top-k routed experts per token)."""
    prefill_per_token_s: float
    """q: prefill work per new prompt token."""
    prefill_floor_s: float
    """Least time a step with a prefill chunk takes."""
    context_per_token_s: float
    """d: cost per (token x earlier position) it attends to or scores."""
    context2_per_token_s: float = 0.0
    """e: cost per (token x position^2): growth beyond quadratic at the longest contexts."""
    frontend_s: float = 0.0
    """Per-request latency outside the engine loop, added to TTFT and end-to-end latency."""
    spec_proposed_tokens: int = 0
    """Draft tokens proposed per request per step (0: no speculative decoding)."""
    spec_accepted_tokens: float = 1.0
    """Mean tokens a request emits per step (1 + accepted drafts); 1 without speculative decoding."""
    prefill_step_base_s: float | None = None
    """Fixed cost every step carrying a prefill chunk pays on top of its work, as a decode step pays a: the engine's
    per-step overhead (scheduling, sampling, launches), where it was measured apart from the floor (vLLM on CPU);
    None: none, the floor standing in for it."""
    idle_wake_s: float = 0.0
    """Extra time of the first step after the engine had no work (vLLM's engine loop blocks on its input queue when
    idle); requests that arrive while it steps do not pay it. 0: none."""
    decode_context_per_token_s: float | None = None
    """Cost per (decode token x position it attends to), when measured apart from the prefill's d (an engine whose
    decode attention kernel differs from its prefill one: vLLM on CPU); None: d."""
    prefill_kv_read_s: float = 0.0
    """Cost per token of context a prefill chunk attends over (start + chunk tokens), once per chunk; 0: none."""
    mixed_step_s: float = 0.0
    """Extra fixed cost of a step that carries both a prefill chunk and decode tokens (measured from prefill
    requests sent while streams decode); 0: none."""
    mixed_decode_per_token_s: float = 0.0
    """Extra cost per decode token of such a mixed step; 0: none."""

    @property
    def decode_context_s(self) -> float:
        """The context term of decode tokens (`decode_context_per_token_s`, else d)."""
        d = self.decode_context_per_token_s
        return self.context_per_token_s if d is None else d

    def experts(self, n_tokens: int) -> float:
        """Expected distinct routed experts touched by n tokens."""
        e = self.routed_experts
        return e * (1.0 - (1.0 - self.experts_per_token / e) ** n_tokens)

    def decode_step_s(self, n_tokens: int, context_sum: float = 0.0) -> float:
        """A step of n decode tokens (speculative proposals included) whose contexts sum to context_sum."""
        if n_tokens <= 0:
            return 0.0
        return (
            self.decode_base_s
            + self.decode_per_expert_s * self.experts(n_tokens)
            + self.decode_per_token_s * n_tokens
            + self.decode_context_s * context_sum
        )

    def prefill_step_s(
        self, chunk_tokens: int, pos_sum: float, pos2_sum: float, n_decode: int = 0, decode_context_sum: float = 0.0,
        kv_read_tokens: float = 0.0,
    ) -> float:
        """A step carrying `chunk_tokens` prefill tokens (positions summing to pos_sum, squares to pos2_sum)
        plus n_decode decode tokens; `kv_read_tokens`: the contexts its chunks attend over (start + tokens of each)."""
        return (
            max(self.prefill_floor_s, self.prefill_per_token_s * chunk_tokens)
            + (self.prefill_step_base_s or 0.0)
            + self.context_per_token_s * pos_sum
            + self.decode_context_s * decode_context_sum
            + self.context2_per_token_s * pos2_sum
            + self.prefill_kv_read_s * kv_read_tokens
            + self.decode_per_token_s * n_decode
            + ((self.mixed_step_s + self.mixed_decode_per_token_s * n_decode) if n_decode > 0 else 0.0)
        )

    @property
    def tokens_per_decode_request(self) -> int:
        """Tokens one decoding request puts in a step (1 + proposed drafts)."""
        return 1 + self.spec_proposed_tokens

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def position_sums(start: int, n: int) -> tuple[float, float]:
    """Sum and sum of squares of the positions start .. start+n-1 (closed form)."""
    if n <= 0:
        return 0.0, 0.0
    end = start + n  # exclusive

    def s1(x: int) -> float:  # sum of 0..x-1
        return x * (x - 1) / 2.0

    def s2(x: int) -> float:  # sum of squares of 0..x-1
        return (x - 1) * x * (2 * x - 1) / 6.0

    return s1(end) - s1(start), s2(end) - s2(start)
