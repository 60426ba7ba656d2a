"""The live path of mixed fleets: a deployment with service classes runs its router with the `slo` filter (limits
derived from the recipe), and the controller reads the router's load report (`GET /admin/load`, per-class counts
from its `LoadLedger`) back, which is what `SwitchLoop` hands to `decide` (the same function the replay uses)."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from pydantic import ValidationError

from zoe_cluster.cluster.router_link import RouterLink
from zoe_cluster.cluster.spec import DeploymentRouter, DeploymentSpec
from zoe_cluster.recipes.loader import RecipeRegistry
from zoe_cluster.routing import validate_policy_config
from zoe_cluster.switching import SwitchConfig
from zoe_cluster.switching.vocabulary import ServiceClass

A, B = "fp8-tp8-nightly", "mxfp4-tp8"
CLASSES = [ServiceClass(name="interactive", ttft_s=1.0, itl_s=0.020),
           ServiceClass(name="standard", ttft_s=2.0, itl_s=0.030)]


def spec(policy=None, classes=CLASSES):
    recipe = RecipeRegistry.default().get("glm-5.3")
    return DeploymentSpec(name="glm", recipe=recipe, variant=B, replicas=4, engine="sim",
                          router=DeploymentRouter(policy=policy),
                          switching=SwitchConfig(candidates=[A, B], classes=classes))


def test_classes_put_the_router_on_the_slo_filter_with_limits_from_the_recipe():
    policy, options = spec().router_policy()
    assert policy == "slo"
    validate_policy_config(policy, options)
    limits = options["classes"]
    # Only FP8 is fast enough for a 20 ms ITL (MXFP4 is at 19.2 ms with one request, seed A8, over the 95% margin).
    assert set(limits["interactive"]) == {A} and 1 <= limits["interactive"][A] < limits["standard"][A]
    assert options["default_class"] == "standard"


def test_without_classes_the_configured_policy_stays():
    assert spec(policy="least_load", classes=[]).router_policy() == ("least_load", {})


def test_classes_with_another_policy_are_rejected_naming_the_field():
    with pytest.raises(ValidationError, match="router.policy: switching.classes needs"):
        spec(policy="prefix")


def test_the_controller_hands_its_router_the_whole_typed_config(monkeypatch):
    """One RouterConfig end to end: the deployment's router config, through `zoe router --config-json` (keys in the
    environment, never on the command line), is the config the router process builds."""
    from typer.testing import CliRunner

    import zoe_cluster.router.app as router_app
    from zoe_cluster.cli.main import app
    from zoe_cluster.cli import router as cli_router
    from zoe_cluster.cluster.router_link import router_argv

    s = spec().model_copy(update={"router": DeploymentRouter(port=9123, settings={"max_retries": 1})})
    argv = router_argv(s.router_config())
    assert argv[1:4] == ["-m", "zoe_cluster.cli.main", "router"] and "admin_key" not in argv[-1]
    seen = {}
    monkeypatch.setattr(router_app, "build_router", lambda cfg, membership=None: cfg)
    monkeypatch.setattr(cli_router, "run_router", lambda router, cfg, log_level="warning": seen.update(cfg=cfg))
    monkeypatch.setenv("ZOE_ROUTER_ADMIN_KEY", "secret")
    out = CliRunner().invoke(app, argv[3:])
    assert out.exit_code == 0, out.output
    assert seen["cfg"] == s.router_config(admin_key="secret")
    assert seen["cfg"].policy == "slo" and seen["cfg"].max_retries == 1 and seen["cfg"].port == 9123


def test_a_router_setting_the_router_does_not_know_is_refused_with_the_deployment():
    with pytest.raises(ValidationError, match="router: max_retrys: Extra inputs are not permitted"):
        DeploymentSpec.model_validate(spec().model_dump() | {"router": {"settings": {"max_retrys": 1}}})


def test_controller_reads_per_class_in_flight_from_the_router():
    """An interactive request held by a hanging (FAKE) backend shows in the router's per-class count."""
    from tests.router.fake_backend import FakeBackend, ServerThread
    from zoe_cluster.router.app import build_router
    from zoe_cluster.router.config import RouterConfig
    from zoe_cluster.router.membership import MemberReplica, Membership

    backends = [FakeBackend("fast", mode="hang"), FakeBackend("bulk")]
    servers = [ServerThread(b.app).start() for b in backends]
    members = Membership(version=0, replicas=[MemberReplica(id=f"d/{i}/0", url=s.url, variant=v)
                                              for i, (s, v) in enumerate(zip(servers, (A, B)))])
    config = RouterConfig(models=["m"], health_interval_s=0, policy="slo", admin_key="k",
                         policy_config={"classes": {"interactive": {A: 4}, "standard": {B: 32}}})
    router = ServerThread(build_router(config, membership=members).app).start()

    def hold():
        body = {"model": "m", "prompt": "hello " * 20, "max_tokens": 4}
        try:
            httpx.post(router.url + "/v1/completions", json=body, headers={"x-zoe-slo": "interactive"}, timeout=3)
        except httpx.HTTPError:
            pass

    async def counts():
        link = RouterLink(router.url, admin_key="k")
        try:
            for _ in range(50):
                load = await link.load()
                got = load.in_flight_by_class if load else None
                if got and got.get("interactive"):
                    return got, load.prefill_tokens_by_class
                await asyncio.sleep(0.05)
            return got, None
        finally:
            await link.close()

    t = threading.Thread(target=hold)
    t.start()
    try:
        in_flight, prefill = asyncio.run(counts())
        assert in_flight == {"interactive": 1}
        assert prefill["interactive"] > 0 and prefill.get("standard", 0) == 0  # the held prompt, nothing cached
    finally:
        t.join()
        router.stop()
        for s in servers:
            s.stop()


def test_a_router_with_any_policy_reports_its_ledgers_load_and_only_to_the_admin():
    """`GET /admin/load` is the typed `LoadReport` whatever the policy: a router on `prefix` counts every member
    replica (0 when idle) and no class before a request names one; without the admin key it answers 401."""
    from tests.router.fake_backend import ServerThread
    from zoe_cluster.router.app import build_router
    from zoe_cluster.router.config import RouterConfig
    from zoe_cluster.router.membership import MemberReplica, Membership
    from zoe_cluster.routing.load_report import LoadReport

    members = Membership(version=0, replicas=[MemberReplica(id="d/0/0", url="http://127.0.0.1:9", variant=A)])
    config = RouterConfig(models=["m"], health_interval_s=0, admin_key="k", policy="prefix")
    router = ServerThread(build_router(config, membership=members).app).start()

    async def counts():
        link = RouterLink(router.url, admin_key="k")
        try:
            return await link.load()
        finally:
            await link.close()

    try:
        assert asyncio.run(counts()) == LoadReport(in_flight={"d/0/0": 0})
        assert httpx.get(router.url + "/admin/load").status_code == 401
    finally:
        router.stop()


@pytest.mark.parametrize("args, message", [
    (["--switch", f"{A},{B}", "--switch-class", "interactive:1"], "expects NAME:TTFT_S:ITL_S"),
    (["--switch", f"{A},{B}", "--switch-class", "interactive:1:-0.02"], "greater than 0"),
    (["--switch-class", "interactive:1:0.02"], "needs --switch"),
])
def test_deploy_rejects_bad_classes_before_touching_ray(args, message):
    from typer.testing import CliRunner

    from zoe_cluster.cli.main import app

    result = CliRunner().invoke(app, ["deploy", "glm-5.3", "--engine", "sim", *args])
    assert result.exit_code != 0 and message in result.output


def test_the_loop_hands_per_class_counts_and_prompt_rates_to_decide():
    """SwitchLoop passes the router's per-class in-flight counts and prompt-token counters to the actuator, as
    the replay's fleet does (FAKE fleet control; the decision itself is decide's, tested elsewhere)."""
    from prometheus_client import CollectorRegistry

    from zoe_cluster.switching.actuator import FleetReplica
    from zoe_cluster.switching.loop import SwitchLoop
    from zoe_cluster.routing.load_report import LoadReport

    class FakeController:
        tokens = 0

        def replicas(self):
            return [FleetReplica(i, f"d/{i}/1", B, "ready", None) for i in range(2)]

        async def load(self):
            self.tokens += 30_000
            return LoadReport(in_flight={"d/0/1": 3, "d/1/1": 3}, in_flight_by_class={"interactive": 2, "standard": 4},
                              prefill_tokens_by_class={"interactive": self.tokens // 3, "standard": self.tokens})

        async def swap(self, index, variant, reason):
            return None

    recipe = RecipeRegistry.default().get("glm-5.3")
    config = SwitchConfig(candidates=[A, B], classes=CLASSES, interval_s=30, window_s=300)
    now = [0.0]
    loop = SwitchLoop(recipe, config, FakeController(), CollectorRegistry())
    loop.actuator.clock = lambda: now[0]

    async def ticks():
        for t in (0.0, 30.0):
            now[0] = t
            await loop.tick()

    asyncio.run(ticks())
    assert loop.actuator.demand == {"interactive": 2.0, "standard": 4.0}
    rates = loop.actuator.prefill_tok_s
    assert rates is not None and rates["standard"] == pytest.approx(1000.0) and rates["interactive"] > 0


def test_the_controller_adds_the_router_pods_load_to_its_own_routers():
    """Under the Helm chart traffic also goes through the release's router pods: the switcher sees the sum of the
    reports of the routers that answer (FAKE router link and fanout; `MembershipFanout.load` itself is tested in
    tests/k8s), and None when no router answers."""
    from zoe_cluster.cluster.fleet_load import FleetLoadReader
    from zoe_cluster.routing.load_report import LoadReport

    own = LoadReport(in_flight={"d/0/1": 2}, in_flight_by_class={"standard": 2}, prefill_tokens_by_class={"standard": 90})
    pods = LoadReport(in_flight={"d/0/1": 3, "d/1/1": 4}, in_flight_by_class={"interactive": 2},
                      prefill_tokens_by_class={"interactive": 700})

    class Link:
        async def load(self):
            return own

    class Pods:
        report: LoadReport | None = pods

        def load(self):
            return self.report

    link, fanout = Link(), Pods()
    reader = FleetLoadReader(lambda: link, fanout)
    assert asyncio.run(reader.read()) == LoadReport(
        in_flight={"d/0/1": 5, "d/1/1": 4}, in_flight_by_class={"standard": 2, "interactive": 2},
        prefill_tokens_by_class={"standard": 90, "interactive": 700})
    fanout.report = None  # no pod answered: the own router's counts stand
    assert asyncio.run(reader.read()) == own
    reader.fanout = None  # off Kubernetes: the own router alone
    assert asyncio.run(reader.read()) == own
    assert asyncio.run(FleetLoadReader(lambda: None).read()) is None  # no router at all
