"""The objects a job brings beside it on Kubernetes, created and deleted with it: the service
account and rights the pods need to keep a failing node out of their job
(k8s.exclude_failed_nodes) and torchft's lighthouse (its Deployment and Service)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ddpkit.k8s import exclude
from ddpkit.k8s.client import call
from ddpkit.tools.jobspec import SpecError

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


def create_rbac(core: Any, doc: dict[str, Any], api: str, ns: str) -> None:
    """The service account and the rights the pods need to keep a failing node out of their
    job (k8s/render.py rbac_objects), before the job; kept when it exists (the same job's
    name gives the same objects). A user without the right to create them gets the line."""
    name, kind = doc["metadata"]["name"], doc["kind"]
    try:
        call(_rbac_calls(core, kind)[0], f"{kind} {name}", api, ns, ns, doc)
        print(f"created {kind.lower()}/{name}", file=sys.stderr)
    except SpecError as e:
        if "already exists" not in str(e):
            raise SpecError(
                f"{e} (k8s.exclude_failed_nodes needs them; set it false where you may not "
                "create service accounts, roles and role bindings)"
            ) from None
        print(f"{kind.lower()}/{name} exists; reusing it", file=sys.stderr)


def create_lighthouse(
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
        call(create, f"{what} {name}", api, ns, ns, doc)
        print(
            f"created {what.lower()}/{name} (owned by {job['kind']} {owner['name']})",
            file=sys.stderr,
        )


def delete_rbac(core: Any, job: str, ns: str) -> None:
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


def delete_lighthouse(core: Any, job: str, ns: str) -> None:
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
