"""Kubernetes: what a cluster would reject, as one clear line each (SpecError: exit 2),
checked when a manifest is rendered, before anything is sent."""

from __future__ import annotations

import re

from ddpkit.k8s import crds
from ddpkit.tools.jobspec import JobSpec, SpecError

# Set by the controllers; a user value would conflict (TrainJob rejects PET_* outright).
RESERVED_ENV = re.compile(
    r"^(PET_.*|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|POD_NAME|POD_UID|DDPKIT_NODE_NAME)$"
)
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


def longest_host_name(spec: JobSpec) -> str:
    """The longest Service/host name the controller derives; a DNS-1035 label (<= 63)."""
    if spec.k8s.api == "trainjob":  # JobSet pod hostnames: <trainjob>-node-<job>-<pod index>
        return f"{spec.name}-node-0-{spec.nodes - 1}"
    replicas = spec.k8s.elastic.max or spec.nodes
    return f"{spec.name}-worker-{max(replicas - 1, 0)}"


def check(spec: JobSpec) -> None:
    """What a cluster would reject, as one clear line each (SpecError: exit 2)."""
    k = spec.k8s
    if not DNS1035.match(spec.name):
        raise SpecError(
            f"name {spec.name!r} is not a DNS-1035 label, which Kubernetes needs for the job's "
            "Services: start with a letter, then lowercase letters, digits and '-' (e.g. mnist-ddp)"
        )
    longest = longest_host_name(spec)
    if len(longest) > 63:
        raise SpecError(
            f"name {spec.name!r} is too long: the Service/host name {longest!r} has "
            f"{len(longest)} characters, over 63; shorten the name by {len(longest) - 63}"
        )
    if not DNS1123_LABEL.match(k.namespace) or len(k.namespace) > 63:
        raise SpecError(f"k8s.namespace {k.namespace!r} is not a namespace name (e.g. ml-team)")
    named = {
        "k8s.pvc": k.pvc,
        "k8s.priority_class": k.priority_class,
        "k8s.service_account": k.service_account,
        "k8s.queue": k.queue,
        "k8s.scheduler": k.scheduler,
        "k8s.storage_class": k.storage_class,
    }
    named |= {f"k8s.image_pull_secrets[{i}]": s for i, s in enumerate(k.image_pull_secrets)}
    for key, value in named.items():
        if value is not None and (not DNS1123_SUBDOMAIN.match(value) or len(value) > 253):
            raise SpecError(
                f"{key} {value!r} is not a Kubernetes object name: use lowercase letters, "
                "digits, '-' and '.'"
            )
    if not QUALIFIED.match(k.rdma_resource):
        raise SpecError(f"k8s.rdma_resource {k.rdma_resource!r}: use a resource name like rdma/ib")
    for key, size in (("k8s.shm_size", k.shm_size), ("k8s.pvc_size", k.pvc_size)):
        if size is not None and not QUANTITY.match(size):
            raise SpecError(f"{key} {size!r} is not a Kubernetes quantity; use e.g. 16Gi")
    if k.backoff_limit < 0 or (k.ttl_seconds_after_finished or 0) < 0:
        raise SpecError("k8s.backoff_limit and k8s.ttl_seconds_after_finished must be >= 0")
    for key in spec.env:
        if RESERVED_ENV.match(key):
            raise SpecError(
                f"env {key} is set by the Kubeflow controller (or by ddpkit); remove it from env "
                "and use the matching spec field (nodes, rdzv_port, ...)"
            )
    e = k.elastic
    if e.min is not None and not e.min <= spec.nodes <= e.max:
        raise SpecError(
            f"nodes {spec.nodes} is outside k8s.elastic min={e.min} max={e.max}; pass --nodes N "
            "with min <= N <= max (the replicas started first)"
        )
    if k.api == "trainjob":
        can = crds.supports(k.trainer_version)
        unsupported = {
            "k8s.elastic": e.min is not None,
            "k8s.priority_class": k.priority_class,
            "k8s.scheduler": k.scheduler,
        }
        unsupported["k8s.image_pull_secrets"] = (
            k.image_pull_secrets and not can["image_pull_secrets"]
        )
        for key, value in unsupported.items():
            if value:
                raise SpecError(
                    f"{key} is not supported with k8s.api=trainjob and k8s.trainer_version="
                    f"{k.trainer_version} (set it in the ClusterTrainingRuntime "
                    f"{crds.RUNTIME!r}); unset it or use k8s.api=pytorchjob"
                )
