"""The Kubernetes manifests, built as dicts by small pure functions and dumped with the kit's
safe YAML dumper, so every user string reaches the API server as that string (no splicing into
YAML, and quoted wherever a YAML 1.1, 1.2 or go-yaml reader would take it for a number or a
boolean)."""

from __future__ import annotations

import posixpath
from pathlib import PurePosixPath
from typing import Any

from ddpkit.k8s import attempt, exclude
from ddpkit.k8s import crds as k8s_crds
from ddpkit.k8s.checks import check
from ddpkit.k8s.crds import PYTORCH_CONTAINER as CONTAINER
from ddpkit.k8s.crds import PYTORCHJOB, TRAINJOB
from ddpkit.k8s.crds import RUNTIME as TRAINER_RUNTIME
from ddpkit.k8s.options import validate_k8s
from ddpkit.k8s.scrape import annotate, metrics_ports, scrape_annotations
from ddpkit.tools.backends.containers import CONTAINER_WORKDIR
from ddpkit.tools.jobspec import JobSpec, SpecError, node_command
from ddpkit.tools.templating import KIT_DIR, dump_yaml_all
from ddpkit.train.ckpt.store import is_remote
from ddpkit.train.contract import NODE_NAME_ENV
from ddpkit.train.ft_env import LIGHTHOUSE_ENV
from ddpkit.train.launch import lighthouse

FILE_EXT = "yaml"
PORT_NAME = "pytorchjob-port"
WORKDIR = CONTAINER_WORKDIR  # relative run/checkpoint paths resolve here
RUN_AS = 1000  # the image's non-root user (docker/Dockerfile UID/GID)
RDZV_WAIT_S = 600  # how long a pod waits for the rendezvous endpoint to accept connections
GRACE_MARGIN_S = 30  # on top of the shutdown budget: the agent's teardown and the exit
ELASTIC_DEFAULT_RESTARTS = 3  # an elastic job restarts its group on every membership change
LAUNCH_SCRIPT = KIT_DIR / "k8s" / "launch.sh"


# --- pieces -----------------------------------------------------------------------------------


def ckpt_path(spec: JobSpec) -> str:
    """Where checkpoints land inside the container (absolute); a store's URL as it is."""
    if is_remote(spec.checkpoint_dir):
        return spec.checkpoint_dir
    return posixpath.normpath(posixpath.join(WORKDIR, spec.checkpoint_dir))


def run_path(spec: JobSpec) -> str:
    """The run dir inside the container (absolute): summary.json, metrics, node logs."""
    return posixpath.normpath(posixpath.join(WORKDIR, spec.run_dir))


def claim_sub_path(path: str) -> str:
    """Where a container path lives on the claim: its path below the work dir (or below /),
    so jobs sharing one claim keep their run dirs apart."""
    below = PurePosixPath(path)
    rel = below.relative_to(WORKDIR) if below.is_relative_to(WORKDIR) else below.relative_to("/")
    return str(rel)


def pvc_name(spec: JobSpec) -> str | None:
    if spec.k8s.pvc:
        return spec.k8s.pvc
    return f"{spec.name}-ckpt" if spec.k8s.pvc_size else None


def memory_quantity(mem: str | None) -> str | None:
    """SLURM-style memory (binary units, plain number = MiB) as a Kubernetes quantity."""
    if mem is None or mem == "0":  # "0" = all of the node: no request, no limit
        return None
    unit = mem[-1] if mem[-1] in "KMGT" else "M"
    return f"{mem.rstrip('KMGT')}{unit}i"


def resources(spec: JobSpec) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": str(spec.nproc_per_node * spec.cpus_per_proc)}
    if memory := memory_quantity(spec.mem):
        amounts["memory"] = memory
    if spec.accelerator == "gpu":
        amounts["nvidia.com/gpu"] = str(spec.nproc_per_node)
    if spec.k8s.rdma:
        amounts[spec.k8s.rdma_resource] = "1"
    # Requests equal to limits: the Guaranteed QoS class (no eviction under memory pressure)
    # when `mem` is set too; without a memory request the API server makes the pod
    # Burstable (its status.qosClass on the local cluster), and so does the training
    # operator's init container on PyTorchJob workers (requests below its limits).
    return {"requests": dict(amounts), "limits": dict(amounts)}


def env(spec: JobSpec) -> list[dict[str, Any]]:
    """The container's environment: POD_NAME, the launch environment, then the Secret refs
    (only the Secret's name and key are written here, never the value)."""
    values: dict[str, str] = {}
    if spec.k8s.elastic.min is not None:
        # torch shares the rendezvous TCPStore with the workers and caches its address from
        # the first round: a pod that (re)joins a running job then waits forever for a key
        # the old rank 0 never rewrites. Found by the operator emulation (a killed replica).
        values["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    values.update(spec.launch_env())
    if spec.fault_tolerance == "torchft":  # launch.sh: this pod is one replica group
        values[LIGHTHOUSE_ENV] = f"http://{lighthouse_name(spec)}:{lighthouse.PORT}"
    if spec.k8s.rdma:
        # RDMA registers (pins) memory: launch.sh refuses to start without an unlimited
        # memlock limit, with the fix, instead of NCCL failing later (README: RDMA).
        values["DDPKIT_REQUIRE_MEMLOCK"] = "unlimited"
    if restart_policy(spec) == "ExitCode":  # ddpkit.k8s.attempt counts the pods on the claim
        values[attempt.LIMIT_ENV] = str(spec.k8s.backoff_limit)
    pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    # The pod's node names the failures in the goodput records (and the node to exclude); the
    # pod's uid tells a recreated pod from the one before it (ddpkit.k8s.attempt).
    downward = [pod_name] + [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in ((NODE_NAME_ENV, "spec.nodeName"), ("POD_UID", "metadata.uid"))
    ]
    if spec.k8s.exclude_failed_nodes:  # the pods patch their own job (k8s/exclude.py)
        values[exclude.JOB_ENV] = spec.name
        downward.append({"name": exclude.NAMESPACE_ENV,
                         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})  # fmt: skip
    plain = [{"name": k, "value": str(v)} for k, v in sorted(values.items())]
    secrets = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": ref.partition("/")[0],
                                                   "key": ref.partition("/")[2]}}}
        for k, ref in sorted(spec.k8s.secret_env.items())
    ]  # fmt: skip
    return [*downward, *plain, *secrets]


def grace_period_s(spec: JobSpec) -> int:
    """terminationGracePeriodSeconds: SIGTERM, then this long for the checkpoint save (the
    shutdown budget) and the agent's exit before the kubelet sends SIGKILL."""
    return spec.shutdown_budget_s + GRACE_MARGIN_S


def max_restarts(spec: JobSpec) -> int:
    """torchrun's in-place budget in the pods: the job's (default 3), as on every backend. A
    killed or crashed worker restarts in place in a few seconds, its pod and its peers' pods
    kept; past the budget, or when a pod is lost, the operator recreates the pods
    (restart_policy). A deleted pod's peers are not restarted in place: their workers saved
    and exited 75 with it, and ddpkit.train.launch.hooks stops torchrun's retries on that (before,
    a peer restarted in place waited for the recreated pod at another attempt's store keys;
    53e30b7 had set 0 here for it). An elastic job restarts its group on every membership
    change: at least its own default. A TrainJob left at the default keeps 0 (its JobSet
    restarts the pods; the recovery above is not tested there)."""
    if spec.k8s.elastic.min is not None and not spec.max_restarts:
        return ELASTIC_DEFAULT_RESTARTS
    if spec.k8s.api == "trainjob" and spec.max_restarts is None:
        return 0
    return spec.restart_budget


def restart_policy(spec: JobSpec) -> str:
    """The replicas' restartPolicy. ExitCode for a fixed-size job: an exit status of 128 or
    more recreates the pod, below 128 fails the job at once, so the user's code failing is
    never retried; ddpkit.k8s.attempt maps the node launcher's status to it and keeps the
    restart count the operator does not (v1.9 holds ExitCode restarts to no backoffLimit).
    OnFailure for an elastic job (torchrun re-forms its group in the pods), torchft (its
    supervisor restarts the groups), and a job without a claim: the count needs a run dir
    that outlives the pods, and without one the kubelet's in-place restarts are what the
    operator holds to backoffLimit."""
    fixed = spec.k8s.api == "pytorchjob" and spec.k8s.elastic.min is None
    if not fixed or spec.fault_tolerance == "torchft" or pvc_name(spec) is None:
        return "OnFailure"
    return "ExitCode"


def host_pod(spec: JobSpec) -> str:
    if spec.k8s.api == "trainjob":
        return f"{spec.name}-node-0-0"
    role = "worker" if spec.k8s.elastic.min is not None else "master"
    return f"{spec.name}-{role}-0"


def node_args(spec: JobSpec) -> list[str]:
    """The arguments launch.sh hands on: the node launcher's flags and the entry point (the
    rendezvous comes from the controller's PET_* variables), or with fault_tolerance =
    torchft the replica-group supervisor's. Each pod is then one group (its node rank,
    DDPKIT_NODE_RANK from launch.sh), a standalone torchrun restarted in place when it dies;
    the lighthouse is its own pod, behind its Service. The in-place budget is this engine's
    (max_restarts)."""
    return node_command(
        spec,
        bare=True,
        max_restarts=max_restarts(spec),
        nodes=spec.nodes,
        node_rank_env="DDPKIT_NODE_RANK",
        lighthouse=False,
    )


def command(spec: JobSpec) -> tuple[list[str], list[str]]:
    """(command, args) of the training container: the launch script, then its arguments
    (every user value is an argument, never script text)."""
    text = LAUNCH_SCRIPT.read_text()
    # The file's header comment documents it in the repository; the manifest names it.
    script = "# ddpkit k8s/launch.sh\n" + text[text.index("set -euo pipefail") :]
    args = [host_pod(spec), str(RDZV_WAIT_S), *node_args(spec)]
    return ["bash", "-c", script, "ddpkit-k8s"], args


def volumes(spec: JobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts): /dev/shm in memory; the run dir on the PVC (summary.json,
    metrics and node logs outlive the pods; checkpoints too, below it by default, or at
    their own path on the same claim)."""
    vols: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.k8s.shm_size}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if claim := pvc_name(spec):
        vols.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
        run, ckpt = run_path(spec), ckpt_path(spec)
        mounts.append({"name": "checkpoints", "mountPath": run, "subPath": claim_sub_path(run)})
        if not is_remote(spec.checkpoint_dir) and not PurePosixPath(ckpt).is_relative_to(run):
            sub = claim_sub_path(ckpt)
            mounts.append({"name": "checkpoints", "mountPath": ckpt, "subPath": sub})
    return vols, mounts


def labels(spec: JobSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "ddpkit",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def container_security() -> dict[str, Any]:
    # No IPC_LOCK for RDMA: an added capability never reaches a non-root process's effective
    # set (Kubernetes sets no ambient capabilities), so it would not raise memlock anyway.
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,  # the PVC is writable by the non-root user
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container(spec: JobSpec) -> dict[str, Any]:
    cmd, args = command(spec)
    vols, mounts = volumes(spec)
    return {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": cmd,
        "args": args,
        "workingDir": WORKDIR,
        "env": env(spec),
        "ports": [{"name": PORT_NAME, "containerPort": spec.rdzv_port, "protocol": "TCP"}]
        + metrics_ports(spec),
        "resources": resources(spec),
        "volumeMounts": mounts,
        "securityContext": container_security(),
    }


def pod_template(spec: JobSpec, announce: bool = True) -> dict[str, Any]:
    """announce: the pods scraped for metrics (where rank 0 runs: a PyTorchJob's master)."""
    k = spec.k8s
    policy = restart_policy(spec)
    pod: dict[str, Any] = {
        # The operator sets the pods' own policy from the replicas' (ExitCode: Never).
        "restartPolicy": "Never" if policy == "ExitCode" else policy,
        # SIGTERM on deletion/preemption: torchrun forwards it, the workers save a checkpoint.
        "terminationGracePeriodSeconds": grace_period_s(spec),
        "securityContext": pod_security(),
        "containers": [container(spec)],
        "volumes": volumes(spec)[0],
    }
    optional = {
        "nodeSelector": dict(k.node_selector) or None,
        "tolerations": [dict(t) for t in k.tolerations] or None,
        "priorityClassName": k.priority_class,
        "serviceAccountName": service_account(spec),
        "imagePullSecrets": [{"name": s} for s in k.image_pull_secrets] or None,
        "schedulerName": k.scheduler,
    }
    pod.update({key: value for key, value in optional.items() if value is not None})
    meta: dict[str, Any] = {"labels": labels(spec, "training")}
    if announce and (notes := scrape_annotations(spec)):
        meta["annotations"] = notes
    return {"metadata": meta, "spec": pod}


def service_account(spec: JobSpec) -> str | None:
    """The pods' service account: the user's, else with exclude_failed_nodes one of the job's
    own (rbac_objects), else the namespace's default (None)."""
    if spec.k8s.service_account or not spec.k8s.exclude_failed_nodes:
        return spec.k8s.service_account
    return exclude.rbac_name(spec.name)


def rbac_objects(spec: JobSpec) -> list[dict[str, Any]]:
    """exclude_failed_nodes: the rights the pods need to keep a failing node out of their own
    job (get and patch on this PyTorchJob only), given to their service account, and that
    account when the user names none. Created before the job: a pod naming a service account
    that does not exist is refused."""
    if not spec.k8s.exclude_failed_nodes:
        return []
    sa, ns = str(service_account(spec)), spec.k8s.namespace
    name = exclude.rbac_name(spec.name)
    meta = {"name": name, "namespace": ns, "labels": labels(spec, "rbac")}
    out: list[dict[str, Any]] = []
    if not spec.k8s.service_account:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
    rule = {"apiGroups": [exclude.GROUP], "resources": [exclude.PLURAL],
            "resourceNames": [spec.name], "verbs": ["get", "patch"]}  # fmt: skip
    out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
                "rules": [rule]})  # fmt: skip
    out.append({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    })  # fmt: skip
    return out


def validate_exclusion(spec: JobSpec) -> None:
    if spec.k8s.exclude_failed_nodes and restart_policy(spec) != "ExitCode":
        raise SpecError(
            "k8s.exclude_failed_nodes works where the operator recreates the pods: a fixed-size "
            "PyTorchJob with a claim (k8s.pvc or k8s.pvc_size), not elastic, not torchft, not "
            "a TrainJob; set it false or change those"
        )


def metadata(spec: JobSpec, component: str) -> dict[str, Any]:
    meta_labels = labels(spec, component)
    if spec.k8s.queue and spec.k8s.scheduler != "volcano":
        meta_labels["kueue.x-k8s.io/queue-name"] = spec.k8s.queue
    return {"name": spec.name, "namespace": spec.k8s.namespace, "labels": meta_labels}


def run_policy(spec: JobSpec, replicas: int) -> dict[str, Any]:
    k = spec.k8s
    policy: dict[str, Any] = {
        "cleanPodPolicy": k.clean_pod_policy,
        "backoffLimit": k.backoff_limit,
        "activeDeadlineSeconds": spec.time_minutes * 60,
    }
    if k.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = k.ttl_seconds_after_finished
    if k.scheduler:  # gang scheduling (Volcano / scheduler-plugins): all pods or none
        gang: dict[str, Any] = {"minAvailable": k.elastic.min or replicas}
        if k.queue and k.scheduler == "volcano":
            gang["queue"] = k.queue
        if k.priority_class:
            gang["priorityClass"] = k.priority_class
        policy["schedulingPolicy"] = gang
    return policy


def pytorchjob(spec: JobSpec) -> dict[str, Any]:
    group, version, _, kind = PYTORCHJOB
    template = pod_template(spec)
    e = spec.k8s.elastic

    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": restart_policy(spec), "template": template}

    body: dict[str, Any] = {"nprocPerNode": str(spec.nproc_per_node)}
    if e.min is not None:  # workers only; torchrun's c10d rendezvous on <job>-worker-0
        body["elasticPolicy"] = {
            "rdzvBackend": "c10d",
            "minReplicas": e.min,
            "maxReplicas": e.max,
            "maxRestarts": max_restarts(spec),
        }
        if e.last_call_s is not None:  # the operator passes it as PET_RDZV_CONF (launch.sh)
            conf = [{"key": "last_call_timeout", "value": str(e.last_call_s)}]
            body["elasticPolicy"]["rdzvConf"] = conf
        body["pytorchReplicaSpecs"] = {"Worker": replica(spec.nodes)}
    else:
        body["pytorchReplicaSpecs"] = {"Master": replica(1)}
        if spec.nodes > 1:  # rank 0 is the master's: only it is scraped
            workers = {**replica(spec.nodes - 1), "template": pod_template(spec, announce=False)}
            body["pytorchReplicaSpecs"]["Worker"] = workers
    body["runPolicy"] = run_policy(spec, spec.nodes)
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": metadata(spec, "training"),
        "spec": body,
    }


def trainjob(spec: JobSpec) -> dict[str, Any]:
    """A TrainJob on the torch-distributed runtime, its pod changes in the shape of
    k8s.trainer_version (k8s_crds.py)."""
    group, version, _, kind = TRAINJOB
    k = spec.k8s
    c = container(spec)
    vols, mounts = volumes(spec)
    patch = k8s_crds.pod_patch(
        k.trainer_version,
        volumes=vols,
        mounts=mounts,
        node_selector=k.node_selector,
        tolerations=k.tolerations,
        service_account=k.service_account,
        image_pull_secrets=k.image_pull_secrets,
        pod_security=pod_security(),
        container_security=container_security(),
        grace_s=grace_period_s(spec),
        labels=labels(spec, "training"),
    )
    annotate(patch, labels(spec, "training"), scrape_annotations(spec))
    body: dict[str, Any] = {
        "runtimeRef": {
            "name": TRAINER_RUNTIME,
            "apiGroup": group,
            "kind": "ClusterTrainingRuntime",
        },
        "trainer": {
            "image": c["image"],
            "command": c["command"],
            "args": c["args"],
            "env": c["env"],
            "numNodes": spec.nodes,
            "numProcPerNode": spec.nproc_per_node,
            "resourcesPerNode": c["resources"],
        },
        **patch,
    }
    if k8s_crds.supports(k.trainer_version)["deadline"]:
        body["activeDeadlineSeconds"] = spec.time_minutes * 60
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": metadata(spec, "training"),
        "spec": body,
    }


def pvc(spec: JobSpec) -> dict[str, Any] | None:
    """The checkpoint volume, rendered when k8s.pvc_size is set. ReadWriteMany: every node
    writes its shards of a DCP checkpoint into the same directory."""
    if not spec.k8s.pvc_size:
        return None
    body: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": spec.k8s.pvc_size}},
    }
    if spec.k8s.storage_class:
        body["storageClassName"] = spec.k8s.storage_class
    meta = {"name": pvc_name(spec), "namespace": spec.k8s.namespace}
    meta["labels"] = labels(spec, "checkpoints")
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": body}


def lighthouse_name(spec: JobSpec) -> str:
    return f"{spec.name}-lighthouse"


def lighthouse_objects(spec: JobSpec) -> list[dict[str, Any]]:
    """fault_tolerance = torchft: torchft's lighthouse as its own pod (a Deployment of one,
    recreated wherever it is lost) and the Service the groups reach it by. It outlives any
    group's restart; it needs no GPU, only the job's image (torchft in the [ft] extra)."""
    name, ns, own = lighthouse_name(spec), spec.k8s.namespace, labels(spec, "lighthouse")
    k = spec.k8s
    pod: dict[str, Any] = {
        "securityContext": pod_security(),
        "containers": [
            {
                "name": "lighthouse",
                "image": spec.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-m", "ddpkit.train.lighthouse"],
                "args": lighthouse.flags(lighthouse.PORT),
                "ports": [
                    {"name": "lighthouse", "containerPort": lighthouse.PORT, "protocol": "TCP"}
                ],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                "securityContext": container_security(),
            }
        ],
    }
    optional = {
        "tolerations": [dict(t) for t in k.tolerations] or None,
        "priorityClassName": k.priority_class,
        "serviceAccountName": k.service_account,
        "imagePullSecrets": [{"name": s} for s in k.image_pull_secrets] or None,
    }
    pod.update({key: value for key, value in optional.items() if value is not None})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": own},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": own},
            "template": {"metadata": {"labels": own}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": own},
        "spec": {
            "selector": own,
            "ports": [{"name": "lighthouse", "port": lighthouse.PORT, "targetPort": "lighthouse"}],
        },
    }
    return [deployment, service]


def validate_torchft(spec: JobSpec) -> None:
    if spec.fault_tolerance != "torchft":
        return
    k = spec.k8s
    why = None
    if k.api == "trainjob":
        why = 'a TrainJob; use k8s.api = "pytorchjob"'
    elif k.elastic.min is not None:
        why = "an elastic job (the groups come and go already); unset k8s.elastic"
    elif spec.groups != spec.nodes:
        why = f"{spec.groups} groups on {spec.nodes} pods; set replica_groups = {spec.nodes}"
    if why:
        raise SpecError(
            "fault_tolerance = torchft on Kubernetes runs one replica group per pod of a "
            f"PyTorchJob, not {why}"
        )


def manifests(spec: JobSpec) -> list[dict[str, Any]]:
    """The objects `submit` creates, in order (the PVC first; with exclude_failed_nodes the
    service account and its rights; with torchft the lighthouse's Deployment and Service
    before the job)."""
    validate_k8s(spec)  # pure, like render: a bad spec renders nothing
    check(spec)
    validate_torchft(spec)
    validate_exclusion(spec)
    job = trainjob(spec) if spec.k8s.api == "trainjob" else pytorchjob(spec)
    claim = pvc(spec)
    ft = lighthouse_objects(spec) if spec.fault_tolerance == "torchft" else []
    return [*([claim] if claim else []), *rbac_objects(spec), *ft, job]


def render(spec: JobSpec) -> str:
    docs = manifests(spec)
    head = [f"# ddpkit job {spec.name!r}: kubectl apply -f <this file>"]
    if spec.k8s.api == "trainjob":
        v = spec.k8s.trainer_version
        head.append(
            f"# shaped for Kubeflow Trainer {v} (k8s.trainer_version); submit checks the CRD"
        )
        lacking = [
            k for k, ok in k8s_crds.supports(v).items() if not ok and k != "image_pull_secrets"
        ]
        if lacking:
            head.append(
                f"# Trainer {v} takes no per-job {', '.join(lacking).replace('_', ' ')}: they come "
                f"from the ClusterTrainingRuntime {TRAINER_RUNTIME!r}"
            )
    if is_remote(spec.checkpoint_dir):
        head.append(
            f"# checkpoints go to {spec.checkpoint_dir}: name the store's credentials in "
            'k8s.secret_env (e.g. AWS_ACCESS_KEY_ID = "s3/access-key") and AWS_ENDPOINT_URL in env'
            + ("" if pvc_name(spec) else "; without k8s.pvc the run dir's logs go with the pod")
        )
    elif pvc_name(spec) is None:
        head.append(
            "# no k8s.pvc: checkpoints stay on each pod's disk and are lost with the pod; "
            "set k8s.pvc (or k8s.pvc_size)"
        )
    return "\n".join(head) + "\n" + dump_yaml_all(docs)
