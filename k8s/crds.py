"""The custom resources ddpkit renders: PyTorchJob (kubeflow.org/v1) and TrainJob (Kubeflow
Trainer v2), with the TrainJob's per-job pod changes in the shape of each Trainer release.

Pure data shared by the renderer (__init__.py, checks.py) and the API side (api.py), so
neither imports the other. Field names read from kubeflow/trainer's pkg/apis/trainer/v1alpha1/trainjob_types.go at the tags:

    2.0  spec.podSpecOverrides[]     {targetJobs, volumes, containers, nodeSelector, tolerations,
                                      serviceAccountName}
    2.1  spec.podTemplateOverrides[] {targetJobs, metadata, spec: {... + imagePullSecrets}}
    2.2  spec.runtimePatches[]       {manager, trainingRuntimeSpec.template.spec.replicatedJobs[]
                                      {name, template.spec.template.spec: PodSpecPatch}};
                                      PodSpecPatch gains securityContext, containers[] gain
                                      securityContext; spec.activeDeadlineSeconds appears
    2.3  as 2.2; PodSpecPatch gains terminationGracePeriodSeconds

A field the served CRD does not know is pruned by the API server, so a manifest for the
wrong release silently loses /dev/shm and the checkpoint volume: `served_version` reads the
CRD to say which shape a cluster serves, and submit refuses a mismatch.
"""

from __future__ import annotations

from typing import Any

PYTORCHJOB = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
PYTORCH_CONTAINER = "pytorch"  # the container the PyTorchJob controller wires up
GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
TRAINJOB = (GROUP, VERSION, PLURAL, KIND)
CRD_NAME = f"{PLURAL}.{GROUP}"  # apiextensions.k8s.io/v1 CustomResourceDefinition
RUNTIME = "torch-distributed"  # the ClusterTrainingRuntime every release ships
NODE = "node"  # its one replicated job, and the trainer container in it
VERSIONS = ("2.0", "2.1", "2.2", "2.3")
NEWEST = VERSIONS[-1]
# runtimePatches are keyed by who owns them; Trainer v2.3's webhook wants a domain-prefixed
# path (Kueue: kueue.x-k8s.io/manager), refusing a bare "ddpkit" (seen on the real webhook).
MANAGER = "ddpkit.io/launcher"
OVERRIDE_FIELD = {
    "2.0": "podSpecOverrides",
    "2.1": "podTemplateOverrides",
    "2.2": "runtimePatches",
    "2.3": "runtimePatches",
}


def supports(version: str) -> dict[str, bool]:
    """What a release lets a TrainJob set per job (else it comes from the runtime)."""
    v = VERSIONS.index(version)
    return {
        "image_pull_secrets": v >= 1,
        "security_context": v >= 2,  # pod fsGroup, container capabilities (RDMA's IPC_LOCK)
        "deadline": v >= 2,  # spec.activeDeadlineSeconds
        "grace": v >= 3,  # terminationGracePeriodSeconds
    }


def pod_patch(
    version: str,
    *,
    volumes: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    node_selector: dict[str, str],
    tolerations: list[dict[str, Any]],
    service_account: str | None,
    image_pull_secrets: list[str],
    pod_security: dict[str, Any],
    container_security: dict[str, Any],
    grace_s: int,
    labels: dict[str, str],
) -> dict[str, Any]:
    """The `spec` entry (field name, value) that changes the trainer pods, for `version`."""
    can = supports(version)
    container: dict[str, Any] = {"name": NODE, "volumeMounts": mounts}
    pod: dict[str, Any] = {"volumes": volumes}
    if can["security_context"]:
        pod["securityContext"] = pod_security
        container["securityContext"] = container_security
    if can["grace"]:
        pod["terminationGracePeriodSeconds"] = grace_s
    pod["containers"] = [container]
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if tolerations:
        pod["tolerations"] = [dict(t) for t in tolerations]
    if service_account:
        pod["serviceAccountName"] = service_account
    if image_pull_secrets and can["image_pull_secrets"]:
        pod["imagePullSecrets"] = [{"name": s} for s in image_pull_secrets]
    target = [{"name": NODE}]
    if version == "2.0":
        return {OVERRIDE_FIELD[version]: [{"targetJobs": target, **pod}]}
    meta = {"labels": dict(labels)}
    if version == "2.1":
        return {OVERRIDE_FIELD[version]: [{"targetJobs": target, "metadata": meta, "spec": pod}]}
    job = {"name": NODE, "template": {"spec": {"template": {"metadata": meta, "spec": pod}}}}
    patch = {"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
    patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = [job]
    return {OVERRIDE_FIELD[version]: [patch]}


# --- what a cluster serves ----------------------------------------------------------------------


def _props(schema: dict[str, Any] | None, *path: str) -> dict[str, Any]:
    """properties at `path` ("[]" steps into array items); {} when absent."""
    node = schema or {}
    for step in path:
        if step == "[]":
            node = node.get("items") or {}
        else:
            node = (node.get("properties") or {}).get(step) or {}
    return node.get("properties") or {}


def served_version(crd: dict[str, Any]) -> str | None:
    """The Trainer release whose TrainJob shape the CRD serves (None: none we know)."""
    for v in crd.get("spec", {}).get("versions") or []:
        if v.get("name") != VERSION or not v.get("served"):
            continue
        root = (v.get("schema") or {}).get("openAPIV3Schema")
        spec = _props(root, "spec")
        if "runtimePatches" in spec:
            pod = _props(
                root, "spec", "runtimePatches", "[]", "trainingRuntimeSpec", "template", "spec",
                "replicatedJobs", "[]", "template", "spec", "template", "spec",
            )  # fmt: skip
            return "2.3" if "terminationGracePeriodSeconds" in pod else "2.2"
        if "podTemplateOverrides" in spec:
            return "2.1"
        if "podSpecOverrides" in spec:
            return "2.0"
    return None


def compatible(rendered: str, served: str) -> bool:
    """A 2.2 manifest is a subset of 2.3's shape; every other pair differs in a field name
    or in a field the older CRD prunes."""
    return rendered == served or (rendered, served) == ("2.2", "2.3")


def missing_paths(sent: Any, returned: Any, path: str = "") -> list[str]:
    """Paths present in what was sent but not in what the server returned (pruned)."""
    if isinstance(sent, dict):
        if not isinstance(returned, dict):
            return [path or "."]
        out: list[str] = []
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            out += missing_paths(value, returned[key], where) if key in returned else [where]
        return out
    if isinstance(sent, list):
        if not isinstance(returned, list) or len(returned) != len(sent):
            return [path]
        return [
            p for i, v in enumerate(sent) for p in missing_paths(v, returned[i], f"{path}[{i}]")
        ]
    return []
