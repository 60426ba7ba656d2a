"""A CoreV1Api for zoe: the pod's service account inside a cluster, a kubeconfig outside one."""

from __future__ import annotations

import os
from typing import Any


class KubernetesUnavailable(RuntimeError):
    """No cluster to talk to: neither in-cluster credentials nor a usable kubeconfig."""


def core_api(kubeconfig: str | None = None, context: str | None = None, host: str | None = None) -> Any:
    """A `kubernetes.client.CoreV1Api`.

    `host` talks to that API server URL without credentials (tests, `kubectl proxy`); otherwise the in-cluster
    service account when running in a pod (KUBERNETES_SERVICE_HOST set and no kubeconfig given), else the
    kubeconfig (`kubeconfig` path, $KUBECONFIG, or ~/.kube/config) and its `context`.
    """
    from kubernetes import client, config

    if host:
        cfg = client.Configuration()
        cfg.host = host.rstrip("/")
        return client.CoreV1Api(client.ApiClient(cfg))
    try:
        if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=kubeconfig, context=context)
    except config.ConfigException as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise KubernetesUnavailable(
            f"no Kubernetes credentials: not in a pod and no usable kubeconfig at {where} ({e})"
        ) from None
    return client.CoreV1Api()
