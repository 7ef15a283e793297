"""A node that failed twice kept out of a PyTorchJob's recreated pods (k8s.exclude_failed_nodes).

SLURM's requeue adds such a node to the job's ExcNodeList; here the pod that is about to be
recreated (ddpkit.k8s.attempt, exit EXIT_RESTART_POD) adds it to its own job's pod templates
as required node affinity, `kubernetes.io/hostname NotIn [...]`, before it exits: the training
operator builds every recreated pod from the job's current templates, so the next attempt is
scheduled off the node. The pod needs API rights on its job (get, patch), which the rendered
Role and RoleBinding give its service account (k8s/render.py: rbac_objects); without them the
pod says so in one line and the job goes on as before. torch-free.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

from ddpkit.train.launch.verdicts import room_for

JOB_ENV = "DDPKIT_K8S_JOB"  # the PyTorchJob's name (rendered when exclusion is on)
NAMESPACE_ENV = "DDPKIT_K8S_NAMESPACE"  # its namespace (downward API)
HOSTNAME_LABEL = "kubernetes.io/hostname"
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
RETRIES = 5  # patches that lost a race with another pod's (409 Conflict)


def rbac_name(job: str) -> str:
    """The name of the job's own ServiceAccount, Role and RoleBinding (k8s/render.py)."""
    return f"{job}-ddpkit"


def _required(pod_spec: dict[str, Any]) -> dict[str, Any] | None:
    aff = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    return aff.get("requiredDuringSchedulingIgnoredDuringExecution")


def excluded(job: dict[str, Any]) -> list[str]:
    """The nodes a job's pod templates keep out (hostname NotIn), sorted."""
    out: set[str] = set()
    for rs in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).values():
        req = _required(((rs.get("template") or {}).get("spec")) or {}) or {}
        for term in req.get("nodeSelectorTerms") or []:
            for e in term.get("matchExpressions") or []:
                if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn":
                    out.update(e.get("values") or [])
    return sorted(out)


def with_excluded(pod_spec: dict[str, Any], nodes: list[str]) -> dict[str, Any] | None:
    """The pod spec's affinity with `nodes` kept out, or None when it keeps them out already.
    Node selector terms are ORed, so the NotIn goes into every term (one term when none)."""
    affinity = copy.deepcopy(pod_spec.get("affinity") or {})
    na = affinity.setdefault("nodeAffinity", {})
    req = na.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = req.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({"matchExpressions": []})
    changed = False
    for term in terms:
        exprs = term.setdefault("matchExpressions", [])
        mine = next(
            (e for e in exprs if e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn"),
            None,
        )
        if mine is None:
            mine = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": []}
            exprs.append(mine)
        values = sorted(set(mine.get("values") or []) | set(nodes))
        if values != mine.get("values"):
            mine["values"], changed = values, True
    return affinity if changed else None


def patch_for(job: dict[str, Any], nodes: list[str]) -> dict[str, Any] | None:
    """The merge patch that keeps `nodes` out of every replica's pods (None: nothing to do).
    It carries the job's resourceVersion: a concurrent change makes it fail (409), not lost."""
    replicas: dict[str, Any] = {}
    for name, rs in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).items():
        aff = with_excluded(((rs.get("template") or {}).get("spec")) or {}, nodes)
        if aff is not None:
            replicas[name] = {"template": {"spec": {"affinity": aff}}}
    if not replicas:
        return None
    version = (job.get("metadata") or {}).get("resourceVersion")
    return {"metadata": {"resourceVersion": version}, "spec": {"pytorchReplicaSpecs": replicas}}


def ready_nodes(core: Any) -> set[str] | None:
    """The cluster's Ready, schedulable nodes; None when the pod may not list nodes (a
    cluster-scoped right the rendered Role cannot give: docs/kubernetes.md), and then no
    node is held back for room."""
    from kubernetes.client.rest import ApiException

    try:
        items = core.list_node().items
    except ApiException as e:
        if e.status in (401, 403):
            return None
        raise
    out = set()
    for n in items:
        ready = any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
        if ready and not (n.spec and n.spec.unschedulable):
            out.add(n.metadata.name)
    return out


def keep_off(nodes: list[str]) -> str:
    """Patch this pod's job (JOB_ENV, NAMESPACE_ENV) to keep `nodes` out of its next pods;
    the line that says what happened (never raises: the restart goes on either way)."""
    name, ns = os.environ.get(JOB_ENV), os.environ.get(NAMESPACE_ENV) or "default"
    which = ", ".join(nodes)
    if not name:
        return (
            f"node {which} failed twice; the recreated pods may be placed on it again: set "
            "k8s.exclude_failed_nodes = true to keep it out (docs/kubernetes.md)"
        )
    try:
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException

        config.load_incluster_config()
        api = client.CustomObjectsApi()
        usable = ready_nodes(client.CoreV1Api())
        for _ in range(RETRIES):
            job = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            left: list[str] = []
            if usable is not None:
                need = int(os.environ.get("PET_NNODES", "1").split(":")[-1] or 1)
                nodes, left = room_for(nodes, usable, excluded(job), need)
                which = ", ".join(nodes)
                if left:
                    print(f"ddpkit: not excluding {', '.join(left)} (failed twice): fewer Ready "
                          f"nodes than the job's {need} pods would be left", file=sys.stderr,
                          flush=True)  # fmt: skip
                if not nodes:
                    return f"node {', '.join(left)} failed twice: left in, for room"
            body = patch_for(job, nodes)
            if body is None:
                return f"node {which} failed twice: kept out of PyTorchJob {name}'s pods already"
            try:
                api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body)
            except ApiException as e:
                if e.status == 409:
                    continue
                raise
            return f"node {which} failed twice: kept out of PyTorchJob {name}'s next pods"
        return f"node {which} failed twice: PyTorchJob {name} kept changing; not kept out"
    except Exception as e:  # no token, no rights, no API server: say it, restart anyway
        why = getattr(e, "reason", None) or str(e).splitlines()[0][:200]
        return (
            f"node {which} failed twice but could not be kept out of PyTorchJob {name} ({why}): "
            "the pod needs get and patch on its job (the Role k8s.exclude_failed_nodes renders)"
        )
