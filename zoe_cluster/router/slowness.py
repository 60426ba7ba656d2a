"""Slow and stalled replicas: pure decisions over latency facts the proxy records.

A replica much slower than its peers stops receiving new requests until it recovers:

- Facts, per replica (`LatencyFacts`): an exponentially weighted moving average (EWMA) of the time per output
  token of its finished streams (`tpot_s`: time between the first and the last SSE event over the events between
  them), and of its non-streamed requests (`e2e_per_token_s`: whole request time over `usage.completion_tokens`),
  each with its sample count. The two are kept apart because one includes the prefill and the other does not.
- Decision (`slow_replicas`): a replica is slow when, for a measure it and at least one peer have `min_samples`
  of, its EWMA exceeds `factor` times the median of its peers' EWMAs. Time to first token is not used: with
  prefix-aware routing it differs by the cache hits a replica gets, not by the replica's speed; queueing is
  already in the policies' load terms.
- Recovery (`probe_due`): a slow replica receives no new work, so it gives no new samples; every `probe_s` one
  request goes to it as a probe, and the probe's sample replaces its EWMA (`record_sample(..., probe=True)`), so a
  replica that recovered is judged on how it is now.

A replica that hangs mid-request is found by `stall_verdict`: a request that waited `stall_timeout_s` on a replica
whose decoding streams all sent no byte for `stall_timeout_s` gives up on it, and the replica is ejected.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

MEASURES = ("tpot_s", "e2e_per_token_s")


@dataclass
class Ewma:
    value: float | None = None
    samples: int = 0


@dataclass
class LatencyFacts:
    """One replica's latency record (mutated by `record_sample`; read by the decisions)."""

    tpot_s: Ewma
    e2e_per_token_s: Ewma
    slow_since: float | None = None
    """Monotonic time the replica was found slow (None: not slow)."""
    last_probe_at: float = 0.0

    @classmethod
    def empty(cls) -> "LatencyFacts":
        return cls(Ewma(), Ewma())


def ewma(prev: float | None, sample: float, alpha: float) -> float:
    """The moving average after one more sample (the sample itself when there is no average yet)."""
    return sample if prev is None else prev + alpha * (sample - prev)


def record_sample(facts: LatencyFacts, measure: str, sample_s: float, alpha: float, probe: bool = False) -> None:
    """Add one sample of `measure` (seconds); a probe's sample replaces the average."""
    e: Ewma = getattr(facts, measure)
    e.value = sample_s if probe else ewma(e.value, sample_s, alpha)
    e.samples += 1


def slow_replicas(facts: Mapping[str, LatencyFacts], factor: float, min_samples: int) -> dict[str, str]:
    """Replica id -> why, for each replica slower than `factor` x the median of its peers on some measure."""
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
