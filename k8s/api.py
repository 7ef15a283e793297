"""Kubernetes backend, the side effects: submit/status/logs/cancel with the `kubernetes`
client (kubeconfig, or the in-cluster service account). Imported only by those actions.

Every API failure a user can fix ends as one line (SpecError, exit 2): no kubeconfig, the
CRD not installed, 403, 409 (already exists), a namespace that does not exist, a manifest the
cluster rejects or would prune (submit reads the TrainJob CRD and does a server-side dry run
with strict field validation before it creates anything).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from ddpkit.k8s import crds as k8s_crds
from ddpkit.k8s import exclude
from ddpkit.k8s.crds import NODE as TRAINJOB_CONTAINER
from ddpkit.k8s.crds import PYTORCH_CONTAINER, PYTORCHJOB, TRAINJOB
from ddpkit.tools.backends import JobState, JobStatus, last_job, record_job
from ddpkit.tools.jobspec import JobSpec, SpecError

JOB_LABEL = "app.kubernetes.io/instance"  # k8s.labels(): on the job and on every pod template

OPERATOR = {
    "pytorchjob": "install the Kubeflow training operator (v1.9 serves kubeflow.org/v1 "
    "PyTorchJob), or render a TrainJob with --set k8s.api=trainjob",
    "trainjob": "install Kubeflow Trainer v2 with its torch-distributed runtime, or render a "
    "PyTorchJob with --set k8s.api=pytorchjob",
}


def _clients() -> tuple[Any, Any, Any]:
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


def check_trainer_shape(ext: Any, spec: JobSpec) -> None:
    """Read the served TrainJob CRD and refuse a manifest shaped for another Trainer release.
    Reading CRDs (cluster-scoped) may be forbidden to a user: then only the dry run checks."""
    from kubernetes.client.exceptions import ApiException

    rendered = spec.k8s.trainer_version
    try:
        resp = ext.read_custom_resource_definition(k8s_crds.CRD_NAME, _preload_content=False)
        crd = json.loads(resp.data)
    except ApiException as e:
        if e.status == 404:
            raise SpecError(
                f"the cluster has no CustomResourceDefinition {k8s_crds.CRD_NAME}; "
                + OPERATOR["trainjob"]
            ) from None
        print(
            f"cannot read CRD {k8s_crds.CRD_NAME} ({e.status} {e.reason}); relying on the "
            "server-side dry run to catch a TrainJob shaped for another Trainer release",
            file=sys.stderr,
        )
        return
    served = k8s_crds.served_version(crd)
    if served is None:
        raise SpecError(
            f"the cluster's TrainJob CRD has no field ddpkit knows for per-job pod changes "
            f"(podSpecOverrides, podTemplateOverrides, runtimePatches: Trainer "
            f"{k8s_crds.VERSIONS[0]}-{k8s_crds.NEWEST}); upgrade Kubeflow Trainer"
        )
    if not k8s_crds.compatible(rendered, served):
        field = k8s_crds.OVERRIDE_FIELD
        raise SpecError(
            f"the cluster serves the TrainJob of Kubeflow Trainer {served} "
            f"(spec.{field[served]}), but the job is rendered for {rendered} "
            f"(spec.{field[rendered]}), which it would drop or reject; "
            f"pass --set k8s.trainer_version={served}"
        )


def dry_run(custom: Any, spec: JobSpec, doc: dict[str, Any]) -> None:
    """Server-side dry run (dryRun=All, fieldValidation=Strict): admission, validation and
    pruning without persisting. A field missing from the answer was pruned: refuse."""
    api, ns = spec.k8s.api, spec.k8s.namespace
    group, version, plural, kind = _resource(api)
    what = f"{kind} {spec.name}"
    answer = _call(
        custom.create_namespaced_custom_object, what, api, ns, group, version, ns, plural, doc,
        dry_run="All", field_validation="Strict",
    )  # fmt: skip
    pruned = k8s_crds.missing_paths(doc, answer or {})
    if pruned:
        more = f" and {len(pruned) - 3} more" if len(pruned) > 3 else ""
        raise SpecError(
            f"{what}: the cluster would drop {', '.join(pruned[:3])}{more} (unknown to its "
            f"CRD, so /dev/shm, volumes or limits would silently vanish); {FIX_SHAPE[api]}"
        )


def check_secrets(core: Any, spec: JobSpec) -> None:
    """k8s.secret_env: each Secret and key exists, or the pods would hang in
    CreateContainerConfigError after the queue. Only the key names are looked at; a user
    without RBAC to read Secrets gets a note and the pods' own check."""
    from kubernetes.client.exceptions import ApiException

    ns = spec.k8s.namespace
    wanted: dict[str, set[str]] = {}
    for ref in spec.k8s.secret_env.values():
        secret, _, key = ref.partition("/")
        wanted.setdefault(secret, set()).add(key)
    for secret, keys in sorted(wanted.items()):
        try:
            resp = core.read_namespaced_secret(secret, ns, _preload_content=False)
            have = set((json.loads(resp.data).get("data") or {}).keys())
        except ApiException as e:
            if e.status == 404:
                raise SpecError(
                    f"k8s.secret_env: Secret {secret!r} does not exist in namespace {ns!r}; "
                    f"create it (kubectl create secret generic {secret} -n {ns} "
                    f"--from-literal={sorted(keys)[0]}=...)"
                ) from None
            print(f"cannot read Secret {secret} ({e.status} {e.reason}); not checking its keys",
                  file=sys.stderr)  # fmt: skip
            continue
        if missing := sorted(keys - have):
            raise SpecError(
                f"k8s.secret_env: Secret {secret!r} in namespace {ns!r} has no key "
                f"{', '.join(missing)} (it has: {', '.join(sorted(have)) or 'none'})"
            )


def _resource(api: str) -> tuple[str, str, str, str]:
    return TRAINJOB if api == "trainjob" else PYTORCHJOB


def submit(spec: JobSpec, docs: list[dict[str, Any]], opts: Any) -> int:
    """Check the job against the cluster (CRD shape, dry run), then create the PVC (kept
    when it exists) and the job, as `render` shows them."""
    custom, core, ext = _clients()
    ns, api = spec.k8s.namespace, spec.k8s.api
    group, version, plural, kind = _resource(api)
    if api == "trainjob":
        check_trainer_shape(ext, spec)
    dry_run(custom, spec, next(d for d in docs if d["kind"] == kind))
    check_secrets(core, spec)
    owned = [d for d in docs if d["kind"] in ("Deployment", "Service")]
    for doc in [d for d in docs if d not in owned]:
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
        elif doc["kind"] in RBAC_KINDS:
            _create_rbac(core, doc, api, ns)
        else:
            what = f"{kind} {spec.name}"
            job = _call(
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
    if owned:
        _create_lighthouse(core, owned, job, api, ns)
    record_job("k8s", spec.name, namespace=ns, api=api)
    return 0


RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding")  # k8s.exclude_failed_nodes


def _rbac_calls(core: Any, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(create, delete) of a namespaced ServiceAccount, Role or RoleBinding."""
    from kubernetes import client

    if kind == "ServiceAccount":
        return core.create_namespaced_service_account, core.delete_namespaced_service_account
    rbac = client.RbacAuthorizationV1Api(core.api_client)
    if kind == "Role":
        return rbac.create_namespaced_role, rbac.delete_namespaced_role
    return rbac.create_namespaced_role_binding, rbac.delete_namespaced_role_binding


def _create_rbac(core: Any, doc: dict[str, Any], api: str, ns: str) -> None:
    """The service account and the rights the pods need to keep a failing node out of their
    job (k8s/render.py rbac_objects), before the job; kept when it exists (the same job's
    name gives the same objects). A user without the right to create them gets the line."""
    name, kind = doc["metadata"]["name"], doc["kind"]
    try:
        _call(_rbac_calls(core, kind)[0], f"{kind} {name}", api, ns, ns, doc)
        print(f"created {kind.lower()}/{name}", file=sys.stderr)
    except SpecError as e:
        if "already exists" not in str(e):
            raise SpecError(
                f"{e} (k8s.exclude_failed_nodes needs them; set it false where you may not "
                "create service accounts, roles and role bindings)"
            ) from None
        print(f"{kind.lower()}/{name} exists; reusing it", file=sys.stderr)


def _create_lighthouse(
    core: Any, docs: list[dict[str, Any]], job: dict[str, Any], api: str, ns: str
) -> None:
    """fault_tolerance = torchft's lighthouse (Deployment, Service), created after the job so
    that the job owns them: its uid exists only once it is created, and the garbage collector
    deletes them with it (a rendered manifest has no uid: `kubectl apply` leaves them to
    `cancel`). The groups' pods wait for the Service (k8s/launch.sh)."""
    from kubernetes import client

    owner = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
    }
    for doc in docs:
        doc = {**doc, "metadata": {**doc["metadata"], "ownerReferences": [owner]}}
        name, what = doc["metadata"]["name"], doc["kind"]
        if what == "Service":
            create = core.create_namespaced_service
        else:
            create = client.AppsV1Api(core.api_client).create_namespaced_deployment
        _call(create, f"{what} {name}", api, ns, ns, doc)
        print(
            f"created {what.lower()}/{name} (owned by {job['kind']} {owner['name']})",
            file=sys.stderr,
        )


def _target(job: str | None, opts: Any) -> tuple[str, str, str]:
    """(name, namespace, api): the argument, --namespace and --config, else the last job."""
    spec = getattr(opts, "spec", None)
    if job is None:
        rec = last_job("k8s", {"namespace": str, "api": str})
        return rec["job"], getattr(opts, "namespace", None) or rec["namespace"], rec["api"]
    ns = getattr(opts, "namespace", None) or (spec.k8s.namespace if spec else "default")
    return job, ns, spec.k8s.api if spec else "pytorchjob"


def where(job: str) -> tuple[str, str]:
    """(namespace, api) of a job named without options: the last one submitted here if it is
    that job, else the defaults."""
    try:
        rec = last_job("k8s", {"namespace": str, "api": str})
    except SpecError:
        rec = {}
    if rec.get("job") == job:
        return rec["namespace"], rec["api"]
    return "default", "pytorchjob"


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


def poll(name: str, ns: str, api: str) -> JobStatus:
    """One look at the job, in the launcher's job-state vocabulary (Backend.wait loops on it)."""
    custom, _, _ = _clients()
    try:
        obj = _get(custom, name, ns, api)
    except SpecError as e:
        if "not found" not in str(e):
            raise
        return JobStatus(name, JobState.UNKNOWN, detail=f"(not in namespace {ns})")
    conds = [
        c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
    ]
    last = conds[-1]["type"] if conds else "Pending"
    state = {
        "Succeeded": JobState.SUCCEEDED, "Complete": JobState.SUCCEEDED,
        "Failed": JobState.FAILED, "Running": JobState.RUNNING, "Restarting": JobState.RUNNING,
    }.get(_finished(obj) or last, JobState.PENDING)  # fmt: skip
    code = {JobState.SUCCEEDED: 0, JobState.FAILED: 1}.get(state)
    return JobStatus(name, state, code, f"({obj.get('kind', api)} {ns}/{name}: {last})")


def _pod_selector(name: str, api: str) -> str:
    if api == "trainjob":
        return f"jobset.sigs.k8s.io/jobset-name={name}"
    return f"training.kubeflow.org/job-name={name}"


def status(job: str | None, opts: Any) -> int:
    custom, core, _ = _clients()
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
    for line in _goodput_lines(core, [p.metadata.name for p in pods.items], ns, api):
        print(f"  {line}")
    if bad := exclude.excluded(obj):
        print(f"  excluded nodes: {', '.join(bad)} (failed twice; kept out by node affinity)")
    return 0


def _goodput_lines(core: Any, pods: list[str], ns: str, api: str) -> list[str]:
    """The run's goodput and failures as the host pod's launcher last said them (the run dir
    is on the claim, which this client cannot read): from its last `ddpkit: goodput` line on."""
    host = next((p for p in pods if p.endswith(("-master-0", "-worker-0", "-node-0-0"))), None)
    if host is None:
        return []
    try:
        text = core.read_namespaced_pod_log(host, ns, container=_container(api), tail_lines=400)
    except Exception:  # a pod gone or not started: its status above says so
        return []
    lines = [t.strip() for t in str(text).splitlines()]
    starts = [i for i, t in enumerate(lines) if t.startswith("ddpkit: goodput")]
    if not starts:
        return []
    tail = lines[starts[-1] :]
    return [
        t.removeprefix("ddpkit: ")
        for t in tail
        if t.startswith(("ddpkit: goodput", "ddpkit: failure:"))
    ]


def _container(api: str) -> str:
    return TRAINJOB_CONTAINER if api == "trainjob" else PYTORCH_CONTAINER


def _print_prefixed(pod: str, text: str, lock: threading.Lock) -> None:
    with lock:
        for line in text.splitlines():
            sys.stdout.write(f"[{pod}] {line}\n")
        sys.stdout.flush()


def _stream(core: Any, pod: str, ns: str, container: str, lock: threading.Lock) -> None:
    """Follow one container's log to its end, each line prefixed with the pod's name."""
    from kubernetes.client.exceptions import ApiException

    try:
        resp = core.read_namespaced_pod_log(
            pod, ns, container=container, follow=True, _preload_content=False
        )
    except ApiException as e:  # the pod went away meanwhile
        _print_prefixed(pod, f"(no log: {e.status} {e.reason})", lock)
        return
    partial = b""
    try:
        for chunk in resp.stream(4096):
            partial += chunk
            *lines, partial = partial.split(b"\n")
            if lines:
                _print_prefixed(pod, b"\n".join(lines).decode(errors="replace"), lock)
        if partial:
            _print_prefixed(pod, partial.decode(errors="replace"), lock)
    finally:
        resp.release_conn()


def logs(job: str | None, opts: Any) -> int:
    """Every pod's log with a `[pod] ` prefix. --follow: stream them (the follow API), pick
    up pods and restarted containers as they start (the watch API), end with the job."""
    custom, core, _ = _clients()
    name, ns, api = _target(job, opts)
    container, lock = _container(api), threading.Lock()
    selector = _pod_selector(name, api)
    if not getattr(opts, "follow", False):
        pods = _call(core.list_namespaced_pod, "pods", api, ns, ns, label_selector=selector)
        if not pods.items:
            raise SpecError(f"{name}: no pods yet in namespace {ns!r}; try again, or --follow")
        for pod in sorted(pods.items, key=lambda p: p.metadata.name):
            text = _call(
                core.read_namespaced_pod_log, f"log of pod {pod.metadata.name}", api, ns,
                pod.metadata.name, ns, container=container,
            )  # fmt: skip
            _print_prefixed(pod.metadata.name, text or "", lock)
        return 0
    return follow(custom, core, name, ns, api, lock)


def follow(custom: Any, core: Any, name: str, ns: str, api: str, lock: threading.Lock) -> int:
    from kubernetes import watch

    streams: dict[tuple[str, int], threading.Thread] = {}
    while True:
        # A fresh watch each round: it starts with an ADDED event per existing pod, so a
        # round never misses one; a container restart shows as a new restart count.
        for event in watch.Watch().stream(
            core.list_namespaced_pod, ns, label_selector=_pod_selector(name, api),
            timeout_seconds=5,
        ):  # fmt: skip
            pod = event["object"]
            restarts = sum(c.restart_count for c in pod.status.container_statuses or [])
            key = (pod.metadata.uid or pod.metadata.name, restarts)
            started = pod.status.phase in ("Running", "Succeeded", "Failed")
            if event["type"] != "DELETED" and started and key not in streams:
                t = threading.Thread(
                    target=_stream, args=(core, pod.metadata.name, ns, _container(api), lock),
                    daemon=True,
                )  # fmt: skip
                t.start()
                streams[key] = t
        done = _finished(_get(custom, name, ns, api))
        if done and not any(t.is_alive() for t in streams.values()):
            return 0 if done in ("Succeeded", "Complete") else 1


def list_jobs(opts: Any) -> int:
    """The ddpkit jobs (both kinds) in the namespace, newest first. Kubernetes objects do
    not record who created them, so the namespace is the unit: one per user or team."""
    custom, _, _ = _clients()
    spec = getattr(opts, "spec", None)
    ns = getattr(opts, "namespace", None) or (spec.k8s.namespace if spec else "default")
    rows = []
    for api in ("pytorchjob", "trainjob"):
        group, version, plural, kind = _resource(api)
        try:
            found = _call(
                custom.list_namespaced_custom_object, f"{kind}s", api, ns, group, version, ns,
                plural, label_selector="app.kubernetes.io/name=ddpkit",
            )  # fmt: skip
        except SpecError as e:
            if "does not serve" not in str(e):
                raise
            continue  # that operator is not installed
        for obj in found.get("items") or []:
            conds = (obj.get("status") or {}).get("conditions") or []
            state = _finished(obj) or (conds[-1]["type"] if conds else "Pending")
            meta = obj["metadata"]
            rows.append((meta.get("creationTimestamp") or "", meta["name"], kind, state))
    for created, job, kind, state in sorted(rows, reverse=True):
        print(f"{job}\t{kind}\t{state}\t{created}")
    if not rows:
        print(f"no ddpkit jobs in namespace {ns}", file=sys.stderr)
    return 0


def cancel(job: str | None, opts: Any) -> int:
    """Delete the job and (foreground) its pods; a PVC with checkpoints stays."""
    custom, core, _ = _clients()
    name, ns, api = _target(job, opts)
    group, version, plural, kind = _resource(api)
    _call(
        custom.delete_namespaced_custom_object, f"{kind} {name}", api, ns,
        group, version, ns, plural, name, propagation_policy="Foreground",
    )  # fmt: skip
    print(f"deleted {kind.lower()}/{name} in namespace {ns} (checkpoint PVCs are kept)")
    _delete_lighthouse(core, name, ns)
    _delete_rbac(core, name, ns)
    return 0


def _delete_rbac(core: Any, job: str, ns: str) -> None:
    """The job's own service account and rights (k8s.exclude_failed_nodes); none: nothing."""
    from kubernetes.client.exceptions import ApiException

    name = exclude.rbac_name(job)
    for kind in RBAC_KINDS:
        try:
            _rbac_calls(core, kind)[1](name, ns)
            print(f"deleted {kind.lower()}/{name} in namespace {ns}")
        except ApiException as e:
            if e.status != 404:
                raise SpecError(f"{kind} {name}: {e.reason}; delete it with kubectl") from None


def _delete_lighthouse(core: Any, job: str, ns: str) -> None:
    """A fault_tolerance = torchft job's lighthouse (k8s/render.py): its Deployment and
    Service go with the job; other jobs have none (404, nothing said)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    name = f"{job}-lighthouse"
    apps = client.AppsV1Api(core.api_client)
    for what, delete in (
        ("deployment", apps.delete_namespaced_deployment),
        ("service", core.delete_namespaced_service),
    ):
        try:
            delete(name, ns)
            print(f"deleted {what}/{name} in namespace {ns}")
        except ApiException as e:
            if e.status != 404:
                raise SpecError(f"{what} {name}: {e.reason}; delete it with kubectl") from None
