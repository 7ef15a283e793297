"""Kubernetes backend, the side effects: submit/status/logs/cancel with the `kubernetes`
client (kubeconfig, or the in-cluster service account). Imported only by those actions.

Every API failure a user can fix ends as one line (SpecError, exit 2): no kubeconfig, the
CRD not installed, 403, 409 (already exists), a namespace that does not exist.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from tools.backends import last_job, record_job
from tools.backends.k8s import PYTORCHJOB, TRAINJOB, TRAINJOB_CONTAINER
from tools.spec import JobSpec, SpecError

OPERATOR = {
    "pytorchjob": "install the Kubeflow training operator (v1.9 serves kubeflow.org/v1 "
    "PyTorchJob), or render a TrainJob with --set k8s.api=trainjob",
    "trainjob": "install Kubeflow Trainer v2 with its torch-distributed runtime, or render a "
    "PyTorchJob with --set k8s.api=pytorchjob",
}


def _clients() -> tuple[Any, Any]:
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
    return client.CustomObjectsApi(api), client.CoreV1Api(api)


def _body(e: Any) -> dict[str, Any]:
    try:
        return json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return {"message": str(e.body or e.reason).strip()}


def _call(fn: Callable[..., Any], what: str, api: str, namespace: str, *args: Any, **kw: Any):
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
                f"(python -m tools.launch cancel k8s {name} -n {namespace}, or make k8s-delete) "
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
        raise SpecError(
            f"{what}: the API server answered {e.status} {e.reason}: {message}"
        ) from None
    except HTTPError as e:
        raise SpecError(f"{what}: cannot reach the Kubernetes API server ({e})") from None


def _resource(api: str) -> tuple[str, str, str, str]:
    return TRAINJOB if api == "trainjob" else PYTORCHJOB


def submit(spec: JobSpec, docs: list[dict[str, Any]], opts: Any) -> int:
    """Create the PVC (kept when it exists) and the job, as `render` shows them."""
    custom, core = _clients()
    ns, api = spec.k8s.namespace, spec.k8s.api
    group, version, plural, kind = _resource(api)
    for doc in docs:
        if doc["kind"] == "PersistentVolumeClaim":
            name = doc["metadata"]["name"]
            try:
                _call(
                    core.create_namespaced_persistent_volume_claim, f"pvc {name}", api, ns, ns, doc
                )
                print(f"created persistentvolumeclaim/{name}", file=sys.stderr)
            except SpecError as e:
                if "already exists" not in str(e):
                    raise
                print(f"persistentvolumeclaim/{name} exists; reusing it", file=sys.stderr)
        else:
            what = f"{kind} {spec.name}"
            _call(
                custom.create_namespaced_custom_object,
                what,
                api,
                ns,
                group,
                version,
                ns,
                plural,
                doc,
            )
            print(f"created {kind.lower()}/{spec.name} in namespace {ns}")
    record_job("k8s", spec.name, namespace=ns, api=api)
    if getattr(opts, "wait", False):
        return _wait(custom, spec.name, ns, api)
    return 0


def _target(job: str | None, opts: Any) -> tuple[str, str, str]:
    """(name, namespace, api): the argument, --namespace and --config, else the last job."""
    spec = getattr(opts, "spec", None)
    if job is None:
        rec = last_job("k8s")
        return rec["job"], getattr(opts, "namespace", None) or rec["namespace"], rec["api"]
    ns = getattr(opts, "namespace", None) or (spec.k8s.namespace if spec else "default")
    return job, ns, spec.k8s.api if spec else "pytorchjob"


def _get(custom: Any, name: str, ns: str, api: str) -> dict[str, Any]:
    group, version, plural, kind = _resource(api)
    return _call(
        custom.get_namespaced_custom_object,
        f"{kind} {name}",
        api,
        ns,
        group,
        version,
        ns,
        plural,
        name,
    )


def _finished(obj: dict[str, Any]) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Succeeded", "Failed", "Complete") and c.get("status") == "True":
            return c["type"]
    return None


def _wait(custom: Any, name: str, ns: str, api: str, poll_s: float = 5.0) -> int:
    seen = None
    while True:
        obj = _get(custom, name, ns, api)
        conds = (obj.get("status") or {}).get("conditions") or []
        last = conds[-1]["type"] if conds else "Pending"
        if last != seen:
            print(f"{name}: {last}", file=sys.stderr)
            seen = last
        if done := _finished(obj):
            return 0 if done in ("Succeeded", "Complete") else 1
        time.sleep(poll_s)


def _pod_selector(name: str, api: str) -> str:
    if api == "trainjob":
        return f"jobset.sigs.k8s.io/jobset-name={name}"
    return f"training.kubeflow.org/job-name={name}"


def status(job: str | None, opts: Any) -> int:
    custom, core = _clients()
    name, ns, api = _target(job, opts)
    obj = _get(custom, name, ns, api)
    st = obj.get("status") or {}
    print(f"{obj.get('kind', api)} {ns}/{name}")
    for c in st.get("conditions") or []:
        why = " ".join(x for x in (c.get("reason"), c.get("message")) if x)
        print(f"  condition {c.get('type')}={c.get('status')}  {why}".rstrip())
    for rtype, counts in (st.get("replicaStatuses") or {}).items():
        parts = ", ".join(f"{k} {counts.get(k, 0)}" for k in ("active", "succeeded", "failed"))
        print(f"  {rtype}: {parts}")
    pods = _call(
        core.list_namespaced_pod, "pods", api, ns, ns, label_selector=_pod_selector(name, api)
    )
    for pod in pods.items:
        restarts = sum(s.restart_count for s in pod.status.container_statuses or [])
        print(f"  pod {pod.metadata.name}: {pod.status.phase} (restarts {restarts})")
    return 0


def _log_pod(custom: Any, core: Any, name: str, ns: str, api: str) -> tuple[str, str]:
    """The pod that runs rank 0: the master, worker 0 of an elastic job, node 0 of a TrainJob."""
    if api == "trainjob":
        selector = f"{_pod_selector(name, api)},batch.kubernetes.io/job-completion-index=0"
        pods = _call(core.list_namespaced_pod, "pods", api, ns, ns, label_selector=selector)
        if not pods.items:
            raise SpecError(f"TrainJob {name}: no pod of node 0 yet; try again when it runs")
        return pods.items[0].metadata.name, TRAINJOB_CONTAINER
    spec = _get(custom, name, ns, api).get("spec") or {}
    role = "master" if "Master" in (spec.get("pytorchReplicaSpecs") or {}) else "worker"
    return f"{name}-{role}-0", "pytorch"


def logs(job: str | None, opts: Any) -> int:
    """Stream the rank-0 pod's log until the container exits."""
    custom, core = _clients()
    name, ns, api = _target(job, opts)
    pod, container = _log_pod(custom, core, name, ns, api)
    resp = _call(
        core.read_namespaced_pod_log, f"log of pod {pod}", api, ns, pod, ns,
        container=container, follow=True, _preload_content=False,
    )  # fmt: skip
    try:
        for chunk in resp.stream(4096):
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
    finally:
        resp.release_conn()
    return 0


def cancel(job: str | None, opts: Any) -> int:
    """Delete the job and (foreground) its pods; a PVC with checkpoints stays."""
    custom, _ = _clients()
    name, ns, api = _target(job, opts)
    group, version, plural, kind = _resource(api)
    _call(
        custom.delete_namespaced_custom_object, f"{kind} {name}", api, ns,
        group, version, ns, plural, name, propagation_policy="Foreground",
    )  # fmt: skip
    print(f"deleted {kind.lower()}/{name} in namespace {ns} (checkpoint PVCs are kept)")
    return 0
