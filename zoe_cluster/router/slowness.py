"""Slow and stalled replicas: pure decisions over latency facts the proxy records.

A replica much slower than its peers stops receiving new requests until it recovers:

- Facts, per replica (`LatencyFacts`): the latest `window` samples of the time per output token of its finished
  streams (`tpot_s`: time between the first and the last SSE event over the events between them), and of its
  non-streamed requests (`e2e_per_token_s`: whole request time over `usage.completion_tokens`), each with its
  sample count. The two are kept apart because one includes the prefill and the other does not.
- Decision (`slow_replicas`): a replica is slow when, for a measure it and at least one peer have `min_samples`
  of, the median of its window exceeds `factor` times the median of its peers' medians. A median, not a moving
  average: a healthy engine's decode steps stretch while it runs another request's long prefill in chunks
  (agentic prompts of 100K+ tokens), so one short stream that decoded beside such a prefill can show many times
  the usual time per token; a replica slow on most of its recent requests is what the decision is for. Time to
  first token is not used: with prefix-aware routing it differs by the cache hits a replica gets, not by the
  replica's speed; queueing is already in the policies' load terms.
- Recovery (`probe_due`): a slow replica receives no new work, so it gives no new samples; every `probe_s` one
  request goes to it as a probe, and the probe's sample replaces its window (`record_sample(..., probe=True)`), so
  a replica that recovered is judged on how it is now.

A replica that hangs mid-request is found by `stall_verdict`: a request that waited `stall_timeout_s` on a replica
whose decoding streams all sent no byte for `stall_timeout_s` gives up on it, and the replica is ejected.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

MEASURES = ("tpot_s", "e2e_per_token_s")

JUDGE_EVERY_S = 0.2
"""Slowness is judged again at most this often (each judgement is quadratic in the replicas of a group), and
after every probe."""


@dataclass
class LatencySamples:
    """The latest samples of one measure, seconds (at most the window `record_sample` is given), and how many
    were ever recorded."""

    recent: deque[float] = field(default_factory=deque)
    samples: int = 0

    @property
    def value(self) -> float | None:
        """The median of the recent samples (None before the first)."""
        return statistics.median(self.recent) if self.recent else None


@dataclass
class LatencyFacts:
    """One replica's latency record (mutated by `record_sample`; read by the decisions)."""

    tpot_s: LatencySamples
    e2e_per_token_s: LatencySamples
    slow_since: float | None = None
    """Monotonic time the replica was found slow (None: not slow)."""
    last_probe_at: float = 0.0

    @classmethod
    def empty(cls) -> "LatencyFacts":
        return cls(LatencySamples(), LatencySamples())


def record_sample(facts: LatencyFacts, measure: str, sample_s: float, window: int, probe: bool = False) -> None:
    """Add one sample of `measure` (seconds), keeping the latest `window`; a probe's sample replaces them."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    e: LatencySamples = getattr(facts, measure)
    if probe:
        e.recent.clear()
    e.recent.append(sample_s)
    while len(e.recent) > window:
        e.recent.popleft()
    e.samples += 1


def slow_replicas(facts: Mapping[str, LatencyFacts], factor: float, min_samples: int) -> dict[str, str]:
    """Replica id -> why, for each replica whose recent median is over `factor` x its peers' median on some
    measure."""
    out: dict[str, str] = {}
    for measure in MEASURES:
        vals = {rid: getattr(f, measure).value for rid, f in facts.items()
                if getattr(f, measure).samples >= min_samples and getattr(f, measure).value is not None}
        if len(vals) < 2:
            continue
        for rid, v in vals.items():
            peers = statistics.median(x for r, x in vals.items() if r != rid)
            if peers > 0 and v > factor * peers and rid not in out:
                out[rid] = f"{measure} {v * 1000:.1f} ms > {factor:g} x peers' median {peers * 1000:.1f} ms"
    return out


def mark_slow(facts: Mapping[str, LatencyFacts], was_slow: Iterable[str], slow: Mapping[str, str],
              now: float) -> tuple[list[str], list[str]]:
    """Apply a judgement: stamp `slow_since` on the replicas newly in `slow`, clear it on those no longer in it.
    Returns (newly slow, recovered)."""
    was = set(was_slow)
    newly = [rid for rid in slow if rid not in was and rid in facts]
    recovered = [rid for rid in was if rid not in slow and rid in facts]
    for rid in newly:
        facts[rid].slow_since = now
    for rid in recovered:
        facts[rid].slow_since = None
    return newly, recovered


def judge_due(judged_at: float, now: float, probe: bool, every_s: float = JUDGE_EVERY_S) -> bool:
    """Whether the slow set is judged again after a sample: always after a probe, else at most every `every_s`."""
    return probe or now - judged_at >= every_s


def probe_due(facts: LatencyFacts, now: float, probe_s: float) -> bool:
    """Whether a slow replica may get one request now to measure whether it recovered."""
    return now - max(facts.last_probe_at, facts.slow_since or 0.0) >= probe_s


def stall_verdict(now: float, waiting_since: float, replica_last_byte_at: float, replica_decoding_streams: int,
                  stall_timeout_s: float, limit_s: float, replica_hung: bool = False
                  ) -> Literal["wait", "stalled", "timeout"]:
    """What a request waiting on a replica since `waiting_since` (for its response, its first event, or its next
    chunk) should do: "timeout" once it waited `limit_s`; "stalled" (the replica is hung: eject it) once it waited
    `stall_timeout_s` while the replica has streams past their first event and none of them sent a byte for
    `stall_timeout_s` (an engine decodes every running request at each step, so a live one is never silent that
    long; without decoding streams a long prefill cannot be told from a hang, and only `limit_s` applies), or at
    once when another request already found the replica hung (`replica_hung`); else "wait"."""
    if now - waiting_since >= limit_s:
        return "timeout"
    if replica_hung:
        return "stalled"
    if (replica_decoding_streams > 0 and now - waiting_since >= stall_timeout_s
            and now - replica_last_byte_at >= stall_timeout_s):
        return "stalled"
    return "wait"


def next_stall_check_s(now: float, waiting_since: float, replica_last_byte_at: float, stall_timeout_s: float,
                       limit_s: float) -> float:
    """Seconds until `stall_verdict` can next change its answer from "wait"."""
    at = min(waiting_since + limit_s, max(waiting_since, replica_last_byte_at) + stall_timeout_s)
    return max(0.01, at - now)
