"""The simulated engine's iteration-level scheduler, like vLLM V1's: clock-agnostic, no I/O.

Each step the scheduler first serves running requests in order (a prefilling request gets its next chunk, a
decoding request 1 token, or 1 + proposed drafts with speculative decoding), then admits waiting requests
while `max_num_seqs`, the `max_num_batched_tokens` budget and the KV blocks allow (chunked prefill: a long
prompt is split over steps; a request is admitted only when its whole prompt's blocks are free, as vLLM's
`scheduler_reserve_full_isl` does, though each step allocates only its chunk). With vLLM's
`long_prefill_token_threshold` (`LongPrefillCap`) no request's prefill takes more than that many tokens of a step,
so a short prefill shares the step with a long one instead of waiting for it to finish. When a running request
needs a block and none is free, the most recently admitted
running request is preempted (recompute mode: its blocks are freed and it goes back to the front of the
waiting queue, to prefill its prompt and its output so far again), and nobody new is admitted that step.

The first step after the engine ran dry pays the step model's `idle_wake_s` (vLLM's loop blocks when it has no
work; a request arriving then waits for it to wake), and a request's `queued_s` is the step boundary at which the
engine took it, as vLLM's engine core stamps it.

A driver owns time: it calls `schedule(now)` to get the next `Step` (its duration from the `StepModel`), lets
that much time pass on its clock, then calls `complete(step, end)`. `fast_forward` runs many identical pure
decode steps in one call for the virtual clock (same result as calling schedule/complete for each).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from zoe_cluster.kernel_support import image_engine, release
from zoe_cluster.sim.kv_cache import PrefixCache
from zoe_cluster.sim.step_model import StepModel, position_sums

VLLM_LONE_REQUEST_UNCAPPED = "0.32.0"
"""First vLLM release checked to leave a lone request's prefill uncapped (0.32.0 and 0.33.0 do, 0.29.0 does not;
vllm-project/vllm#57951); an image whose tag names an earlier release is modelled like 0.29."""


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the simulated engine. Times are on the driver's clock, seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: tuple[int, ...] = ()
    """Chain hashes of the prompt's blocks at the engine's block size (`routing.hashing`)."""
    arrival_s: float = 0.0
    payload: Any = None
    """Whatever the driver attaches (the server's stream queue; the replay's routing context)."""
    # state
    computed: int = 0
    """Tokens whose KV exists."""
    prefill_len: int = 0
    """Tokens to prefill before decoding: the prompt, or prompt + output so far after a preemption."""
    output: int = 0
    nblocks: int = 0
    private: int = 0
    held: list[int] = field(default_factory=list)
    reg_upto: int = 0
    cached_tokens: int = -1
    """Prompt tokens found in the prefix cache (HBM) at first admission (-1 before it)."""
    host_cached_tokens: int = 0
    """Prompt tokens loaded from the host KV tier at first admission (beyond `cached_tokens`)."""
    spec_credit: float = 0.0
    queued_s: float | None = None
    """When the engine took the request into its waiting queue: the first step boundary at or after its arrival
    (vLLM's engine core adds new requests between steps and stamps QUEUED then, so its queue + prefill time
    leaves out the step in progress at arrival)."""
    first_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    aborted: bool = False

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prefill_len


@dataclass(slots=True)
class Step:
    """One engine step: who is in it with how many tokens, and how long it takes."""

    entries: list[tuple[SimRequest, int]]
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    steps: int = 1
    """Identical steps this object stands for (>1 only from fast_forward)."""


@dataclass(slots=True)
class EngineCounters:
    """Monotonic counters of one engine, as vLLM's /metrics exposes them."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries_tokens: int = 0
    prefix_hits_tokens: int = 0
    host_hits_tokens: int = 0
    """Prompt tokens loaded from the host KV tier instead of recomputed."""
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    steps: int = 0
    busy_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LongPrefillCap:
    """vLLM V1's `long_prefill_token_threshold`: the most prefill tokens one request gets in a step.

    vLLM's scheduler cuts every request's tokens of the step to the threshold before the step's budget
    (`vllm/v1/core/sched/scheduler.py`, the running and the waiting loops alike). From vLLM 0.32 it skips the
    cut when the running and waiting requests number one ("nobody to starve"); 0.29 cuts a lone request too."""

    threshold_tokens: int = 0
    """`--long-prefill-token-threshold`; 0 leaves prefills uncapped (vLLM's default)."""
    cap_lone_request: bool = False
    """Cut a request that is alone in the engine too (vLLM before 0.32)."""

    def tokens(self, eligible_requests: int) -> int:
        """The cap for a step whose schedule starts with `eligible_requests` running + waiting; 0: none."""
        if self.threshold_tokens <= 0 or (eligible_requests <= 1 and not self.cap_lone_request):
            return 0
        return self.threshold_tokens

    def lone_chunk_tokens(self, max_num_batched_tokens: int) -> int:
        """Prefill tokens per step of a request alone on the engine."""
        cap = self.tokens(1)
        return min(cap, max_num_batched_tokens) if cap else max_num_batched_tokens


def long_prefill_cap(variant: Any) -> LongPrefillCap:
    """The `LongPrefillCap` a recipe variant's engine runs with: its `long_prefill_token_threshold` (vLLM variants;
    SGLang 0.5 has no such option), applied to a lone request as the release its image tag names does (a tag
    without a release, such as a nightly, is taken as current)."""
    threshold = getattr(variant, "long_prefill_token_threshold", 0)
    rel = image_engine(variant.image).release
    earlier = rel is not None and _padded(release(rel)) < _padded(release(VLLM_LONE_REQUEST_UNCAPPED))
    return LongPrefillCap(threshold, cap_lone_request=earlier)


def _padded(v: tuple[int, ...]) -> tuple[int, ...]:
    return v + (0,) * (3 - len(v))


class RequestTooLarge(ValueError):
    """The request can never fit in this engine's KV cache."""


class EngineCore:
    """Waiting and running queues, chunked prefill, prefix cache and preemption for one engine."""

    def __init__(
        self,
        model: StepModel,
        cache: PrefixCache,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 16384,
        long_prefill: LongPrefillCap = LongPrefillCap(),
    ) -> None:
        self.model = model
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.long_prefill = long_prefill
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = EngineCounters()
        self._bs = cache.block_tokens
        self._tpr = model.tokens_per_decode_request
        self._spec = model.spec_proposed_tokens > 0
        self._load_s = 0.0  # host-tier loads of the requests admitted into the step being built
        self._idle = True  # no step ran since the engine last had nothing to do (the next pays idle_wake_s)
        self._arrived: list[SimRequest] = []  # added since the last step boundary (not yet stamped queued_s)

    @classmethod
    def for_variant(cls, model: StepModel, cache: PrefixCache, variant: Any) -> "EngineCore":
        """The engine of one replica of a recipe variant: its scheduler limits and long-prefill cap."""
        return cls(model, cache, variant.max_num_seqs, variant.max_num_batched_tokens, long_prefill_cap(variant))

    # --- requests -----------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        """Queue a request. Raises RequestTooLarge if its prompt plus output can never fit in the KV cache."""
        need = -(-(req.prompt_tokens + req.max_tokens) // self._bs)
        if need > self.cache.num_blocks:
            raise RequestTooLarge(
                f"prompt ({req.prompt_tokens}) + max_tokens ({req.max_tokens}) tokens need {need} KV blocks; "
                f"the cache has {self.cache.num_blocks}"
            )
        req.prefill_len = req.prompt_tokens
        self.waiting.append(req)
        self._arrived.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away)."""
        if req.finish_s is not None:
            return
        req.aborted = True
        if req in self.running:
            self.running.remove(req)
            self.cache.release(req.held, req.private)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.held, req.private, req.nblocks = [], 0, 0
        self.counters.aborted += 1
        if not self.running and not self.waiting:
            self._idle = True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # --- one step -----------------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest) -> None:
        self.cache.release(victim.held, victim.private)
        victim.held, victim.private, victim.nblocks, victim.reg_upto = [], 0, 0, 0
        victim.computed = 0
        victim.prefill_len = victim.prompt_tokens + victim.output
        victim.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(victim)

    def schedule(self, now: float) -> Step | None:
        """Pick the next step's batch and allocate its KV blocks; None when there is nothing to run."""
        for req in self._arrived:
            req.queued_s = now
        self._arrived.clear()
        if not self.running and not self.waiting:
            self._idle = True
            return None
        cache, bs, running = self.cache, self._bs, self.running
        budget = self.max_num_batched_tokens
        cap = self.long_prefill.tokens(len(running) + len(self.waiting))  # counted once per step, as vLLM does
        entries: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(running):
            req = running[i]
            if req.computed < req.prefill_len:
                n = min(req.prefill_len - req.computed, cap or budget, budget)
                if n <= 0:
                    i += 1
                    continue
            else:
                n = self._tpr
                if n > budget:
                    i += 1
                    continue
            need = -(-(req.computed + n) // bs) - req.nblocks
            if need > 0:
                self_preempted = False
                while not cache.allocate(need):
                    victim = running.pop()  # the most recently admitted request goes first
                    self._preempt(victim)
                    preempted = True
                    if victim is req:
                        self_preempted = True
                        break
                if self_preempted:
                    break
                req.nblocks += need
                req.private += need
            entries.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            self._admit(entries, budget, cap)
        if not entries:
            self._idle = True
            return None
        return self._price(entries)

    def _admit(self, entries: list[tuple[SimRequest, int]], budget: int, cap: int) -> None:
        cache, bs, waiting, running = self.cache, self._bs, self.waiting, self.running
        while waiting and len(running) < self.max_num_seqs and budget > 0:
            req = waiting[0]
            # At least one prompt token is always computed (vLLM recomputes the last block on a full hit).
            max_hit_blocks = (req.prefill_len - 1) // bs
            hashes = req.block_hashes[: min(max_hit_blocks, len(req.block_hashes))]
            hit = cache.match(hashes)
            # blocks gone from HBM but still in host memory are loaded back (into newly allocated blocks)
            loaded = cache.host_match(hashes[hit:]) if cache.host_blocks else 0
            hit_tokens = (hit + loaded) * bs
            n = min(req.prefill_len - hit_tokens, cap or budget, budget)
            cache.acquire(hashes[:hit])
            need = -(-(hit_tokens + n) // bs) - hit
            # Like vLLM (scheduler_reserve_full_isl, on by default): admitted only if the blocks for the whole
            # prompt are free now, though only this step's chunk is allocated.
            full = -(-req.prefill_len // bs) - hit
            if full > cache.free_blocks or not cache.allocate(need):
                cache.release(hashes[:hit], 0)
                break
            waiting.popleft()
            running.append(req)
            if not req.preemptions:  # vLLM counts a preempted request's re-admission apart (preempted_queries)
                self.counters.prefix_queries_tokens += req.prefill_len
                self.counters.prefix_hits_tokens += hit * bs
            if req.cached_tokens < 0:
                req.cached_tokens = hit * bs
                req.host_cached_tokens = loaded * bs
            req.held = list(hashes[:hit])
            req.private = need
            for h in hashes[hit:hit + loaded]:  # loaded blocks become cached blocks this request holds
                if cache.register(h):
                    req.held.append(h)
                    req.private -= 1
            if loaded:
                self.counters.host_hits_tokens += loaded * bs
                self._load_s += loaded * bs * cache.host_load_s_per_token
            req.reg_upto = hit + loaded
            req.computed = hit_tokens
            req.nblocks = hit + need
            entries.append((req, n))
            budget -= n

    def _price(self, entries: list[tuple[SimRequest, int]]) -> Step:
        m = self.model
        n_pre = n_dec = 0
        ps = ps2 = dctx = kv = 0.0
        for req, n in entries:
            if req.computed < req.prefill_len:
                n_pre += n
                a, b = position_sums(req.computed, n)
                ps += a
                ps2 += b
                kv += req.computed + n
            else:
                n_dec += n
                dctx += req.computed * n
        if n_pre:
            t = m.prefill_step_s(n_pre, ps, ps2, n_dec, dctx, kv)
        else:
            t = m.decode_step_s(n_dec, dctx)
        # Host-tier loads are charged to the step that admits the request, stalling the whole batch: more
        # pessimistic than engines that load asynchronously while other requests keep running.
        t += self._load_s
        self._load_s = 0.0
        if self._idle:
            t += m.idle_wake_s
            self._idle = False
        return Step(entries, t, n_pre, n_dec)

    def complete(self, step: Step, end: float) -> list[tuple[SimRequest, int]]:
        """Apply a finished step at time `end`: KV and outputs advance, finished requests leave.

        Returns (request, tokens emitted this step) for every request of the step that emitted tokens."""
        if step.steps > 1:
            return self._complete_many(step, end)
        out: list[tuple[SimRequest, int]] = []
        cache, bs, c = self.cache, self._bs, self.counters
        c.steps += step.steps
        c.busy_s += step.duration_s
        finished = False
        for req, n in step.entries:
            if req.aborted:
                continue
            if req.computed < req.prefill_len:
                req.computed += n
                full = min(len(req.block_hashes), req.computed // bs, req.prompt_tokens // bs)
                while req.reg_upto < full:
                    h = req.block_hashes[req.reg_upto]
                    req.reg_upto += 1
                    if cache.register(h):
                        req.held.append(h)
                        req.private -= 1
                if req.computed < req.prefill_len:
                    continue
                emitted = 1
                if req.first_token_s is None:
                    req.first_token_s = end
                    c.prompt_tokens += req.prompt_tokens
            elif self._spec:
                req.spec_credit += self.model.spec_accepted_tokens
                emitted = int(req.spec_credit)
                req.spec_credit -= emitted
            else:
                emitted = 1
            finished |= self._emit(req, emitted, end, out)
        if finished:
            self._retire_finished()
        return out

    # --- many identical decode steps at once (virtual clock) ------------------------------------------
    def _emit(self, req: SimRequest, emitted: int, end: float, out: list[tuple[SimRequest, int]]) -> bool:
        """Hand `emitted` output tokens of one step (or of k fast-forwarded steps) to `req`, at most what it has
        left; a decoding request's KV grows with them. True when the request has finished."""
        emitted = min(emitted, req.max_tokens - req.output)
        req.output += emitted
        if req.computed >= req.prefill_len:
            req.computed += emitted
        self.counters.generation_tokens += emitted
        out.append((req, emitted))
        if req.output >= req.max_tokens:
            req.finish_s = end
            return True
        return False

    def _retire_finished(self) -> None:
        """Drop finished requests from the running queue and return their blocks to the cache."""
        keep = []
        for req in self.running:
            if req.finish_s is None:
                keep.append(req)
            else:
                self.cache.release(req.held, req.private)
                req.held, req.private, req.nblocks = [], 0, 0
                self.counters.finished += 1
        self.running = keep
        if not keep and not self.waiting:  # ran dry: the next step, whenever a request comes, pays the wake-up
            self._idle = True

    def fast_forward(self, now: float, horizon: float) -> Step | None:
        """When every running request is decoding and nobody waits, run k identical decode steps in one Step:
        k stops at the first request to finish, at the step in progress at `horizon` (the driver's next
        outside event), or when the KV blocks for all k steps are not free. None when not applicable."""
        running = self.running
        if self.waiting or not running:
            return None
        n = len(running)
        m = self.model
        acc = m.spec_accepted_tokens if self._spec else 1.0
        k_fin = None
        ctx0 = 0
        for req in running:
            if req.computed < req.prefill_len:
                return None
            left = req.max_tokens - req.output
            # steps until this request has emitted `left` tokens
            k = -(-(left - req.spec_credit) // acc) if self._spec else left
            k = max(1, int(k))
            if k_fin is None or k < k_fin:
                k_fin = k
            ctx0 += req.computed
        tpr = self._tpr
        ntok = n * tpr
        base = m.decode_step_s(ntok, ctx0 * tpr)
        if base <= 0:
            return None
        slope = m.decode_context_s * tpr * n * acc  # decode steps grow as contexts grow
        span = horizon - now
        k = k_fin if span >= base * k_fin else (max(1, int(span // base) + 1) if span > 0 else 1)
        if k <= 1:
            return None
        # KV blocks for k steps
        bs = self._bs
        need = 0
        for req in running:
            grow = int(req.spec_credit + k * acc) if self._spec else k
            need += max(0, -(-(req.computed + grow) // bs) - req.nblocks)
        if need > self.cache.free_blocks:
            return None
        self.cache.allocate(need)
        for req in running:
            grow = int(req.spec_credit + k * acc) if self._spec else k
            extra = max(0, -(-(req.computed + grow) // bs) - req.nblocks)
            req.nblocks += extra
            req.private += extra
        duration = k * base + slope * k * (k - 1) / 2.0
        return Step([(req, tpr) for req in running], duration, 0, ntok * k, k)

    def _complete_many(self, step: Step, end: float) -> list[tuple[SimRequest, int]]:
        k = step.steps
        out: list[tuple[SimRequest, int]] = []
        c = self.counters
        c.steps += k
        c.busy_s += step.duration_s
        finished = False
        for req, _ in step.entries:
            if req.aborted:
                continue
            if self._spec:
                tot = req.spec_credit + k * self.model.spec_accepted_tokens
                emitted = int(tot)
                req.spec_credit = tot - emitted
            else:
                emitted = k
            finished |= self._emit(req, emitted, end, out)
        if finished:
            self._retire_finished()
        return out

