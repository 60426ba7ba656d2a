"""Router HA in the chart: a starting router pod names its peers through a headless Service over the router pods
(`router.pullPicture`) and takes their prefix-index entries every `router.pictureShareSeconds`, and the URL the chart
passes is one `zoe router --picture-peers` accepts."""

from __future__ import annotations

from urllib.parse import urlsplit

from tests.helm.chart import by_kind, docs
from zoe_cluster.router.config import RouterConfig


def _router(objs: list[dict]) -> dict:
    (router,) = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-router")]
    return router


def test_router_pods_pull_their_picture_from_the_ready_router_pods():
    objs = docs({})
    router = _router(objs)
    container = router["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    url = args[args.index("--picture-peers") + 1]
    share_s = float(args[args.index("--picture-share-s") + 1])
    assert RouterConfig(picture_peers=[url], picture_share_s=share_s).picture_share_s == 1.0  # the router takes both
    (peers,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-router-peers")]
    assert peers["spec"]["clusterIP"] == "None" and not peers["spec"]["publishNotReadyAddresses"]
    assert peers["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    host, port = urlsplit(url).hostname, urlsplit(url).port
    assert host.split(".")[0] == peers["metadata"]["name"]
    (http,) = [p for p in container["ports"] if p["name"] == "http"]
    assert port == http["containerPort"]  # a headless name resolves to pod addresses: the container's port
    assert "ZOE_ROUTER_ADMIN_KEY" in {e["name"] for e in container["env"]}  # what authenticates to the peers

    objs = docs({"router": {"pullPicture": False}})
    args = _router(objs)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--picture-peers" not in args and "--picture-share-s" not in args
    assert not [s for s in by_kind(objs, "Service") if s["metadata"]["name"].endswith("-router-peers")]
