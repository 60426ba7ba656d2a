"""Decode workload: per-user and per-node output tok/s by request concurrency (seed Fig. 15-17).

For each concurrency C and each run, C streams of the same prompt start together, each generating exactly
`output_len` tokens (`ignore_eos`). TTFT is excluded, as in the seed:
- per-user tok/s of a stream = (output tokens - 1) / (end - first token); a run's per-user value is the mean
  over its C streams;
- per-node tok/s of a run = the decode tokens of all C streams / the decode window (first first-token to
  last end) / `nodes` (the nodes behind the URL; 1 for a single engine).
When the streams run in lockstep, per-node = C x per-user / nodes; `per_node_from_users_tok_s` (the sum of
the per-user rates / nodes) is reported too, so a report shows whether they agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from zoe_cluster.bench.client import Api, RequestResult, RequestSpec, StreamingClient
from zoe_cluster.bench.stats import summarize


@dataclass(frozen=True)
class DecodeConfig:
    concurrency: list[int]
    output_len: int = 1024
    prompt: str = ""
    prompt_label: str = ""
    runs: int = 3
    warmup: int = 1
    nodes: int = 1
    temperature: float = 1.0
    top_p: float = 0.95
    ignore_eos: bool = True
    api: Api = "chat"

    def __post_init__(self) -> None:
        if self.runs < 1 or self.warmup < 0 or self.nodes < 1 or self.output_len < 2:
            raise ValueError("need runs >= 1, warmup >= 0, nodes >= 1 and output_len >= 2")

    @property
    def total_requests(self) -> int:
        return sum(self.concurrency) * (self.runs + self.warmup)


@dataclass(frozen=True)
class DecodeRun:
    concurrency: int
    per_user_tok_s: float | None
    per_node_tok_s: float | None
    per_node_from_users_tok_s: float | None
    results: list[RequestResult]


def summarize_run(concurrency: int, results: list[RequestResult], nodes: int) -> DecodeRun:
    """Per-user and per-node decode rates of one run of `concurrency` streams (see the module docstring)."""
    good = [r for r in results if r.ok and r.decode_tok_s is not None]
    if not good:
        return DecodeRun(concurrency, None, None, None, results)
    rates = [r.decode_tok_s for r in good]
    window_start = min(r.start_s + r.ttft_s for r in good)
    window_end = max(r.start_s + r.e2e_s for r in good)
    tokens = sum(r.output_tokens - 1 for r in good)
    per_node = tokens / (window_end - window_start) / nodes if window_end > window_start else None
    return DecodeRun(concurrency, sum(rates) / len(rates), per_node, sum(rates) / nodes, results)


async def run_decode(
    client: StreamingClient, config: DecodeConfig, on_request: Callable[[str], None] | None = None
) -> list[dict]:
    """One row per concurrency with mean/std over runs of the per-user and per-node rates."""
    rows = []
    for c in config.concurrency:
        tag = f"C={c}"
        spec = RequestSpec(
            prompt=config.prompt,
            max_tokens=config.output_len,
            api=config.api,
            ignore_eos=config.ignore_eos,
            temperature=config.temperature,
            top_p=config.top_p,
            tag=tag,
        )

        async def one() -> RequestResult:
            result = await client.send(spec)
            if on_request:
                on_request(tag)
            return result

        runs: list[DecodeRun] = []
        for i in range(config.warmup + config.runs):
            results = await asyncio.gather(*(one() for _ in range(c)))
            if i >= config.warmup:
                runs.append(summarize_run(c, list(results), config.nodes))
        all_results = [r for run in runs for r in run.results]
        good = [r for r in all_results if r.ok]
        errors = [r.error for r in all_results if not r.ok]
        rows.append(
            {
                "concurrency": c,
                "runs": config.runs,
                "completed": len(good),
                "errors": len(errors),
                "error_samples": errors[:3],
                "per_user_tok_s": summarize([r.per_user_tok_s for r in runs if r.per_user_tok_s is not None]),
                "per_node_tok_s": summarize([r.per_node_tok_s for r in runs if r.per_node_tok_s is not None]),
                "per_node_from_users_tok_s": summarize(
                    [r.per_node_from_users_tok_s for r in runs if r.per_node_from_users_tok_s is not None]
                ),
                "stream_tok_s": summarize([r.decode_tok_s for r in good if r.decode_tok_s is not None]),
                "ttft_s": summarize([r.ttft_s for r in good]),
                "itl_s": summarize([x for r in good for x in r.itl_s]),
                "output_tokens_mean": sum(r.output_tokens for r in good) / len(good) if good else None,
            }
        )
    return rows
