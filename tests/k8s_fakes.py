"""An emulation of the Kubeflow PyTorchJob controller (and of Trainer v2's TrainJob on the
torch-distributed runtime: `trainjob_pods`) and the kubelet, for tests.

`pods(job)` applies the controller's rules (facts/kubeflow.md) to a rendered PyTorchJob:
the pod names, and the environment it injects into each replica's `pytorch` container.
`Pod.start()` then runs that container's command + args as local processes, the way a
kubelet would: the env of the pod template (downward API resolved) plus the injected
variables, the container's workingDir and volume mounts mapped into a per-pod directory,
and the PVC shared by every pod. Service names resolve to this machine: the resolver
rewrites `<job>-master-0` / `<job>-worker-N` to 127.0.0.1 where the controller puts them
(MASTER_ADDR, PET_MASTER_ADDR, PET_RDZV_ENDPOINT), instead of editing /etc/hosts.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DEFAULT_PORT = 23456
LOOPBACK = "127.0.0.1"


def _port(container: dict[str, Any]) -> int:
    for p in container.get("ports", []):
        if p.get("name") == "pytorchjob-port":
            return int(p["containerPort"])
    return DEFAULT_PORT


def _pytorch_container(template: dict[str, Any]) -> dict[str, Any]:
    found = [c for c in template["spec"]["containers"] if c["name"] == "pytorch"]
    assert found, "no container named pytorch: the controller would reject the job"
    return found[0]


def _nproc(job: dict[str, Any]) -> int:
    value = str(job["spec"].get("nprocPerNode", "auto"))
    return int(value) if value.isdigit() else 1  # "auto", "cpu", "gpu" count as 1


def controller_env(job: dict[str, Any], rtype: str, index: int) -> dict[str, str]:
    """The variables the PyTorchJob controller adds to a replica's containers."""
    name, spec = job["metadata"]["name"], job["spec"]
    replicas = {t: int(r.get("replicas", 1)) for t, r in spec["pytorchReplicaSpecs"].items()}
    env = {"PYTHONUNBUFFERED": "1"}
    if "Master" in replicas:
        port = _port(_pytorch_container(spec["pytorchReplicaSpecs"]["Master"]["template"]))
        rank = 0 if rtype == "Master" else index + 1
        env |= {
            "MASTER_ADDR": f"{name}-master-0",
            "PET_MASTER_ADDR": f"{name}-master-0",
            "MASTER_PORT": str(port),
            "PET_MASTER_PORT": str(port),
            "WORLD_SIZE": str(sum(replicas.values()) * _nproc(job)),
            "RANK": str(rank),
            "PET_NODE_RANK": str(rank),
        }
    if "nprocPerNode" in spec:
        env["PET_NPROC_PER_NODE"] = str(spec["nprocPerNode"])
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        env["PET_NNODES"] = str(sum(replicas.values()))
        return env
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    host = elastic.get("rdzvHost") or f"{name}-worker-0"
    port = elastic.get("rdzvPort") or _port(_pytorch_container(worker["template"]))
    lo = elastic.get("minReplicas") or elastic.get("maxReplicas") or replicas["Worker"]
    hi = elastic.get("maxReplicas") or lo
    env |= {
        "PET_RDZV_ENDPOINT": f"{host}:{port}",
        "PET_RDZV_BACKEND": elastic.get("rdzvBackend", "c10d"),
        "PET_NNODES": f"{lo}:{hi}",
    }
    if "maxRestarts" in elastic:
        env["PET_MAX_RESTARTS"] = str(elastic["maxRestarts"])
    if "rdzvId" in elastic:
        env["PET_RDZV_ID"] = str(elastic["rdzvId"])
    if elastic.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
    return env


RESOLVED = ("MASTER_ADDR", "PET_MASTER_ADDR", "PET_RDZV_ENDPOINT")  # where hosts are dialled


def resolve(env: dict[str, str], services: set[str]) -> dict[str, str]:
    """Cluster DNS for this machine: a Service name of the job that a process dials (the
    rendezvous variables) becomes 127.0.0.1; POD_NAME and the like stay names."""
    pattern = re.compile(r"^(" + "|".join(map(re.escape, sorted(services))) + r")(?=$|:)")
    return {k: pattern.sub(LOOPBACK, v) if k in RESOLVED else v for k, v in env.items()}


@dataclass
class Pod:
    name: str
    rtype: str
    index: int
    container: dict[str, Any]
    volumes: dict[str, dict[str, Any]]
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    log_paths: list[Path] = field(default_factory=list)

    def workspace(self, root: Path) -> Path:
        return root / "pods" / self.name / self.container["workingDir"].lstrip("/")

    def _mount(self, root: Path) -> None:
        """Volume mounts: the PVC is one directory shared by all pods (a ReadWriteMany
        claim); /dev/shm is this machine's; anything else cannot be emulated here."""
        workdir = self.container["workingDir"]
        for m in self.container.get("volumeMounts", []):
            vol = self.volumes[m["name"]]
            if m["mountPath"] == "/dev/shm":
                assert vol.get("emptyDir", {}).get("medium") == "Memory", vol
                continue
            assert "persistentVolumeClaim" in vol, f"cannot emulate volume {vol}"
            rel = os.path.relpath(m["mountPath"], workdir)
            assert not rel.startswith(".."), f"mount {m['mountPath']} is outside {workdir}"
            shared = root / "pvc" / vol["persistentVolumeClaim"]["claimName"]
            shared = shared / m.get("subPath", "")
            shared.mkdir(parents=True, exist_ok=True)
            link = self.workspace(root) / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(shared, target_is_directory=True)

    def start(self, root: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start (or restart, like restartPolicy OnFailure) the container; logs go to
        root/logs/<pod>.<attempt>.log."""
        self._mount(root)
        cwd = self.workspace(root)
        cwd.mkdir(parents=True, exist_ok=True)
        # The image: this checkout's venv on PATH and the repository as /opt/ddpkit.
        env = {
            "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(cwd),
            "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "",
        }
        env |= self.env | (extra_env or {})
        argv = list(self.container["command"]) + list(self.container.get("args", []))
        log = root / "logs" / f"{self.name}.{len(self.procs)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(proc)
        self.log_paths.append(log)
        return proc

    @property
    def proc(self) -> subprocess.Popen:
        return self.procs[-1]

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.log_paths)

    def kill(self) -> None:
        """SIGKILL every process of the pod (node loss, OOM kill, forced deletion). The
        container's whole process tree: torchrun starts its workers in new sessions."""
        if self.proc.poll() is not None:
            return
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pods(job: dict[str, Any]) -> list[Pod]:
    """The pods the controller creates for a rendered PyTorchJob, env resolved."""
    name = job["metadata"]["name"]
    out: list[Pod] = []
    for rtype in ("Master", "Worker"):  # the only keys the webhook accepts
        rspec = job["spec"]["pytorchReplicaSpecs"].get(rtype)
        if rspec is None:
            continue
        for index in range(int(rspec.get("replicas", 1))):
            pod_name = f"{name}-{rtype.lower()}-{index}"
            template = rspec["template"]
            container = _pytorch_container(template)
            env: dict[str, str] = {}
            for e in container.get("env", []):  # the template's env, downward API resolved
                ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                env[e["name"]] = pod_name if ref == "metadata.name" else e["value"]
            env |= controller_env(job, rtype, index)
            vols = {v["name"]: v for v in template["spec"].get("volumes", [])}
            out.append(Pod(pod_name, rtype, index, container, vols, env))
    services = {p.name for p in out}
    for p in out:
        p.env = resolve(p.env, services)
    return out


def trainjob_pods(job: dict[str, Any], port: int) -> list[Pod]:
    """The pods Trainer v2 makes from a rendered TrainJob (runtimePatches, Trainer 2.2+): the
    runtime's `node` container with the trainer's image/command/args/env/resources and the
    patch's pod fields, and the variables the torch plugin injects (facts/kubeflow.md):
    PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the job completion index), PET_MASTER_ADDR
    (<job>-node-0-0.<job>) and PET_MASTER_PORT (29500 on a cluster; `port` here, so tests
    running side by side do not collide)."""
    name, spec = job["metadata"]["name"], job["spec"]
    trainer = spec["trainer"]
    (patch,) = spec["runtimePatches"]
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node", rjob["name"]  # the runtime's replicated job
    pod_spec = rjob["template"]["spec"]["template"]["spec"]
    (patched,) = [c for c in pod_spec["containers"] if c["name"] == "node"]
    container = {
        "name": "node", "image": trainer["image"], "command": trainer["command"],
        "args": trainer["args"], "workingDir": "/workspace",  # the image's WORKDIR
        "volumeMounts": patched.get("volumeMounts", []),
    }  # fmt: skip
    vols = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out = []
    for rank in range(int(trainer["numNodes"])):
        pod_name = f"{name}-node-0-{rank}"
        env: dict[str, str] = {}
        for e in trainer.get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = pod_name if ref == "metadata.name" else e["value"]
        env |= {
            "PYTHONUNBUFFERED": "1",
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": LOOPBACK,  # <job>-node-0-0.<job> on a cluster: this machine
            "PET_MASTER_PORT": str(port),
        }
        out.append(Pod(pod_name, "node", rank, container, vols, env))
    return out


def wait_all(pods_: list[Pod], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in pods_:
        try:
            codes.append(p.proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in pods_:
                q.kill()
            logs = "\n".join(f"--- {q.name}\n{q.log()[-3000:]}" for q in pods_)
            raise AssertionError(f"pods still running after {timeout}s:\n{logs}") from None
    return codes


def wait_for(predicate: Any, timeout: float, what: str, pods_: list[Pod]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline or any(p.proc.poll() is not None for p in pods_):
            for q in pods_:
                q.kill()
            logs = "\n".join(f"--- {q.name}\n{q.log()[-3000:]}" for q in pods_)
            raise AssertionError(f"never saw {what} within {timeout}s:\n{logs}")
        time.sleep(0.2)


@contextlib.contextmanager
def running(pods_: list[Pod]) -> Iterator[list[Pod]]:
    """Kill whatever is left of the pods when the test ends, passed or not."""
    try:
        yield pods_
    finally:
        for p in pods_:
            if p.procs:
                p.kill()
