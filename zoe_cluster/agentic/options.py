"""The session options `zoe sim replay --sessions` and `zoe bench agentic` share, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zoe_cluster.agentic.driver import SessionDriver
from zoe_cluster.agentic.prompts import Scaling
from zoe_cluster.agentic.trace import load_sessions


@dataclass(frozen=True)
class SessionOptions:
    live_sessions: int
    total_sessions: int | None = None
    think_cap_s: float | None = 60.0
    block_tokens: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    warmup_requests: int = 0
    salt: int = 0
    limit_files: int | None = None
    ramp_up_s: float = 0.0

    def driver(self, path: str | Path) -> SessionDriver:
        """Load the sessions under `path` and build the driver; raises ValueError (SessionFileError included)
        with a message for the user."""
        if self.warmup_requests < 0:
            raise ValueError(f"--warmup-requests must be >= 0, got {self.warmup_requests}")
        sessions = load_sessions(path, self.limit_files)
        scaling = Scaling(self.block_tokens, self.max_input_tokens, self.max_output_tokens)
        return SessionDriver(sessions, self.live_sessions, total_sessions=self.total_sessions,
                             think_cap_s=self.think_cap_s, scaling=scaling, salt=self.salt,
                             warmup_requests=self.warmup_requests, ramp_up_s=self.ramp_up_s)


REPORT_FIELDS = (
    "requests", "completed", "dropped", "errors", "prefix_hit_rate", "reuse_ceiling", "ttft_p50_s", "ttft_p90_s",
    "ttft_p99_s", "ttft_floor_p90_s", "itl_p50_s", "itl_p90_s", "e2e_p90_s", "output_tok_s", "output_tok_s_per_gpu",
)
"""The report's fields in the order the console shows them (`metrics.summarize` writes these and more)."""
