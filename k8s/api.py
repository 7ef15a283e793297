"""Kubernetes backend, the side effects: submit/status/logs/cancel with the `kubernetes`
client (kubeconfig, or the in-cluster service account). Imported only by those actions; the
client and its one-line errors are k8s/client.py, the objects created beside a job (RBAC,
the lighthouse) k8s/companions.py.

Every API failure a user can fix ends as one line (SpecError, exit 2): no kubeconfig, the
CRD not installed, 403, 409 (already exists), a namespace that does not exist, a manifest the
cluster rejects or would prune (submit reads the TrainJob CRD and does a server-side dry run
with strict field validation before it creates anything).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from ddpkit.k8s import crds as k8s_crds
from ddpkit.k8s import exclude
from ddpkit.k8s.client import FIX_SHAPE, OPERATOR, call, clients, resource
from ddpkit.k8s.companions import (
    RBAC_KINDS,
    create_lighthouse,
    create_rbac,
    delete_lighthouse,
    delete_rbac,
)
from ddpkit.k8s.crds import NODE as TRAINJOB_CONTAINER
from ddpkit.k8s.crds import PYTORCH_CONTAINER
from ddpkit.tools.backends import JobState, JobStatus, last_job, record_job
from ddpkit.tools.jobspec import JobSpec, SpecError

JOB_LABEL = "app.kubernetes.io/instance"  # k8s.labels(): on the job and on every pod template


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
    group, version, plural, kind = resource(api)
    what = f"{kind} {spec.name}"
    answer = call(
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


def submit(spec: JobSpec, docs: list[dict[str, Any]], opts: Any) -> int:
    """Check the job against the cluster (CRD shape, dry run), then create the PVC (kept
    when it exists) and the job, as `render` shows them."""
    custom, core, ext = clients()
    ns, api = spec.k8s.namespace, spec.k8s.api
    group, version, plural, kind = resource(api)
    if api == "trainjob":
        check_trainer_shape(ext, spec)
    dry_run(custom, spec, next(d for d in docs if d["kind"] == kind))
    check_secrets(core, spec)
    owned = [d for d in docs if d["kind"] in ("Deployment", "Service")]
    for doc in [d for d in docs if d not in owned]:
        if doc["kind"] == "PersistentVolumeClaim":
            name = doc["metadata"]["name"]
            try:
                call(
                    core.create_namespaced_persistent_volume_claim, f"pvc {name}", api, ns, ns, doc
                )
                print(f"created persistentvolumeclaim/{name}", file=sys.stderr)
            except SpecError as e:
                if "already exists" not in str(e):
                    raise
                print(f"persistentvolumeclaim/{name} exists; reusing it", file=sys.stderr)
        elif doc["kind"] in RBAC_KINDS:
            create_rbac(core, doc, api, ns)
        else:
            what = f"{kind} {spec.name}"
            job = call(
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
        create_lighthouse(core, owned, job, api, ns)
    record_job("k8s", spec.name, namespace=ns, api=api)
    return 0


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
    group, version, plural, kind = resource(api)
    return call(
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
    custom, _, _ = clients()
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
    custom, core, _ = clients()
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
    pods = call(
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


def _host_log(core: Any, pods: list[str], ns: str, api: str, tail: int = 400) -> str:
    """The host pod's (node 0's: rank 0 prints the progress) last lines; '' when it has none."""
    host = next((p for p in pods if p.endswith(("-master-0", "-worker-0", "-node-0-0"))), None)
    if host is None:
        return ""
    try:
        return str(
            core.read_namespaced_pod_log(host, ns, container=_container(api), tail_lines=tail)
        )
    except Exception:  # a pod gone or not started: its status says so
        return ""


def host_log(job: str | None, opts: Any) -> str:
    """The host pod's last lines, for `ddpkit status k8s --watch` (tools/watch.py): the
    trainer's progress line and the launcher's goodput (the run dir is on the claim)."""
    _, core, _ = clients()
    name, ns, api = _target(job, opts)
    if job is not None and getattr(opts, "spec", None) is None:
        ns, api = where(job)
    pods = call(
        core.list_namespaced_pod, "pods", api, ns, ns, label_selector=_pod_selector(name, api)
    )
    return _host_log(core, [p.metadata.name for p in pods.items], ns, api)


def _goodput_lines(core: Any, pods: list[str], ns: str, api: str) -> list[str]:
    """The run's goodput and failures as the host pod's launcher last said them (the run dir
    is on the claim, which this client cannot read): from its last `ddpkit: goodput` line on."""
    text = _host_log(core, pods, ns, api)
    if not text:
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
    custom, core, _ = clients()
    name, ns, api = _target(job, opts)
    container, lock = _container(api), threading.Lock()
    selector = _pod_selector(name, api)
    if not getattr(opts, "follow", False):
        pods = call(core.list_namespaced_pod, "pods", api, ns, ns, label_selector=selector)
        if not pods.items:
            raise SpecError(f"{name}: no pods yet in namespace {ns!r}; try again, or --follow")
        for pod in sorted(pods.items, key=lambda p: p.metadata.name):
            text = call(
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
    custom, _, _ = clients()
    spec = getattr(opts, "spec", None)
    ns = getattr(opts, "namespace", None) or (spec.k8s.namespace if spec else "default")
    rows = []
    for api in ("pytorchjob", "trainjob"):
        group, version, plural, kind = resource(api)
        try:
            found = call(
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
    custom, core, _ = clients()
    name, ns, api = _target(job, opts)
    group, version, plural, kind = resource(api)
    call(
        custom.delete_namespaced_custom_object, f"{kind} {name}", api, ns,
        group, version, ns, plural, name, propagation_policy="Foreground",
    )  # fmt: skip
    print(f"deleted {kind.lower()}/{name} in namespace {ns} (checkpoint PVCs are kept)")
    delete_lighthouse(core, name, ns)
    delete_rbac(core, name, ns)
    return 0
