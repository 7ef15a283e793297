"""The Kubernetes engine's options: the job file's [k8s] table, its defaults and its rules
(validate_k8s, run by K8sBackend.validate for Kubernetes jobs only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ddpkit.tools.backends.containers import INT32_MAX, check_ckpt_dir, check_shm_size
from ddpkit.tools.jobspec import ENV_NAME_RE, JobSpec, SpecError


@dataclass
class ElasticOptions:
    min: int | None = None  # minimum nodes (replicas); unset = not elastic
    max: int | None = None  # maximum nodes
    # Once `min` nodes have joined a rendezvous, how long it waits for more before the group
    # starts (torchrun's last_call_timeout, default 30 s; elasticPolicy.rdzvConf). A recreated
    # pod that starts later finds a smaller group training and joins at its next restart.
    last_call_s: int | None = None


@dataclass
class K8sOptions:
    """The job file's [k8s] table."""

    __backend_options__ = True
    namespace: str = "default"
    api: Literal["pytorchjob", "trainjob"] = "pytorchjob"  # kubeflow.org/v1 or Trainer v2
    # The Kubeflow Trainer release a TrainJob is shaped for (its per-job pod field changed name
    # in 2.1 and 2.2); submit checks it against the cluster's CRD.
    trainer_version: Literal["2.0", "2.1", "2.2", "2.3"] = "2.3"
    elastic: ElasticOptions = field(default_factory=ElasticOptions)
    pvc: str | None = None  # PersistentVolumeClaim mounted for runs/checkpoints
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    priority_class: str | None = None
    service_account: str | None = None
    image_pull_secrets: list[str] = field(default_factory=list)
    queue: str | None = None  # Kueue LocalQueue / Volcano queue name
    scheduler: str | None = None  # schedulerName, e.g. "volcano"
    shm_size: str = "16Gi"  # /dev/shm as a memory-backed emptyDir
    rdma: bool = False  # request RDMA/InfiniBand devices; unlimited memlock (docs/kubernetes.md)
    rdma_resource: str = "rdma/ib"  # the device plugin's RDMA resource, requested when rdma
    pvc_size: str | None = None  # also render the PVC (ReadWriteMany), e.g. "100Gi"
    storage_class: str | None = None  # storageClassName of the rendered PVC
    backoff_limit: int = 3  # runPolicy.backoffLimit: pod restarts before the job fails
    ttl_seconds_after_finished: int | None = 86400  # runPolicy: delete the job this long after
    clean_pod_policy: Literal["None", "Running", "All"] = "Running"  # pods deleted at the end
    # A node on which the job failed twice is kept out of the recreated pods (required node
    # affinity the pods add to their own job: k8s/exclude.py). Renders a Role and RoleBinding
    # (and a ServiceAccount unless service_account names one) giving the pods get and patch
    # on their PyTorchJob: off by default, since not every namespace lets its users create them.
    exclude_failed_nodes: bool = False
    # Environment from Kubernetes Secrets: NAME = "secret/key" (secretKeyRef), so the value is
    # never written into the manifest, e.g. WANDB_API_KEY = "wandb/api-key".
    secret_env: dict[str, str] = field(default_factory=dict)


def validate_k8s(spec: JobSpec) -> None:
    """The Kubernetes backend's rules on a loaded spec."""
    counts = {"nodes": spec.nodes, "nproc_per_node": spec.nproc_per_node}
    counts |= {"k8s.elastic.max": spec.k8s.elastic.max or 0}
    counts |= {"k8s.backoff_limit": spec.k8s.backoff_limit}
    for key, n in counts.items():
        if n > INT32_MAX:
            raise SpecError(f"{key} = {n} is over {INT32_MAX} (int32, what Kubernetes stores)")
    for name, ref in spec.k8s.secret_env.items():
        secret, _, key = ref.partition("/")
        if not ENV_NAME_RE.match(name) or not secret or not key or "/" in key:
            raise SpecError(
                f'k8s.secret_env {name} = {ref!r}: give NAME = "secret/key" '
                '(e.g. WANDB_API_KEY = "wandb/api-key")'
            )
        if name in spec.env:
            raise SpecError(f"{name} is in both env and k8s.secret_env; keep one")
    check_shm_size("k8s.shm_size", spec.k8s.shm_size)
    e = spec.k8s.elastic
    if (e.min is None) != (e.max is None) or (e.min is not None and not 1 <= e.min <= e.max):
        raise SpecError(
            f"k8s.elastic min={e.min} max={e.max}: set both, with 1 <= min <= max, or neither"
        )
    if e.last_call_s is not None and e.min is None:
        raise SpecError(
            "k8s.elastic.last_call_s is for an elastic job: set k8s.elastic.min and max too, "
            "or drop it"
        )
    if e.last_call_s is not None and not 1 <= e.last_call_s <= INT32_MAX:
        raise SpecError(f"k8s.elastic.last_call_s = {e.last_call_s}: give whole seconds, 1 or more")
    check_ckpt_dir(spec)
