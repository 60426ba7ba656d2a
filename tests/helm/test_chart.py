"""The zoe chart rendered by the real Helm engine, validated as Kubernetes 1.33 would, over good and bad values."""

from __future__ import annotations

import base64
import json

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.helm.chart import CHART, MONITORING, REPO, by_kind, crd_schema, docs, render, values_file

pytestmark = pytest.mark.helm

VALUES = {
    "defaults": {},
    "sim-minimal": values_file("sim-minimal.yaml"),
    "production": values_file("production.yaml"),
    "existing-cluster": values_file("existing-cluster.yaml"),
}
CRD_OBJECTS = {
    "RayCluster": ("ray.io_rayclusters.yaml", "v1"),
    "RayJob": ("ray.io_rayjobs.yaml", "v1"),
    "ServiceMonitor": ("monitoring.coreos.com_servicemonitors.yaml", "v1"),
}


@pytest.mark.parametrize("monitoring", [False, True], ids=["plain", "prometheus-operator"])
@pytest.mark.parametrize("case", list(VALUES))
def test_every_object_validates_against_kubernetes_and_crd_schemas(case, monitoring):
    objs = docs(VALUES[case], api_versions=(MONITORING,) if monitoring else ())
    kinds = {o["kind"] for o in objs}
    assert {"RayJob", "Deployment", "Service", "Secret" if case != "production" else "Service"} <= kinds
    for o in objs:
        if o["kind"] in CRD_OBJECTS:
            jsonschema.validate(o, crd_schema(*CRD_OBJECTS[o["kind"]]))
        elif o["kind"] == "PrometheusRule":
            assert o["apiVersion"] == MONITORING and o["spec"]["groups"]  # rules: test_rules.py (promtool)
        else:
            kubernetes_validate.validate(o, "1.33.0", strict=True)
    assert ("ServiceMonitor" in kinds) == monitoring and ("PrometheusRule" in kinds) == monitoring


def test_crd_validation_catches_a_misspelled_field():
    (rc,) = by_kind(docs({}), "RayCluster")
    rc["spec"]["workerGroupSpecs"][0]["replica"] = 2
    with pytest.raises(jsonschema.ValidationError, match="replica"):
        jsonschema.validate(rc, crd_schema(*CRD_OBJECTS["RayCluster"]))


def _groups(objs):
    """Worker image -> its worker group of the rendered RayCluster."""
    (rc,) = by_kind(objs, "RayCluster")
    return {g["template"]["metadata"]["labels"]["zoe.dev/worker-image"]: g for g in rc["spec"]["workerGroupSpecs"]}


def _worker(objs, image=None):
    """(RayCluster, the group of `image` or the only group, its pod spec)."""
    (rc,) = by_kind(objs, "RayCluster")
    groups = _groups(objs)
    group = groups[image] if image else next(iter(groups.values()))
    assert image or len(groups) == 1, sorted(groups)
    return rc, group, group["template"]["spec"]


def _ray_resources(group):
    """The custom resources a group's nodes advertise: rayStartParams.resources as `ray start` gets it from the
    shell KubeRay runs it in."""
    import shlex

    (text,) = shlex.split(group["rayStartParams"]["resources"])
    return json.loads(text)


def test_worker_group_takes_whole_mi355x_nodes():
    rc, group, pod = _worker(docs({}), "zoe-vllm-rocm")
    assert group["groupName"] == "mi355x-vllm-rocm" and group["rayStartParams"]["num-gpus"] == "8"
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["amd.com/gpu"] == "8" and c["resources"]["requests"]["amd.com/gpu"] == "8"
    assert pod["hostIPC"] is True and "hostNetwork" not in pod
    assert pod["nodeSelector"] == {"amd.com/gpu.product-name": "AMD_Instinct_MI355X_OAM"}
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    head = rc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0" and rc["spec"]["rayVersion"] == "2.60.0"
    assert "amd.com/gpu" not in json.dumps(head["template"]["spec"]["containers"][0]["resources"])


def test_production_values_turn_on_rdma_host_network_and_shared_cache():
    _, group, pod = _worker(docs(VALUES["production"]))
    (c,) = pod["containers"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 4
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["resources"]["limits"]["rdma/hca_shared_devices_a"] == "1"
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"]["claimName"] == "models-rwx"
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert env["NCCL_IB_HCA"]["value"] == "rdma0,rdma1" and env["HF_HOME"]["value"] == "/models"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def _deploy_args(objs):
    """`zoe deploy`'s arguments from the RayJob's entrypoint, split as the shell Ray runs it in would."""
    import shlex

    (job,) = by_kind(objs, "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["zoe", "deploy"]
    return argv[2:]


def test_a_rayjob_runs_zoe_deploy_in_the_ray_head():
    """KubeRay submits `zoe deploy` to the release's RayCluster (no Ray Client: the driver runs in the head's
    container), with the engine always explicit (GPU workers may join after the job starts)."""
    objs = docs({})
    (job,) = by_kind(objs, "RayJob")
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": "zoe-ray"}
    assert job["spec"]["submissionMode"] == "HTTPMode" and job["spec"]["shutdownAfterJobFinishes"] is False
    assert not by_kind(objs, "Job")
    args = _deploy_args(objs)
    assert args[0] == "glm-5.3" and "--address" not in args
    assert args[args.index("--concurrency") + 1] == "32" and "--variant" not in args
    assert args[args.index("--engine") + 1] == "vllm"  # the recipe's engine (glm-5.3: vLLM)
    args = _deploy_args(docs(VALUES["production"]))
    assert args[args.index("--variant") + 1] == "mxfp4-tp8" and args[args.index("--replicas") + 1] == "4"
    objs = docs(VALUES["existing-cluster"])
    args = _deploy_args(objs)
    assert args[0] == "deepseek-v4-pro" and args[args.index("--engine") + 1] == "sglang"
    assert by_kind(objs, "RayJob")[0]["spec"]["clusterSelector"] == {"ray.io/cluster": "shared-mi355x"}
    assert not by_kind(objs, "RayCluster")
    args = _deploy_args(docs({"model": {"name": "kimi-k3"}}))
    assert args[args.index("--engine") + 1] == "sglang"


def test_extra_args_survive_the_shell():
    """Arguments with spaces or quotes reach zoe deploy as one argument each."""
    args = _deploy_args(docs({"controller": {"extraArgs": ["--env", "NOTE=it's a test"]}}))
    assert args[-2:] == ["--env", "NOTE=it's a test"]


@pytest.mark.parametrize("model,variant,candidates,images", [
    # the planner picks among every variant of the model inside the RayJob: a group for each image they use
    ("glm-5.3", "", [], ["zoe-vllm-rocm", "zoe-vllm-rocm-nightly"]),
    ("glm-5.3", "mxfp4-tp8", [], ["zoe-vllm-rocm-nightly"]),
    ("glm-5.3", "fp8-tp8-nightly", [], ["zoe-vllm-rocm-nightly"]),
    ("glm-5.3", "fp8-tp8", [], ["zoe-vllm-rocm"]),
    ("glm-5.3", "fp8-tp8-zoe", ["fp8-tp8-zoe", "mxfp4-tp8"], ["zoe-vllm-rocm", "zoe-vllm-rocm-nightly"]),
    ("deepseek-v3.2", "", [], ["zoe-vllm-rocm"]),
    ("kimi-k3", "", [], ["zoe-sglang-rocm"]),
    ("deepseek-v4-pro", "fp8-tp8", [], ["zoe-sglang-rocm"]),
])
def test_one_worker_group_per_image_of_the_variants_the_deployment_can_run(model, variant, candidates, images):
    """Each group runs one worker image and advertises zoe-image/<image>; the RayJob tells `zoe deploy` which images
    the groups run and what each is built FROM, so that a replica's bundles ask for its variant's image."""
    from zoe_cluster.cluster.placement import image_resource

    objs = docs({"model": {"name": model, "variant": variant}, "switching": {"candidates": candidates}})
    groups = _groups(objs)
    assert sorted(groups) == images
    for image, group in groups.items():
        assert group["groupName"] == "mi355x-" + image.removeprefix("zoe-")
        assert group["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/zoe-project/{image}:0.1.0"
        assert _ray_resources(group) == {image_resource(image): 1}
    args = _deploy_args(objs)
    given = [args[i + 1] for i, a in enumerate(args) if a == "--image-resource"]
    spec_images = yaml.safe_load((REPO / "docker" / "images.yaml").read_text())["images"]
    assert given == [f"{image}={spec_images[image]['base']}" for image in images]


def test_the_rendered_groups_hold_the_replicas_the_rendered_deploy_asks_for():
    """Rendered RayJob -> the real `zoe deploy` parser -> DeploymentSpec -> bundles: what each variant's bundle asks
    for is advertised by exactly the group of that variant's recipe image."""
    import typer

    from zoe_cluster.cli.deploy import _parse_image_resources
    from zoe_cluster.cli.main import app
    from zoe_cluster.cluster.spec import DeploymentSpec
    from zoe_cluster.recipes import RecipeRegistry

    objs = docs({})
    params = typer.main.get_command(app).commands["deploy"].make_context("deploy", _deploy_args(objs)).params
    recipe = RecipeRegistry.default().get(params["model"])
    groups = _groups(objs)
    for variant, v in recipe.variants.items():
        spec = DeploymentSpec(name="glm", recipe=recipe, variant=variant, engine=params["engine"],
                              worker_images=_parse_image_resources(params["image_resource"]))
        (bundle,) = spec.shape(variant).bundles()
        asked = {k for k in bundle if k.startswith("zoe-image/")}
        offering = [image for image, g in groups.items() if asked <= set(_ray_resources(g))]
        assert len(asked) == 1 and len(offering) == 1, (variant, asked, offering)
        want = "zoe-vllm-rocm-nightly" if "nightly" in v.image else "zoe-vllm-rocm"
        assert offering == [want], variant


def test_nodes_per_image_and_extra_custom_resources():
    objs = docs({"model": {"variant": "fp8-tp8-zoe"}, "switching": {"candidates": ["fp8-tp8-zoe", "mxfp4-tp8"]},
                 "rayCluster": {"worker": {"replicas": 2, "replicasByImage": {"zoe-vllm-rocm-nightly": 3},
                                           "customResources": {"rdma": 1},
                                           "rayStartParams": {"object-store-memory": "100000000"}}}})
    groups = _groups(objs)
    assert {i: (g["replicas"], g["minReplicas"], g["maxReplicas"]) for i, g in groups.items()} == {
        "zoe-vllm-rocm": (2, 2, 2), "zoe-vllm-rocm-nightly": (3, 3, 3)}
    assert _ray_resources(groups["zoe-vllm-rocm"]) == {"zoe-image/zoe-vllm-rocm": 1, "rdma": 1}
    assert groups["zoe-vllm-rocm"]["rayStartParams"]["object-store-memory"] == "100000000"
    (rc,) = by_kind(objs, "RayCluster")
    jsonschema.validate(rc, crd_schema(*CRD_OBJECTS["RayCluster"]))


def test_an_existing_cluster_gets_no_image_resources():
    """The chart does not know what an existing RayCluster's nodes advertise: replicas may run on any GPU node."""
    assert "--image-resource" not in _deploy_args(docs(VALUES["existing-cluster"]))
    assert "--image-resource" not in _deploy_args(docs(VALUES["sim-minimal"]))


@pytest.mark.parametrize("case", list(VALUES))
def test_rendered_commands_parse_with_the_real_zoe_cli(case):
    """The Job's `zoe deploy` and the router pods' `zoe router` arguments are accepted by zoe's own CLI."""
    import typer

    from zoe_cluster.cli.main import app

    cli = typer.main.get_command(app)
    objs = docs(VALUES[case])
    (dep,) = by_kind(objs, "Deployment")
    commands = {"deploy": _deploy_args(objs), "router": dep["spec"]["template"]["spec"]["containers"][0]["args"]}
    for name, args in commands.items():
        ctx = cli.commands[name].make_context(name, list(args), resilient_parsing=False)
        assert ctx.params, name
    ctx = cli.commands["deploy"].make_context("deploy", list(commands["deploy"]))
    assert ctx.params["model"] == VALUES[case].get("model", {}).get("name", "glm-5.3")
    assert ctx.params["address"] is None  # RAY_ADDRESS of the Ray job: the cluster the driver runs in
    assert ctx.params["engine"] in ("vllm", "sglang", "sim")


def test_service_classes_give_router_pods_the_controllers_slo_limits():
    """switching.classes reach `zoe deploy` (--switch, --switch-class) and every router pod (--slo-*); the pods
    derive the same `slo` policy options the controller gives its own router (one function, two processes)."""
    import typer

    from tests.switching.test_live_mix import spec
    from zoe_cluster.cli.main import app
    from zoe_cluster.cli.router import _parse_kv, _slo_policy

    objs = docs(VALUES["production"])
    deploy = _deploy_args(objs)
    assert deploy[deploy.index("--policy") + 1] == "slo"
    assert deploy[deploy.index("--switch") + 1] == "fp8-tp8-nightly,mxfp4-tp8"
    assert [deploy[i + 1] for i, a in enumerate(deploy) if a == "--switch-class"] == ["interactive:1:0.02", "standard:2:0.03"]
    (dep,) = by_kind(objs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    p = typer.main.get_command(app).commands["router"].make_context("router", list(args)).params
    policy, options = _slo_policy(p["policy"], _parse_kv(p["policy_config"]), p["slo_class"], p["slo_model"],
                                  p["slo_variants"])
    assert (policy, options) == spec().router_policy()  # the controller's router, same classes and variants
    assert set(options["classes"]["interactive"]) == {"fp8-tp8-nightly"}  # only FP8 meets a 20 ms ITL (seed A8)


def test_an_upgrade_reruns_zoe_deploy_in_a_new_rayjob():
    assert by_kind(docs({}), "RayJob")[0]["metadata"]["name"] == "zoe-deploy-1"
    upgraded = docs({"model": {"replicas": 3}}, revision=4)
    (job,) = by_kind(upgraded, "RayJob")
    args = _deploy_args(upgraded)
    assert job["metadata"]["name"] == "zoe-deploy-4" and args[args.index("--replicas") + 1] == "3"


def test_router_runs_two_pods_behind_a_service_with_keys_from_the_secret():
    objs = docs({})
    (dep,) = by_kind(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["zoe", "router"] and c["args"][c["args"].index("--host") + 1] == "0.0.0.0"
    env = {e["name"]: e for e in c["env"]}
    assert env["ZOE_ROUTER_API_KEYS"]["valueFrom"]["secretKeyRef"] == {"name": "zoe-auth", "key": "api-keys"}
    assert env["ZOE_ROUTER_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "zoe-auth", "key": "admin-token"}
    (secret,) = by_kind(objs, "Secret")
    assert base64.b64decode(secret["data"]["api-keys"]).decode().startswith("zoe-")  # generated when none given
    assert len(base64.b64decode(secret["data"]["admin-token"])) == 40
    (svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == "zoe-router"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    (pdb,) = by_kind(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and not by_kind(objs, "HorizontalPodAutoscaler")


def test_autoscaling_hands_the_replica_count_to_the_hpa():
    objs = docs(VALUES["production"])
    (dep,) = by_kind(objs, "Deployment")
    (hpa,) = by_kind(objs, "HorizontalPodAutoscaler")
    assert "replicas" not in dep["spec"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert not by_kind(objs, "Secret")  # keys come from auth.existingSecret
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["env"][[e["name"] for e in c["env"]].index("ZOE_ROUTER_API_KEYS")]["valueFrom"]["secretKeyRef"]["name"] == "zoe-keys"


def test_given_keys_land_in_the_secret():
    (secret,) = by_kind(docs(VALUES["existing-cluster"]), "Secret")
    keys = base64.b64decode(secret["data"]["api-keys"]).decode().split(",")
    assert keys == ["key-for-team-a-0123456789", "key-for-team-b-0123456789"]
    assert base64.b64decode(secret["data"]["admin-token"]).decode() == "admin-token-0123456789abcdef"


def test_network_policies_open_only_the_router_api_to_clients():
    objs = docs(VALUES["production"])
    pols = {p["metadata"]["name"]: p for p in by_kind(objs, "NetworkPolicy")}
    router = pols["zoe-router"]["spec"]
    assert router["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = router["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}} in peers
    ray = pols["zoe-ray"]["spec"]
    assert ray["ingress"][0] == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "zoe"}}}]}
    assert not by_kind(docs(VALUES["sim-minimal"]), "NetworkPolicy")


def test_rbac_lets_zoe_read_nodes_and_the_release_pods_only():
    objs = docs({})
    (role,) = by_kind(objs, "Role")
    (cluster_role,) = by_kind(objs, "ClusterRole")
    for r in role["rules"] + cluster_role["rules"]:
        assert set(r["verbs"]) <= {"get", "list", "watch"}
    assert {"nodes", "pods"} == set(cluster_role["rules"][0]["resources"])
    assert not by_kind(docs(VALUES["existing-cluster"]), "Role")


def test_dashboards_ship_as_configmaps_for_grafanas_sidecar():
    files = sorted((REPO / "dashboards").glob("*.json"))
    assert files
    cms = by_kind(docs(VALUES["production"]), "ConfigMap")
    assert len(cms) == len(files)
    for cm, f in zip(sorted(cms, key=lambda c: c["metadata"]["name"]), files):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "zoe"}
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())
    assert not by_kind(docs(VALUES["sim-minimal"]), "ConfigMap")


BAD = [
    ({"model": {"engine": "trtllm"}}, "at '/model/engine': value must be one of '', 'vllm', 'sglang', 'sim'"),
    ({"model": {"replicas": 0}}, "at '/model/replicas': minimum"),
    ({"router": {"replica": 3}}, "at '/router': additional properties 'replica' not allowed"),  # misspelled key
    ({"rayCluster": {"worker": {"gpusPerNode": 16}}}, "at '/rayCluster/worker/gpusPerNode': maximum"),
    ({"rayCluster": {"worker": {"rayStartParams": {"num-cpus": 64}}}}, "at '/rayCluster/worker/rayStartParams/num-cpus': got number, want string"),
    ({"rayCluster": {"worker": {"shmSize": "lots"}}}, "at '/rayCluster/worker/shmSize'"),
    ({"metrics": {"prometheusRule": {"for": "five minutes"}}}, "at '/metrics/prometheusRule/for'"),
    ({"auth": {"apiKeys": ["short"]}}, "at '/auth/apiKeys/0': minLength"),
    ({"router": {"autoscaling": {"enabled": True, "minReplicas": 6, "maxReplicas": 4}}},
     "router.autoscaling.minReplicas (6) is above router.autoscaling.maxReplicas (4)"),
    ({"auth": {"existingSecret": "keys", "apiKeys": ["0123456789abcdef0123"]}}, "keys come from one place"),
    ({"auth": {"enabled": False, "apiKeys": ["0123456789abcdef0123"]}}, "auth.enabled is false"),
    ({"rayCluster": {"worker": {"modelCache": {"type": "pvc"}}}}, "claimName is empty"),
    ({"rayCluster": {"worker": {"replicas": 0}}}, "rayCluster.worker.replicas is 0 (and replicasByImage adds none) but glm-5.3 runs on vllm"),
    ({"model": {"variant": "mxfp4-tp8"}, "rayCluster": {"worker": {"replicasByImage": {"zoe-vllm-rocm-nightly": 0}}}},
     "model.variant mxfp4-tp8 runs in worker image zoe-vllm-rocm-nightly, whose worker group has 0 nodes"),
    ({"model": {"variant": "mxfp4-tp8"}, "rayCluster": {"worker": {"replicasByImage": {"zoe-vllm-rocm": 2}}}},
     "rayCluster.worker.replicasByImage.zoe-vllm-rocm: this deployment of glm-5.3 runs no variant in that image "
     "(its worker images: zoe-vllm-rocm-nightly)"),
    ({"rayCluster": {"worker": {"replicasByImage": {"zoe-trtllm": 2}}}}, "at '/rayCluster/worker/replicasByImage'"),
    ({"rayCluster": {"worker": {"rayStartParams": {"resources": '"{}"'}}}},
     "rayCluster.worker.rayStartParams.resources: the chart declares each worker group's Ray resources"),
    # what the recipes and the routing policy registry allow (values.schema.json, generated from them)
    ({"model": {"name": "llama-99"}},
     "at '/model/name': value must be one of 'deepseek-v3.2', 'deepseek-v4-pro', 'glm-5.3', 'kimi-k3'"),
    ({"router": {"policy": "magic"}}, "at '/router/policy': value must be one of 'prefix', 'least_load'"),
    ({"model": {"name": "kimi-k3", "variant": "fp8-tp8-zoe"}}, "at '/model/variant': value must be one of '', 'mxfp4-tp8-dspark'"),
    ({"model": {"name": "kimi-k3", "engine": "vllm"}}, "at '/model/engine': value must be one of '', 'sim', 'sglang'"),
    ({"switching": {"candidates": ["fp8-tp8-zoe", "mxfp4-tp9"]}}, "at '/switching/candidates/1': value must be one of 'fp8-tp8'"),
    # kimi-k3 (SGLang) on the vLLM worker image; glm-5.3's nightly variants on the release image
    ({"model": {"name": "kimi-k3"}, "rayCluster": {"worker": {"image": {"repositories": {"zoe-sglang-rocm": "ghcr.io/acme/zoe-vllm-rocm"}}}}},
     "kimi-k3's variants run in worker image zoe-sglang-rocm (sglang, FROM lmsysorg/sglang-rocm:v0.5.19-rocm720-mi35x-20260910), "
     "but rayCluster.worker.image.repositories.zoe-sglang-rocm is ghcr.io/acme/zoe-vllm-rocm, the image zoe-vllm-rocm "
     "(vllm, FROM vllm/vllm-openai-rocm:v0.29.0): name the zoe-sglang-rocm image there"),
    ({"model": {"variant": "mxfp4-tp8"},
      "rayCluster": {"worker": {"image": {"repositories": {"zoe-vllm-rocm-nightly": "ghcr.io/acme/zoe-vllm-rocm"}}}}},
     "rayCluster.worker.image.repositories.zoe-vllm-rocm-nightly is ghcr.io/acme/zoe-vllm-rocm, the image zoe-vllm-rocm"),
    ({"rayCluster": {"worker": {"image": {"repositories": {"vllm": "ghcr.io/zoe-project/zoe-vllm-rocm"}}}}},
     "at '/rayCluster/worker/image/repositories': additional properties 'vllm' not allowed"),
    ({"rayCluster": {"worker": {"image": {"repository": "ghcr.io/zoe-project/zoe-vllm-rocm"}}}},
     "at '/rayCluster/worker/image': additional properties 'repository' not allowed"),
    ({"switching": {"classes": [{"name": "fast", "ttftS": 1, "itlS": 0.02}]}},
     "switching.classes needs 2 to 4 switching.candidates (the variants the mix is made of), got 0"),
    ({"switching": {"candidates": ["fp8-tp8-nightly", "mxfp4-tp8"], "classes": [{"name": "fast", "ttftS": 1, "itlS": 0.02}]},
      "router": {"policy": "least_load"}}, "router.policy least_load cannot be combined"),
    ({"switching": {"classes": [{"name": "fast", "ttftS": 1}]}}, "at '/switching/classes/0': missing property 'itlS'"),
]


@pytest.mark.parametrize("values,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_values_fail_rendering_with_a_clear_message(values, message):
    from helm_python import HelmError

    with pytest.raises(HelmError) as e:
        render(values)
    assert message in str(e.value)


def test_lint_strict_passes():
    import helm_python

    report = helm_python.lint(str(CHART), strict=True, kube_version="v1.33.0")
    assert not report["errors"], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _schema_leaves(schema, path=()):
    """Dotted paths of the values the schema describes as one documented key (objects without properties too)."""
    props = schema.get("properties")
    if schema.get("type") == "object" and props:
        for k, sub in props.items():
            if k != "global":
                yield from _schema_leaves(sub, path + (k,))
    else:
        yield path


def _yaml_key_lines(text):
    """Dotted path -> line number (0-based) of every mapping key in values.yaml."""
    out = {}

    def walk(node, path):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                p = path + (k.value,)
                out[p] = k.start_mark.line
                walk(v, p)

    walk(yaml.compose(text), ())
    return out


def test_every_value_is_documented_and_covered_by_the_schema():
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = _yaml_key_lines(text)
    leaves = set(_schema_leaves(schema))
    for leaf in leaves:
        assert leaf in keys, f"schema key {'.'.join(leaf)} is missing from values.yaml"
        above = lines[keys[leaf] - 1].strip()
        assert above.startswith("# --"), f"values.yaml: {'.'.join(leaf)} has no '# --' description above it"
    documented_parents = {p[:i] for p in leaves for i in range(1, len(p))}
    for k in keys:
        assert k in leaves or k in documented_parents or any(k[: len(leaf)] == leaf for leaf in leaves), (
            f"values.yaml key {'.'.join(k)} is not in values.schema.json"
        )

    def described(s, path=()):
        for k, sub in (s.get("properties") or {}).items():
            assert sub.get("description"), f"values.schema.json: {'.'.join(path + (k,))} has no description"
            described(sub, path + (k,))

    described(schema)


def test_one_define_per_pod_template():
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    for name in ("rayHeadPodTemplate", "rayWorkerPodTemplate", "routerPodTemplate"):
        assert helpers.count(f'define "zoe.{name}"') == 1
    for t in (CHART / "templates").glob("*.yaml"):
        assert "containers:" not in t.read_text(), f"{t.name} writes a pod spec itself instead of including a define"


def test_notes_tell_how_to_reach_the_endpoint_and_what_is_missing():
    notes = render({})["zoe/templates/NOTES.txt"]
    assert "kubectl -n serving get rayjob zoe-deploy-1 -w" in notes and "-- ray job logs -f" in notes
    assert "1 vllm replica(s)" in notes
    assert ("mi355x-vllm-rocm-nightly: 1 node(s) of ghcr.io/zoe-project/zoe-vllm-rocm-nightly:0.1.0 "
            "(Ray resource zoe-image/zoe-vllm-rocm-nightly)") in notes
    assert "mi355x-vllm-rocm: 1 node(s)" in notes
    assert "get secret zoe-auth -o jsonpath='{.data.api-keys}'" in notes
    assert "zoe k8s nodes --model glm-5.3" in notes
    assert "no ServiceMonitor or PrometheusRule was" in notes
    with_operator = render({}, api_versions=(MONITORING,))["zoe/templates/NOTES.txt"]
    assert "no ServiceMonitor" not in with_operator
    assert "Authorization" not in render(VALUES["sim-minimal"])["zoe/templates/NOTES.txt"]


def test_simulated_replicas_need_no_gpu_nodes():
    (rc,) = by_kind(docs(VALUES["sim-minimal"]), "RayCluster")
    assert [g["replicas"] for g in rc["spec"]["workerGroupSpecs"]] == [0, 0]
    # the two simulated replicas run on the head, which declares their 2 x 8 GPUs (fake) so that Ray places them
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] == "16"
    assert _deploy_args(docs(VALUES["sim-minimal"]))[_deploy_args(docs(VALUES["sim-minimal"])).index("--engine") + 1] == "sim"


def test_kubernetes_validate_cli_accepts_the_core_manifests(tmp_path):
    """The same check as the library calls above, through the command users run (`kubernetes-validate`)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    core = [o for o in docs(VALUES["production"], api_versions=(MONITORING,)) if o["kind"] not in CRD_OBJECTS | {"PrometheusRule": 0}]
    f = tmp_path / "zoe.yaml"
    f.write_text(yaml.safe_dump_all(core))
    out = subprocess.run([exe, "--strict", "-k", "1.33.0", "--quiet", str(f)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    next(o for o in core if o["kind"] == "Deployment")["spec"]["unknownField"] = 1  # and it rejects what Kubernetes would
    f.write_text(yaml.safe_dump_all(core))
    out = subprocess.run([exe, "--strict", "-k", "1.33.0", "--quiet", str(f)], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "unknownField" in out.stdout + out.stderr


def test_the_clusters_ray_version_is_the_one_zoe_pins():
    """KubeRay configures the RayCluster for `rayCluster.rayVersion`; the images run the Ray zoe-cluster pins."""
    import re

    pin = re.search(r'"ray\[default\]==([^"]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    (rc,) = by_kind(docs({}), "RayCluster")
    assert rc["spec"]["rayVersion"] == pin, f"helm/zoe/values.yaml rayCluster.rayVersion is not zoe's Ray pin {pin}"


def test_router_pods_keep_membership_and_an_ingress_pins_sessions_to_one_router():
    objs = docs({"router": {"ingress": {"enabled": True, "host": "zoe.example.com",
                                        "annotations": {"team": "serving"}}}})
    (router,) = [d for d in by_kind(objs, "Deployment") if d["metadata"]["name"].endswith("-router")]
    pod = router["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    path = args[args.index("--membership-file") + 1]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert path.startswith(mount["mountPath"] + "/")
    assert {"name": mount["name"], "emptyDir": {}} in pod["volumes"]
    (ing,) = by_kind(objs, "Ingress")
    assert ing["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/upstream-hash-by": "$http_x_session_id", "team": "serving"}
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "zoe.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == router["metadata"]["name"]
    plain = docs({"router": {"persistMembership": False}})
    assert not by_kind(plain, "Ingress")
    (router,) = [d for d in by_kind(plain, "Deployment") if d["metadata"]["name"].endswith("-router")]
    assert "--membership-file" not in router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "volumes" not in router["spec"]["template"]["spec"]
