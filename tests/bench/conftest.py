"""Servers the bench tests measure: zoe's simulated engine (`zoe sim serve`) in vLLM and SGLang metrics modes,
started with the simulated engine's own test helper."""

from __future__ import annotations

import pytest

from tests.sim.helpers import sim_server

SIM_TIME_SCALE = 0.05
"""Wall seconds per modelled second: GLM-5.3's 0.44 s TTFT at 8K takes 22 ms."""
SIM_ARGS = ("--model", "glm-5.3", "--variant", "fp8-tp8", "--time-scale", str(SIM_TIME_SCALE), "--startup-s", "0")


@pytest.fixture(scope="module")
def sim_url():
    """A simulated GLM-5.3 (fp8-tp8 baseline) replica with vLLM's metric names."""
    with sim_server(*SIM_ARGS) as (url, _):
        yield url


@pytest.fixture(scope="module")
def sim_sglang_url():
    """The same simulated replica exposing SGLang's metric names (`sglang:cached_tokens_total`, ...)."""
    with sim_server(*SIM_ARGS, "--metrics", "sglang") as (url, _):
        yield url
