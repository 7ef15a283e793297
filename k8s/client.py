"""The Kubernetes client of the engine's side effects (k8s/api.py, k8s/companions.py): the
API classes from the kubeconfig or the in-cluster service account, and one call wrapper that
turns every API failure a user can fix into one line (SpecError, exit 2)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ddpkit.k8s.crds import PYTORCHJOB, TRAINJOB
from ddpkit.tools.jobspec import SpecError

OPERATOR = {
    "pytorchjob": "install the Kubeflow training operator (v1.9 serves kubeflow.org/v1 "
    "PyTorchJob), or render a TrainJob with --set k8s.api=trainjob",
    "trainjob": "install Kubeflow Trainer v2 with its torch-distributed runtime, or render a "
    "PyTorchJob with --set k8s.api=pytorchjob",
}


def clients() -> tuple[Any, Any, Any]:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
        else:  # the client reads KUBECONFIG once at import: pass it explicitly
            config.load_kube_config(
                config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg
            )
    except (ConfigException, OSError) as e:
        where = os.environ.get("KUBECONFIG", "~/.kube/config")
        raise SpecError(
            f"no Kubernetes credentials ({str(e).strip() or type(e).__name__}; looked at {where}); "
            "point KUBECONFIG at a kubeconfig (kubectl config view) or run inside a cluster"
        ) from None
    api = client.ApiClient(cfg)
    return (
        client.CustomObjectsApi(api),
        _OnFirstUse("CoreV1Api", api),
        _OnFirstUse("ApiextensionsV1Api", api),
    )


class _OnFirstUse:
    """One of the client's API classes, imported and built when first called: with kubernetes
    37 the CoreV1Api import alone costs about 0.5 CPU-s (its models are pydantic classes), a
    third of `ddpkit submit k8s`, and a plain job (no claim, Secret or RBAC to create) never
    calls it."""

    def __init__(self, name: str, api_client: Any) -> None:
        self._name, self._api_client = name, api_client
        self._built: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._built is None:
            from kubernetes import client

            self._built = getattr(client, self._name)(self._api_client)
        return getattr(self._built, attr)


def _body(e: Any) -> dict[str, Any]:
    try:
        return json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return {"message": str(e.body or e.reason).strip()}


def call(fn: Callable[..., Any], what: str, api: str, namespace: str, *args: Any, **kw: Any):
    """Run one API call; turn its failure into a one-line SpecError."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, **kw)
    except ApiException as e:
        body = _body(e)
        message = body.get("message") or e.reason
        details = body.get("details") or {}
        if e.status == 403:
            raise SpecError(
                f"{what}: forbidden ({message}); ask a cluster admin for RBAC on it in "
                f"namespace {namespace!r}, or use another namespace with -n / k8s.namespace"
            ) from None
        if e.status == 409:
            name = details.get("name") or "NAME"
            raise SpecError(
                f"{what}: already exists in namespace {namespace!r}; delete it first "
                f"(ddpkit cancel k8s {name} -n {namespace}, or make k8s-delete) "
                "or rename the job (--set name=NEW)"
            ) from None
        if e.status == 404 and details.get("kind") == "namespaces":
            raise SpecError(
                f"namespace {namespace!r} does not exist; create it (kubectl create namespace "
                f"{namespace}) or set another with --set k8s.namespace=NAME"
            ) from None
        if e.status == 404 and body.get("reason") == "NotFound" and details.get("name"):
            raise SpecError(f"{what}: not found in namespace {namespace!r} ({message})") from None
        if e.status == 404:  # the API group itself is missing: no CRD
            raise SpecError(
                f"{what}: the cluster does not serve this resource ({message}); {OPERATOR[api]}"
            ) from None
        if e.status in (400, 422):  # invalid, or a field strict validation found unknown
            raise SpecError(
                f"{what}: the cluster rejects the manifest: {' '.join(str(message).split())}; "
                + FIX_SHAPE[api]
            ) from None
        raise SpecError(
            f"{what}: the API server answered {e.status} {e.reason}: {message}"
        ) from None
    except HTTPError as e:
        raise SpecError(f"{what}: cannot reach the Kubernetes API server ({e})") from None


FIX_SHAPE = {
    "pytorchjob": "upgrade the training operator to v1.9 or use --set k8s.api=trainjob",
    "trainjob": "render for the cluster's Kubeflow Trainer release with "
    "--set k8s.trainer_version=2.0|2.1|2.2|2.3",
}


def resource(api: str) -> tuple[str, str, str, str]:
    return TRAINJOB if api == "trainjob" else PYTORCHJOB
