"""Checks of an OpenAI request body before it is routed, so that what an engine would reject is rejected with a
400 at the edge, in OpenAI's error shape, instead of passing the router and failing at the engine.

Two parts, both pure functions of the bytes or the parsed body:

- `parse_json_body(raw, max_depth, max_number_chars)`: JSON with bounded nesting and bounded number literals
  (Python's own parser turns 100k-deep nesting into a RecursionError and a 5000-digit integer into a ValueError,
  which a server otherwise answers with a 500). NaN and Infinity, which are not JSON, are refused too. Used by the
  router and by the simulated engine.
- `check_sampling(endpoint, body)`: the sampling parameters and prompt forms as vLLM 0.32 validates them
  (`vllm/sampling_params.py` `SamplingParams._verify_args`, `vllm/entrypoints/openai/completion/protocol.py`
  `CompletionRequest`), with vLLM's messages and the parameter named in `param`.

Prompt forms of /v1/completions that vLLM accepts, and so the router routes: a non-empty string, a list of token
ids (>= 0), a list of lists of token ids, a list of at most `MAX_COMPLETION_PROMPTS` strings (a batch; routed by
its first prompt).
"""

from __future__ import annotations

import json
import math
from typing import Any

from zoe_cluster.routing.json_limits import limit_violation

MAX_COMPLETION_PROMPTS = 1024
"""vLLM's VLLM_MAX_COMPLETION_PROMPTS default: the longest batch of prompts one request may carry."""

class RequestError(ValueError):
    """A request an engine would reject: the message says why, `param` names the field (or None)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
"""One decoder for every body (json.loads with a keyword argument builds a new one per call)."""


def parse_json_body(raw: bytes, max_depth: int, max_number_chars: int) -> Any:
    """The parsed JSON of a request body; RequestError when it is not JSON, is nested deeper than `max_depth`,
    or has a number literal longer than `max_number_chars` characters.

    Both bounds are checked on the bytes before parsing (`routing.json_limits`)."""
    violation = limit_violation(raw, max_depth, max_number_chars)
    if violation is not None:
        raise RequestError(violation)
    try:
        return _DECODER.decode(raw.decode("utf-8"))
    except RecursionError:
        raise RequestError(f"the JSON body is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(f"malformed JSON body: {e}") from None


def _number(body: dict, name: str) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise RequestError(f"{name} must be a number, got {json.dumps(v)[:40]}.", name)
    return v


def _integer(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{name} must be an integer, got {json.dumps(v)[:40]}.", name)
    return v


def check_sampling(endpoint: str, body: dict[str, Any]) -> None:
    """Raise RequestError for a sampling parameter or prompt vLLM 0.32 rejects (messages as vLLM words them)."""
    max_tokens = _integer(body, "max_tokens")
    mct = _integer(body, "max_completion_tokens")
    echo_only = endpoint == "completions" and body.get("echo") is True and max_tokens == 0  # vLLM: prompt echo
    for name, v in (("max_completion_tokens", mct), ("max_tokens", max_tokens)):
        if v is not None and v < 1 and not (name == "max_tokens" and echo_only):
            raise RequestError(f"max_tokens must be at least 1, got {v}.", name)
    n = _integer(body, "n")
    if n is not None and n < 1:
        raise RequestError(f"n must be at least 1, got {n}.", "n")
    t = _number(body, "temperature")
    if t is not None:
        if not math.isfinite(t):
            raise RequestError(f"temperature must be a finite number, got {t}.", "temperature")
        if t < 0.0:
            raise RequestError(f"temperature must be non-negative, got {t}.", "temperature")
        if t > 2.0:
            raise RequestError(f"temperature must be in [0, 2], got {t}.", "temperature")
    p = _number(body, "top_p")
    if p is not None and not 0.0 < p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {p}.", "top_p")
    k = _integer(body, "top_k")
    if k is not None and k < -1:
        raise RequestError(f"top_k must be 0 (disable), or at least 1, got {k}.", "top_k")
    mp = _number(body, "min_p")
    if mp is not None and not 0.0 <= mp <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {mp}.", "min_p")
    for name in ("presence_penalty", "frequency_penalty"):
        v = _number(body, name)
        if v is not None and not -2.0 <= v <= 2.0:
            raise RequestError(f"{name} must be in [-2, 2], got {v}.", name)
    rp = _number(body, "repetition_penalty")
    if rp is not None and not (math.isfinite(rp) and rp > 0.0):
        raise RequestError(f"repetition_penalty must be a finite number greater than zero, got {rp}.",
                           "repetition_penalty")
    mnt = _integer(body, "min_tokens")
    if mnt is not None:
        if mnt < 0:
            raise RequestError(f"min_tokens must be greater than or equal to 0, got {mnt}.", "min_tokens")
        limit = max_tokens if endpoint == "completions" or mct is None else mct
        if limit is not None and mnt > limit:
            raise RequestError(f"min_tokens must be less than or equal to max_tokens={limit}, got {mnt}.",
                               "min_tokens")
    if body.get("stream_options") and not body.get("stream"):
        raise RequestError("Stream options can only be defined when `stream=True`.", "stream_options")
    if endpoint == "completions":
        _check_prompt(body.get("prompt"))


def _check_prompt(prompt: Any) -> None:
    if prompt is None or prompt == "" or prompt == []:
        raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, str):
        return
    if not isinstance(prompt, list):
        raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of lists of "
                           "token ids.", "prompt")
    first = prompt[0]
    if isinstance(first, int) and not isinstance(first, bool):
        _token_ids(prompt)
        return
    if len(prompt) > MAX_COMPLETION_PROMPTS:
        raise RequestError(f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                           f"{MAX_COMPLETION_PROMPTS}.", "prompt")
    if isinstance(first, str):
        if not all(isinstance(p, str) for p in prompt):
            raise RequestError("prompt: a list of prompts must hold only strings.", "prompt")
        return
    if isinstance(first, list):
        for ids in prompt:
            if not isinstance(ids, list) or not ids:
                raise RequestError("prompt: a list of token-id lists must hold only non-empty lists.", "prompt")
            _token_ids(ids)
        return
    raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of lists of "
                       "token ids.", "prompt")


def _token_ids(ids: list) -> None:
    if not all(type(t) is int for t in ids):
        raise RequestError("prompt: token ids must be integers.", "prompt")
    if min(ids) < 0:
        raise RequestError(f"prompt: token ids must be >= 0, got {min(ids)}.", "prompt")
