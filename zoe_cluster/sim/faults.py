"""Fault injection for the simulated engine: the failures a real replica has, on demand and reproducibly.

Knobs (CLI flags of `zoe sim serve`, environment variables `ZOE_SIM_*` from the engine adapter, or, on a
server started with `--fault-endpoint`, `POST /sim/faults` with a JSON body of the same field names at run time):

- `crash_after`: the process exits (code 3) when request number N arrives: an engine crash.
- `hang_after`: from request N on, the engine stops: no more steps, and /health, /metrics and new requests
  never answer (a wedged GPU or a deadlock); `POST /sim/faults {"hang_after": null}` heals it.
- `error_after`: from request N on, completions answer HTTP 500 (an engine that lost its mind but still
  answers /health).
- `error_rate`: each request fails with HTTP 500 with this probability (seeded: the same seed fails the same
  requests).
- `slowdown`: every step takes this many times longer (thermal throttling, a noisy neighbour).
"""

from __future__ import annotations

import os
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ENV_PREFIX = "ZOE_SIM_"


class FaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    crash_after: int | None = Field(default=None, ge=1, description="Exit (code 3) when request N arrives.")
    hang_after: int | None = Field(default=None, ge=1, description="Stop answering from request N on.")
    error_after: int | None = Field(default=None, ge=1, description="Answer HTTP 500 from request N on.")
    error_rate: float = Field(default=0.0, ge=0, le=1, description="Probability a request answers HTTP 500.")
    slowdown: float = Field(default=1.0, gt=0, description="Multiplier on every step's duration.")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "FaultConfig":
        """Read ZOE_SIM_CRASH_AFTER, ZOE_SIM_HANG_AFTER, ZOE_SIM_ERROR_AFTER, ZOE_SIM_ERROR_RATE, ZOE_SIM_SLOWDOWN."""
        env = os.environ if env is None else env
        data: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = env.get(ENV_PREFIX + name.upper())
            if raw not in (None, ""):
                data[name] = raw
        return cls.model_validate(data)

    def to_env(self) -> dict[str, str]:
        return {ENV_PREFIX + k.upper(): str(v) for k, v in self.model_dump().items() if v is not None}


class FaultState:
    """Applies a FaultConfig to the stream of requests of one server."""

    def __init__(self, config: FaultConfig, seed: int) -> None:
        self.config = config
        self.requests = 0
        self.hung = False
        self._rng = random.Random(seed ^ 0x5EED)

    def on_request(self) -> str | None:
        """Count a new request; returns 'crash', 'hang', 'error' or None."""
        self.requests += 1
        c, n = self.config, self.requests
        draw = self._rng.random()  # drawn for every request, so the sequence depends only on the seed
        if c.crash_after is not None and n >= c.crash_after:
            return "crash"
        if self.hung or (c.hang_after is not None and n >= c.hang_after):
            self.hung = True
            return "hang"
        if c.error_after is not None and n >= c.error_after:
            return "error"
        if c.error_rate and draw < c.error_rate:
            return "error"
        return None
