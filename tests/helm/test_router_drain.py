"""Router HA in the chart, rendered with the real Helm engine: router pods drain on SIGTERM (the chart passes the
drain settings and gives the kubelet's SIGKILL room after them), and `router.kvEvents` asks for precise routing."""

from __future__ import annotations

from tests.helm.chart import by_kind, docs


def _router_pod(values: dict) -> dict:
    (router,) = [d for d in by_kind(docs(values), "Deployment") if d["metadata"]["name"].endswith("-router")]
    return router["spec"]["template"]["spec"]


def test_router_pods_drain_within_their_termination_grace_period():
    pod = _router_pod({})
    args = pod["containers"][0]["args"]
    delay, timeout = float(args[args.index("--drain-delay-s") + 1]), float(args[args.index("--drain-timeout-s") + 1])
    assert delay > 0  # the Service's endpoints and every node's proxy catch up before the listener closes
    assert pod["terminationGracePeriodSeconds"] > delay + timeout
    pod = _router_pod({"router": {"drain": {"delaySeconds": 10, "timeoutSeconds": 300}}})
    args = pod["containers"][0]["args"]
    assert args[args.index("--drain-delay-s") + 1] == "10" and args[args.index("--drain-timeout-s") + 1] == "300"
    assert pod["terminationGracePeriodSeconds"] == 315


def test_kv_events_value_asks_zoe_deploy_for_precise_routing():
    (job,) = by_kind(docs({"router": {"kvEvents": True}}), "RayJob")
    assert "'--kv-events'" in job["spec"]["entrypoint"]
    (job,) = by_kind(docs({}), "RayJob")
    assert "--kv-events" not in job["spec"]["entrypoint"]
