"""The simulated weights load: fast unless `real` is asked for; replays (and so the switching evaluation) always
price a swap at the recipe's real load time."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zoe_cluster.recipes import RecipeRegistry
from zoe_cluster.sim.load_time import FAST_LOAD_S, load_s, real_load_s

GLM = RecipeRegistry.default().get("glm-5.3")
VARIANT = "fp8-tp8-zoe"


def test_fast_is_seconds_and_real_is_the_recipe_estimate():
    real = GLM.variant(VARIANT).profile.weights_load_s.value
    assert real > 60 * FAST_LOAD_S  # minutes against seconds: the point of the default
    assert load_s(GLM, VARIANT, "fast") == FAST_LOAD_S
    assert load_s(GLM, VARIANT, "real") == real_load_s(GLM, VARIANT) == real
    with pytest.raises(ValueError, match="fast, real"):
        load_s(GLM, VARIANT, "slow")  # type: ignore[arg-type]


def test_a_served_replica_loads_fast_by_default_and_really_when_asked():
    from zoe_cluster.sim.server import ServerConfig, SimServer

    fast = SimServer(GLM, VARIANT, ServerConfig(served_model_name="glm-5.3"))
    real = SimServer(GLM, VARIANT, ServerConfig(served_model_name="glm-5.3", load_time="real"))
    pinned = SimServer(GLM, VARIANT, ServerConfig(served_model_name="glm-5.3", load_time="real", startup_s=0.5))
    assert fast.startup_s == FAST_LOAD_S
    assert real.startup_s == GLM.variant(VARIANT).profile.weights_load_s.value
    assert pinned.startup_s == 0.5


def test_replay_swaps_cost_the_real_load_time():
    from zoe_cluster.sim.calibrate import calibrate
    from zoe_cluster.sim.replay import ReplayFleet

    fleet = ReplayFleet(GLM, [VARIANT], lambda v: calibrate(GLM, v), kv_tokens=None)
    assert fleet.load_s("mxfp4-tp8") == GLM.variant("mxfp4-tp8").profile.weights_load_s.value


def test_sim_serve_rejects_an_unknown_load_time():
    from zoe_cluster.cli.main import app

    r = CliRunner().invoke(app, ["sim", "serve", "--model", "glm-5.3", "--load-time", "slow"])
    assert r.exit_code != 0 and "--load-time must be one of fast, real" in " ".join(r.output.split())
