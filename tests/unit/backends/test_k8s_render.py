"""PyTorchJob/TrainJob rendering: goldens (exact), parsed back and checked against the core
schemas (kubernetes-validate --strict), the controller's webhook rules, and YAML safety.

Regenerate goldens only on purpose:
DDPKIT_UPDATE_GOLDENS=1 pytest tests/unit/backends/test_k8s_render.py

Here the tests that run in this process; those that start processes in
tests/process/backends/test_k8s_render.py."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.tools import submit as launch
from ddpkit.tools.jobspec import JobSpec, SpecError, load_spec, node_command

REPO = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "k8s"


CASES: dict[str, tuple[str, list[str], int | None, int | None]] = {
    "default-2x2-pvc": ("configs/default.toml", ["k8s.pvc_size=100Gi", "mem=64G"], 2, 2),
    # the lighthouse's Deployment and Service; each PyTorchJob pod one replica group
    "default-torchft": ("configs/default.toml", ["fault_tolerance=torchft"], 2, 2),
    "gpt-elastic-gang": (
        "configs/gpt.toml",
        [
            "k8s.elastic.min=1",
            "k8s.elastic.max=4",
            "k8s.scheduler=volcano",
            "k8s.queue=research",
            "k8s.priority_class=high",
            "k8s.pvc=shared-ckpt",
            "k8s.rdma=true",
            "debug=info",
            "k8s.node_selector.gpu=h100",
            "k8s.service_account=trainer",
            "k8s.image_pull_secrets=['regcred']",
            "nccl_socket_ifname=eth0",
            'k8s.tolerations=[{key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule"}]',
            "k8s.namespace=ml",
            "image=registry.example.com/ddpkit:1.0",
        ],
        2,
        8,
    ),  # fmt: skip
    "mnist-kueue-cpu": (
        "configs/mnist_ddp.toml",
        [
            "accelerator=cpu",
            "k8s.queue=team-a",
            "mem=0",
            "time=2-00:00:00",
            "k8s.clean_pod_policy=All",
            "k8s.ttl_seconds_after_finished=none",
            "max_restarts=2",
        ],
        3,
        4,
    ),  # fmt: skip
    "default-trainjob": ("configs/default.toml", ["k8s.api=trainjob", "k8s.pvc_size=50Gi"], 2, 4),
}


def spec_for(case: str, *extra: str) -> JobSpec:
    config, sets, nodes, gpus = CASES[case]
    return load_spec(REPO / config, [*sets, *extra], nodes, gpus)


def docs_for(case: str, *extra: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(k8s.render(spec_for(case, *extra))))


def job_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    jobs = [d for d in docs if d["kind"] in ("PyTorchJob", "TrainJob")]
    assert len(jobs) == 1
    return jobs[0]


def pods_of(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Each replica's pod template as a Pod; for a TrainJob, the pod the torch-distributed
    runtime makes from `trainer` and the runtimePatches (Trainer 2.3)."""
    name = job["metadata"]["name"]
    if job["kind"] == "PyTorchJob":
        return [
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"{name}-{rtype.lower()}-0", **r["template"]["metadata"]},
             "spec": r["template"]["spec"]}
            for rtype, r in job["spec"]["pytorchReplicaSpecs"].items()
        ]  # fmt: skip
    t, (patch,) = job["spec"]["trainer"], job["spec"]["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    o = rjob["template"]["spec"]["template"]["spec"]
    c = {"name": "node", "image": t["image"], "command": t["command"], "args": t["args"],
         "env": t["env"], "resources": t["resourcesPerNode"], **o["containers"][0]}  # fmt: skip
    spec = {**o, "containers": [c], "restartPolicy": "Never"}
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-node-0-0"},
             "spec": spec}]  # fmt: skip


def webhook_errors(job: dict[str, Any]) -> list[str]:
    """The PyTorchJob webhook's rules (facts/kubeflow.md): what a cluster rejects."""
    errors, spec, name = [], job["spec"], job["metadata"]["name"]
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 63:
        errors.append("name is not a DNS-1035 label")
    replicas = spec.get("pytorchReplicaSpecs")
    if not replicas:
        return [*errors, "pytorchReplicaSpecs is required"]
    errors += [f"unknown replica type {t}" for t in replicas if t not in ("Master", "Worker")]
    for rtype, r in replicas.items():
        containers = r["template"]["spec"]["containers"]
        if any(not c.get("image") for c in containers):
            errors.append(f"{rtype}: a container without an image")
        if not any(c["name"] == "pytorch" for c in containers):
            errors.append(f"{rtype}: no container named pytorch")
    if "Master" in replicas and replicas["Master"].get("replicas", 1) != 1:
        errors.append("Master replicas must be 1")
    if "Worker" in replicas and replicas["Worker"].get("replicas", 1) < 1:
        errors.append("Worker replicas must be >= 1")
    if "elasticPolicy" in spec:
        if "Worker" not in replicas:
            errors.append("elasticPolicy needs a Worker")
        if "nProcPerNode" in spec["elasticPolicy"] and "nprocPerNode" in spec:
            errors.append("elasticPolicy.nProcPerNode and nprocPerNode are exclusive")
    return errors


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    text = k8s.render(spec_for(case))
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("DDPKIT_UPDATE_GOLDENS") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}; run with DDPKIT_UPDATE_GOLDENS=1 once"
    assert text == golden.read_text(), "rendering changed; review, then DDPKIT_UPDATE_GOLDENS=1"


@pytest.mark.parametrize("case", [c for c in sorted(CASES) if "trainjob" not in c])
def test_pytorchjobs_obey_the_webhook_rules(case: str) -> None:
    job = job_of(docs_for(case))
    assert webhook_errors(job) == []
    broken = copy.deepcopy(job)
    replicas = broken["spec"]["pytorchReplicaSpecs"]
    first = next(iter(replicas.values()))
    first["template"]["spec"]["containers"][0]["name"] = "main"
    replicas["Chief"] = first
    assert len(webhook_errors(broken)) == 3  # the checker itself is not vacuous


def test_static_job_shape() -> None:
    spec = spec_for("default-2x2-pvc")
    pvc, job = docs_for("default-2x2-pvc")
    s = job["spec"]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert s["nprocPerNode"] == "2" and "elasticPolicy" not in s
    assert {t: r["replicas"] for t, r in s["pytorchReplicaSpecs"].items()} == {
        "Master": 1, "Worker": 1}  # fmt: skip
    pod = s["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["name"] == "pytorch"
    assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
    amounts = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}
    assert c["resources"] == {"requests": amounts, "limits": amounts}
    # The node launcher every backend runs; torchrun inside it takes nnodes/rank/master
    # from the injected PET_* variables, not from flags.
    cmd = c["command"] + c["args"]
    assert cmd[:2] == ["bash", "-c"] and 'exec python -m "$launcher"' in cmd[2]
    # [python -m ddpkit.k8s.attempt] flags -- -m ddpkit.train ...: the in-place budget every
    # backend runs; past it, or a pod lost, the operator recreates the pods (ExitCode), and
    # ddpkit.k8s.attempt holds them to backoffLimit (its env names the limit).
    assert cmd[6:] == node_command(spec, bare=True) and "--max-restarts=3" in cmd
    assert {r["restartPolicy"] for r in s["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    assert pod["restartPolicy"] == "Never"  # what the operator sets for ExitCode
    env = {e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env["DDPKIT_POD_RESTART_LIMIT"] == "3" and env["DDPKIT_NODE_NAME"] == "spec.nodeName"
    assert env["POD_UID"] == "metadata.uid"
    i = cmd.index("--")
    assert cmd[i + 1 : i + 3] == ["-m", "ddpkit.train"] and cmd[i + 3 :] == spec.train_argv()
    assert not {"--nnodes", "--node-rank", "--master-addr", "--rdzv-endpoint"} & set(cmd)
    assert cmd[4] == "default-master-0"  # the pod the others wait for
    # /dev/shm in memory; the run dir (checkpoints below it) on the claim, at its own subPath.
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    mounts = {m["name"]: (m["mountPath"], m.get("subPath")) for m in c["volumeMounts"]}
    assert mounts == {"dshm": ("/dev/shm", None),
                      "checkpoints": ("/workspace/runs/default", "runs/default")}  # fmt: skip
    assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert s["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3,
                              "activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 86400}  # fmt: skip
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert pod["terminationGracePeriodSeconds"] > 30  # the SIGTERM save must fit


def test_elastic_gang_job_shape() -> None:
    (job,) = docs_for("gpt-elastic-gang")
    s = job["spec"]
    assert s["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 4,
                                  "maxRestarts": 3}  # fmt: skip
    assert list(s["pytorchReplicaSpecs"]) == ["Worker"]
    assert s["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert s["runPolicy"]["schedulingPolicy"] == {"minAvailable": 1, "queue": "research",
                                                  "priorityClass": "high"}  # fmt: skip
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]  # Volcano's queue
    pod = s["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][0] == "gpt-worker-0"  # the rendezvous host the others wait for
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # no IPC_LOCK: README RDMA
    assert c["resources"]["limits"]["rdma/ib"] == "1"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert pod["schedulerName"] == "volcano" and pod["priorityClassName"] == "high"
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["serviceAccountName"] == "trainer"
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_kueue_label_and_cpu_resources() -> None:
    (job,) = docs_for("mnist-kueue-cpu")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    rp = job["spec"]["runPolicy"]
    assert rp["cleanPodPolicy"] == "All" and "ttlSecondsAfterFinished" not in rp
    assert rp["activeDeadlineSeconds"] == 2 * 86400 and "schedulingPolicy" not in rp
    c = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"cpu": "16"}  # mem=0: no limit; cpu: no GPU
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def test_trainjob_shape() -> None:
    pvc, job = docs_for("default-trainjob")
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    s = job["spec"]
    assert s["runtimeRef"]["name"] == "torch-distributed"
    t = s["trainer"]
    assert (t["numNodes"], t["numProcPerNode"]) == (2, 4)
    assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "4"
    assert not [e for e in t["env"] if e["name"].startswith("PET_")]  # v2 rejects them
    (pod,) = pods_of(job)  # runtimePatches: test_k8s_trainjob.py checks every release's shape
    assert {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]} == {
        "/dev/shm", "/workspace/runs/default"}  # fmt: skip
    assert pod["spec"]["terminationGracePeriodSeconds"] == 60
    assert pod["spec"]["securityContext"]["fsGroup"] == 1000
    assert s["activeDeadlineSeconds"] == 3600


PAYLOADS = [
    "a: b", "#not a comment", "line1\nline2: x\n- y", "{{ name }}", "&anchor", "*alias",
    "!!python/object:os.system", "---\nkind: Secret", "'quoted\"", "${HOME} $(id)", "true", "0x10",
]  # fmt: skip


@pytest.mark.parametrize("payload", PAYLOADS)
def test_user_strings_come_out_literally(payload: str) -> None:
    spec = load_spec(
        None,
        ["k8s.pvc_size=1Gi"],
        train_args=[f"--data-dir={payload}"],  # a flag the trainer's render-time check accepts
    )
    spec.image = f"reg/img:{payload}"
    spec.env = {"NOTE": payload}
    spec.k8s.node_selector = {"example.com/zone": payload}
    spec.k8s.tolerations = [{"key": "k", "operator": "Equal", "value": payload}]
    docs = list(yaml.safe_load_all(k8s.render(spec)))
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "PyTorchJob"]
    pod = docs[1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == f"reg/img:{payload}"
    assert c["args"][-1] == f"--data-dir={payload}"
    assert {"name": "NOTE", "value": payload} in c["env"]
    assert pod["nodeSelector"] == {"example.com/zone": payload}
    assert pod["tolerations"][0]["value"] == payload
    assert "{{" not in c["command"][2]  # the script is fixed text; values are arguments


@pytest.mark.parametrize(
    ("sets", "nodes", "expect"),
    [
        (["name=9lives"], None, "not a DNS-1035 label"),
        ([f"name={'a' * 52}"], 1002, "too long"),
        ([f"name={'a' * 52}", "k8s.api=trainjob"], 1002, "too long"),
        (["env.PET_NNODES=3"], None, "set by the Kubeflow controller"),
        (["k8s.api=trainjob", "k8s.elastic.min=1", "k8s.elastic.max=2"], None, "not supported"),
        (["k8s.elastic.min=2", "k8s.elastic.max=4"], 1, "outside k8s.elastic"),
        (["k8s.elastic.last_call_s=60"], None, "set k8s.elastic.min and max too"),
        (
            ["k8s.elastic.min=1", "k8s.elastic.max=2", "k8s.elastic.last_call_s=0"],
            None,
            "give whole seconds, 1 or more",
        ),  # fmt: skip
        (["k8s.pvc=Bad_Name"], None, "not a Kubernetes object name"),
        (["k8s.namespace=ML"], None, "not a namespace name"),
        (["k8s.pvc_size=lots"], None, "not a Kubernetes quantity"),
        (["image=--privileged"], None, "is not an image reference"),
        ([], 2**31, "is over 2147483647"),
        (["k8s.elastic.min=1", f"k8s.elastic.max={2**31}"], None, "is over 2147483647"),
        (["ckpt_dir=/dev/shm/ckpt"], None, "collides with the mounted /dev/shm"),
        (["ckpt_dir=/workspace"], None, "collides with the mounted /workspace"),
        (["ckpt_dir=/opt/ddpkit/ck"], None, "collides with the mounted /opt/ddpkit"),
        (["train.ckpt_dir=data/ck"], None, "collides with the mounted /workspace/data"),
        (["k8s.secret_env.WANDB_API_KEY=wandb"], None, 'give NAME = "secret/key"'),
        (["env.TOKEN=x", "k8s.secret_env.TOKEN=s/k"], None, "in both env and k8s.secret_env"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, monkeypatch, sets, nodes,
                                                  expect) -> None:  # fmt: skip
    monkeypatch.setattr(launch, "OUT_DIR", tmp_path, raising=False)
    argv = ["render", "k8s", "--write", *[a for s in sets for a in ("--set", s)]]
    if nodes:
        argv += ["--nodes", str(nodes)]
    with pytest.raises(SpecError, match=re.escape(expect)):
        k8s.render(load_spec(REPO / "configs/default.toml", sets, nodes))
    rc = launch.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1 and expect in err
    assert not list(tmp_path.rglob("*.yaml"))


def test_secrets_are_references_never_values() -> None:
    spec = load_spec(None, ["k8s.secret_env.WANDB_API_KEY=wandb/api-key", "k8s.api=trainjob"])
    text = k8s.render(spec)
    env = job_of(list(yaml.safe_load_all(text)))["spec"]["trainer"]["env"]
    ref = {"secretKeyRef": {"name": "wandb", "key": "api-key"}}
    assert {"name": "WANDB_API_KEY", "valueFrom": ref} in env
    assert not [e for e in env if e["name"] == "WANDB_API_KEY" and "value" in e]


def test_rdma_asks_for_an_unlimited_memlock_instead_of_a_useless_ipc_lock() -> None:
    job = job_of(docs_for("gpt-elastic-gang"))  # k8s.rdma = true
    c = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"name": "DDPKIT_REQUIRE_MEMLOCK", "value": "unlimited"} in c["env"]
    assert c["resources"]["limits"]["rdma/ib"] == "1"


def test_the_users_script_is_the_entry_point_of_every_pod() -> None:
    spec = load_spec(REPO / "examples/plain_torchrun/job.toml", ["k8s.pvc=ckpt"], nodes=2)
    (job,) = list(yaml.safe_load_all(k8s.render(spec)))
    for r in job["spec"]["pytorchReplicaSpecs"].values():
        args = r["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--") :] == ["--", "ddp_fit.py",
                                            *spec.args]  # fmt: skip


def test_a_checkpoint_dir_outside_the_run_dir_gets_its_own_path_on_the_same_claim() -> None:
    spec = load_spec(REPO / "configs/default.toml", ["k8s.pvc=shared", "ckpt_dir=/ckpt/a"])
    _, mounts = k8s.volumes(spec)
    on_claim = {m["mountPath"]: m["subPath"] for m in mounts if m["name"] == "checkpoints"}
    assert on_claim == {"/workspace/runs/default": "runs/default", "/ckpt/a": "ckpt/a"}
