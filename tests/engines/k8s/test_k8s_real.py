"""Rendered jobs against a REAL Kubernetes API server with the real Kubeflow controllers and
their validating webhooks (make k8s-up: etcd, kube-apiserver, kube-controller-manager, the
training operator v1.9, JobSet and Trainer v2.3, built from their Go modules). What the
schema checks and the fake API server could only approximate, the real server decides.

The jobs also train: k8s/local/node_agent.py serves two nodes (advertising nvidia.com/gpu)
whose pods run as local processes in their own mount and network namespaces, with
`ddpkit:*` standing for this venv, the PVC for a directory under the state dir."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests import promcheck
from tests.k8s_cluster import VENV, binaries_missing, cluster_env, running_cluster

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = binaries_missing()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("k8s-state")
    # A user's project (test_a_users_own_project_...) whose image `myproj:*` is this venv
    # with the project as its /workspace, as `ddpkit build` derives it from ddpkit's image.
    project = tmp_path_factory.mktemp("myproj")
    images = f"ddpkit:*={VENV} myproj:*={VENV}:{project}"
    # A bridge and pod range of its own, so a developer's `make k8s-up` network stays.
    env = cluster_env(state / "s", images, tag="dkt", net=245, offset=False)
    yield from running_cluster({**env, "DDPKIT_TEST_PROJECT": str(project)})


ELASTIC = ("--set", "k8s.elastic.min=1", "--set", "k8s.elastic.max=2")  # workers only, c10d


def render(cwd: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "ddpkit", "render", "k8s", *args], cwd=cwd,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def server_dry_run(env: dict, manifest: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "apply", "--dry-run=server", "-f", "-"], input=manifest,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ("--nodes", "2", "--gpus", "2"),  # the README's default render (nvidia.com/gpu)
        ("--nodes", "2", *ELASTIC, "--set", "k8s.elastic.last_call_s=60"),
        ("--nodes", "2", "--gpus", "2", "--set", "k8s.api=trainjob"),  # Trainer v2.3
        ("--nodes", "2", "--set", "k8s.pvc_size=10Gi", "--set", "accelerator=cpu"),
        ("--set", "env.A=1e-3", "--set", "env.B=yes", "--", "--lr", "1e-3"),  # YAML 1.2 numbers
        # the lighthouse's Deployment and Service, a replica group per PyTorchJob pod
        ("--nodes", "2", "--set", "fault_tolerance=torchft", "--set", "accelerator=cpu"),
    ],
    ids=["pytorchjob", "elastic", "trainjob-2.3", "pvc-cpu", "number-like-values", "torchft"],
)
def test_the_real_server_and_webhooks_accept_what_render_prints(cluster, tmp_path, args):
    r = server_dry_run(cluster, render(tmp_path, *args))
    assert r.returncode == 0, r.stderr
    assert "created (server dry run)" in r.stdout


# What users type that a YAML reader may take for a number, boolean, null or date.
TYPED = ["1e-3", "1E5", ".5", "0755", "0o17", "0x1F", "1_000", "1:30", "yes", "off", "y", "N",
         "null", "~", "", "2024-01-01", "2024-1-2", ".inf", "<<", "a\x85b", "x\u2028y"]  # fmt: skip


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_a_users_flags_and_env_values_reach_the_real_server_as_typed(cluster, tmp_path, api):
    """`ddpkit render k8s -- --lr 1e-3 | kubectl apply`: the server takes every value a user
    types as the string it is (its reader is go-yaml v2 then JSON) and stores it unchanged."""
    (tmp_path / "train.py").write_text("import sys\nprint(sys.argv)\n")
    (tmp_path / "ddpkit.toml").write_text('name = "typed"\nscript = "train.py"\n')
    sets = [a for i, v in enumerate(TYPED) for a in ("--set", f"env.V{i}={v}")]
    flags = [a for v in TYPED for a in ("--x", v)]
    manifest = render(tmp_path, "--set", f"k8s.api={api}", *sets, "--", *flags)
    r = subprocess.run(["kubectl", "apply", "--dry-run=server", "-o", "json", "-f", "-"],
                       input=manifest, env=cluster, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    obj = obj["items"][-1] if obj.get("kind") == "List" else obj
    if api == "trainjob":
        c = obj["spec"]["trainer"]
    else:
        (c,) = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    assert c["args"][-len(flags) :] == flags
    env = {e["name"]: e.get("value", "") for e in c["env"]}
    assert [env[f"V{i}"] for i in range(len(TYPED))] == TYPED


@pytest.mark.parametrize("version", ["2.0", "2.1"])
def test_a_trainjob_shaped_for_another_trainer_release_is_refused_by_the_real_server(
    cluster, tmp_path, version
):
    manifest = render(
        tmp_path, "--set", "k8s.api=trainjob", "--set", f"k8s.trainer_version={version}"
    )
    r = server_dry_run(cluster, manifest)
    assert r.returncode != 0 and "unknown field" in r.stderr, r.stdout + r.stderr


def test_submit_refuses_a_trainjob_for_another_release_in_one_line_and_creates_nothing(
    cluster, tmp_path
):
    """submit reads the real server's TrainJob CRD (Trainer 2.3: runtimePatches) and refuses
    a job shaped for 2.1 before anything is created, naming the setting to pass."""
    args = ("submit", "k8s", "--set", "k8s.api=trainjob", "--set", "k8s.trainer_version=2.1",
            "--set", "name=old", "--set", "k8s.pvc_size=1Gi")  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "ddpkit", *args], cwd=tmp_path, env=cluster,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "k8s.trainer_version=2.3" in r.stderr, r.stderr
    for kind in ("trainjob/old", "pvc/old-ckpt"):
        got = subprocess.run(["kubectl", "get", kind], env=cluster, capture_output=True)
        assert got.returncode != 0, kind


def test_the_webhook_refuses_what_render_refuses_first(cluster, tmp_path):
    """A name the PyTorchJob webhook denies (a leading digit) is refused by render too, in
    one line, before anything reaches a server."""
    r = subprocess.run([sys.executable, "-m", "ddpkit", "render", "k8s", "--set", "name=1bad"],
                       cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "DNS-1035" in r.stderr
    good = render(tmp_path, "--nodes", "2").replace("name: default", "name: 1bad")
    denied = server_dry_run(cluster, good)
    assert denied.returncode != 0 and "denied the request" in denied.stderr, denied.stderr


# ---- jobs that train -------------------------------------------------------------------
# 2 nodes x 2 processes, short enough for 2 busy cores; the rendered PVC is mounted at the run
# dir (subPath runs/<name>), so summary.json and the checkpoints below it land on the volume.
STEPS = 200
# A job struck from outside once step 40 is logged steps at 0.1 s (DDPKIT_STEP_PACE_S, mostly
# asleep), so the strike has 16 s to land: unpaced, the 200 steps took 3-10 s, and under load the
# job could end before the strike (it then ran through with no restart).
PACED = ("--set", "env.DDPKIT_STEP_PACE_S=0.1")
# A job whose pod the test deletes once `kubectl logs` shows step 40: 0.25 s a step leaves 40 s.
# At 0.1 s the deletion came after the job had finished in a CI run on a loaded machine (the
# log polls took that long), and the job ran through with no restart.
DELETED = ("--set", "env.DDPKIT_STEP_PACE_S=0.25")


def tiny(name: str, *extra: str, steps: int = STEPS) -> list[str]:
    return ["--nodes", "2", "--gpus", "2", "--set", f"name={name}", "--set", "k8s.pvc_size=1Gi",
            "--set", f"train.steps={steps}",
            "--set", "train.ckpt_interval=100", "--set", "train.log_interval=10", *extra]  # fmt: skip


def ddpkit(env: dict, cwd: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddpkit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def kubectl(env: dict, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=input, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def wait_until(what: str, pred, timeout: float, env: dict, poll_s: float = 1.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            pods = kubectl(env, "get", "pods", "-o", "wide").stdout
            agent = (Path(env["DDPKIT_K8S_STATE"]) / "logs" / "node-agent.log").read_text()
            pytest.fail(f"{what} not after {timeout}s\n{pods}\n{agent[-3000:]}")
        time.sleep(poll_s)


def finished(env: dict, kind: str, name: str) -> str | None:
    r = kubectl(env, "get", kind, name, "-o", "json")
    conds = (
        json.loads(r.stdout).get("status", {}).get("conditions", []) if r.returncode == 0 else []
    )
    done = [c["type"] for c in conds if c["status"] == "True"]
    done = [t for t in done if t in ("Succeeded", "Complete", "Failed")]
    return done[0] if done else None


def summary(env: dict, name: str) -> dict:
    """Job `name`'s summary.json on its claim's volume (the node agent's directory for it)."""
    claim = Path(env["DDPKIT_K8S_STATE"]) / "node" / "pvc" / "default" / f"{name}-ckpt"
    return json.loads((claim / "runs" / name / "summary.json").read_text())


WORLD = "world: 4 ranks (2 nodes x 2 processes), backend gloo on cpu, DDP"


SG_STEPS = 400  # the shrinking job's: its group of 2 trains on while the other worker is away


def pod_logs(env: dict, pod: str) -> str:
    """Every run of pod `pod` (its recreations and in-place restarts) as the node agent wrote
    them: kubectl logs shows the current container's run only."""
    pods = Path(env["DDPKIT_K8S_STATE"]) / "node" / "pods"
    return "".join(f.read_text() for f in sorted(pods.glob(f"default_{pod}_*/pytorch.log")))


def pod_starts(env: dict, pod: str) -> list[int]:
    """The pids of pod `pod`'s container starts, in order (the node agent's log): each runs in
    a process group of its own."""
    agent = (Path(env["DDPKIT_K8S_STATE"]) / "logs" / "node-agent.log").read_text()
    return [int(m) for m in re.findall(rf"{pod}/pytorch: started .*\(pid (\d+)\)", agent)]


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """Five jobs started at once (most of a job's minute is waiting, not computing): the
    README's way in, `ddpkit render k8s --nodes 2 --gpus 2 | kubectl apply -f -` (ref); the
    same as a TrainJob through `ddpkit submit` (tj); one whose worker pod is deleted once it
    trains (cut); two elastic ones (workers only, c10d rendezvous on worker-0) whose second
    worker is deleted: el, whose rendezvous waits 120 s for the recreated worker, and sg,
    whose rendezvous waits 10 s and whose recreated worker is held (SIGSTOP, standing in for a
    pod slow to come back: an image pull, a busy node) until worker-0 trains on in a group
    of its own. Name -> its workspace; "deleted" lists the pods deleted, "held" the recreated
    pods held and "thawed" (a bool) whether sg's worker-0 trained alone while it was held."""
    out: dict = {name: tmp_path_factory.mktemp(name) for name in ("ref", "tj", "cut", "el", "sg")}
    out["deleted"], out["held"] = [], []
    r = ddpkit(cluster, out["ref"], "render", "k8s", *tiny("ref"))
    assert r.returncode == 0, r.stderr
    assert "nvidia.com/gpu: '2'" in r.stdout  # the default render asks for GPUs
    applied = kubectl(cluster, "apply", "-f", "-", input=r.stdout)
    assert applied.returncode == 0, applied.stderr
    elastic = (*ELASTIC, *PACED)  # struck
    for name, args in (
        ("tj", tiny("tj", "--set", "k8s.api=trainjob")),
        ("cut", tiny("cut", *DELETED, "--set", f"metrics_port={METRICS_PORT}")),
        ("el", tiny("el", *elastic, "--set", "k8s.elastic.last_call_s=120")),
        ("sg", tiny("sg", *elastic, "--set", "k8s.elastic.last_call_s=10", steps=SG_STEPS)),
    ):
        sub = ddpkit(cluster, out[name], "submit", "k8s", *args)
        assert sub.returncode == 0 and f"/{name} in namespace" in sub.stdout, (
            sub.stdout + sub.stderr
        )

    def delete_once_training(rank0: str, victim: str, steps: int = STEPS) -> bool:
        end = time.monotonic() + 540
        while time.monotonic() < end:
            if f" 40/{steps} " in kubectl(cluster, "logs", rank0).stdout:
                if rank0 == "cut-master-0":  # its metrics endpoint, as Prometheus scrapes it
                    out["scraped"] = scrape(cluster, rank0, METRICS_PORT)
                if kubectl(cluster, "delete", "pod", victim, "--wait=false").returncode == 0:
                    out["deleted"].append(victim)
                    return True
                return False
            time.sleep(0.5)
        return False

    def hold_the_recreated_worker() -> None:
        """sg: delete worker-1 at step 40; freeze its recreated pod as it starts, until
        worker-0's group has formed without it (or 180 s)."""
        if not delete_once_training("sg-worker-0", "sg-worker-1", SG_STEPS):
            return
        end = time.monotonic() + 180
        while len(starts := pod_starts(cluster, "sg-worker-1")) < 2:
            if time.monotonic() > end:
                return
            time.sleep(0.1)
        pgid = starts[1]
        os.killpg(pgid, signal.SIGSTOP)
        out["held"].append("sg-worker-1")
        try:
            while time.monotonic() < end:  # worker-0's group of 2 resumed and logged a step
                log = pod_logs(cluster, "sg-worker-0")
                shrunk = log.find("world size 4 -> 2")
                if shrunk >= 0 and "\nstep " in log[shrunk:]:
                    out["thawed"] = True
                    break
                time.sleep(0.2)
        finally:
            os.killpg(pgid, signal.SIGCONT)

    watchers = [
        threading.Thread(target=delete_once_training, args=pods, daemon=True)
        for pods in (("cut-master-0", "cut-worker-0"), ("el-worker-0", "el-worker-1"))
    ]
    watchers.append(threading.Thread(target=hold_the_recreated_worker, daemon=True))
    for w in watchers:
        w.start()
    yield out
    for w in watchers:
        w.join(timeout=1)


def test_kubectl_apply_of_the_default_render_trains_world_4_on_gpu_nodes(cluster, jobs):
    wait_until("PyTorchJob ref finished", lambda: finished(cluster, "pytorchjob", "ref"), 600,
               cluster)  # fmt: skip
    assert finished(cluster, "pytorchjob", "ref") == "Succeeded"
    summ = summary(cluster, "ref")
    gpus = kubectl(cluster, "get", "nodes", "-o",
                   "jsonpath={.items[*].status.allocatable.nvidia\\.com/gpu}").stdout.split()  # fmt: skip
    assert gpus == ["8", "8"]  # the nodes advertise GPUs; the pods train on the CPU
    assert summ["world_size"] == 4 and summ["steps"] == STEPS and summ["backend"] == "gloo"
    log = kubectl(cluster, "logs", "ref-master-0").stdout
    assert WORLD in log, log[-2000:]
    st = ddpkit(cluster, jobs["ref"], "status", "k8s", "ref")
    assert st.returncode == 0 and "Succeeded=True" in st.stdout, st.stdout + st.stderr
    assert "pod ref-master-0: Succeeded" in st.stdout, st.stdout
    logs = ddpkit(cluster, jobs["ref"], "logs", "k8s", "ref")
    assert logs.returncode == 0 and f"[ref-master-0] {WORLD}" in logs.stdout, logs.stderr
    # --follow: the watch API and the node's log stream; it returns once the job has ended.
    # (Only pods still there: cleanPodPolicy Running lets the operator delete a worker that
    # was still exiting when the master's success ended the job.)
    follow = ddpkit(cluster, jobs["ref"], "logs", "k8s", "ref", "--follow")
    assert follow.returncode == 0 and f"[ref-master-0] {WORLD}" in follow.stdout, follow.stderr
    listed = ddpkit(cluster, jobs["ref"], "list", "k8s")  # every ddpkit job, both kinds
    assert listed.returncode == 0 and "ref\tPyTorchJob\tSucceeded\t" in listed.stdout, listed
    assert "tj\tTrainJob\t" in listed.stdout, listed.stdout


def test_a_trainjob_submitted_to_trainer_2_3_trains_world_4(cluster, jobs):
    wait_until("TrainJob tj finished", lambda: finished(cluster, "trainjob", "tj"), 600, cluster)
    assert finished(cluster, "trainjob", "tj") == "Complete"
    assert summary(cluster, "tj")["world_size"] == 4
    logs = ddpkit(cluster, jobs["tj"], "logs", "k8s")  # the job submitted from there
    assert logs.returncode == 0 and WORLD in logs.stdout, logs.stdout[-2000:] + logs.stderr
    st = ddpkit(cluster, jobs["tj"], "status", "k8s")
    assert "TrainJob default/tj" in st.stdout and "Complete=True" in st.stdout, st.stdout


METRICS_PORT = 9400  # cut's metrics endpoint (issue 55)


def scrape(env: dict, pod: str, port: int) -> str:
    """The pod's metrics endpoint from this host (its IP on the node agent's bridge)."""
    ip = kubectl(env, "get", "pod", pod, "-o", "jsonpath={.status.podIP}").stdout.strip()
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10) as r:
            return r.read().decode()
    except OSError as e:
        return f"# no scrape of {ip}:{port}: {e}"


def test_the_cut_job_s_prometheus_figures_agree_with_its_goodput_and_summary(cluster, jobs):
    """metrics_port: the master pod announces its endpoint (annotations, a port named
    metrics), serves the running job's figures, and the run leaves them on the claim, equal to
    its goodput.json and summary.json (tests/promcheck.py) after a deleted pod's restart."""
    wait_until("PyTorchJob cut finished", lambda: finished(cluster, "pytorchjob", "cut"), 600,
               cluster)  # fmt: skip
    pod = json.loads(kubectl(cluster, "get", "pod", "cut-master-0", "-o", "json").stdout)
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == "9400"
    (c,) = pod["spec"]["containers"]
    assert {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"} in c["ports"]
    live = promcheck.families(jobs.get("scraped", "# never scraped"))
    assert "ddpkit_step" in live, jobs.get("scraped")
    assert 40 <= promcheck.value(live, "ddpkit_step") < STEPS
    assert promcheck.value(live, "ddpkit_steps_planned") == STEPS
    run_dir = Path(cluster["DDPKIT_K8S_STATE"]) / "node" / "pvc" / "default" / "cut-ckpt"
    run_dir = run_dir / "runs" / "cut"
    final = promcheck.families((run_dir / "metrics.prom").read_text())
    promcheck.assert_agrees(final, run_dir)
    assert sum(s.value for s in final["ddpkit_failures"].samples) >= 1  # the deleted pod


def test_a_deleted_pod_saves_on_sigterm_and_the_job_resumes_to_the_same_weights(cluster, jobs):
    wait_until("PyTorchJob cut finished", lambda: finished(cluster, "pytorchjob", "cut"), 600,
               cluster)  # fmt: skip
    assert "cut-worker-0" in jobs["deleted"], "cut-worker-0 was never deleted while training"
    assert finished(cluster, "pytorchjob", "cut") == "Succeeded"
    summ = summary(cluster, "cut")
    # Saved at the step SIGTERM stopped it (on a loaded machine that may be the periodic
    # save's step 100: then that one is kept), and resumed from there.
    step = int(str(summ["resumed_from"]).rsplit("-", 1)[-1])
    assert 40 <= step < STEPS, summ["resumed_from"]
    # Both pods were recreated (restartPolicy ExitCode): the node agent's log files keep
    # every pod's runs; `kubectl logs` shows the new pod's only.
    pods = Path(cluster["DDPKIT_K8S_STATE"]) / "node" / "pods"
    log = "".join(f.read_text() for f in pods.glob("default_cut-master-0*/pytorch.log"))
    assert f"SIGTERM received: saving a checkpoint at step {step}" in log, log[-3000:]
    wait_until("PyTorchJob ref finished", lambda: finished(cluster, "pytorchjob", "ref"), 600,
               cluster)  # fmt: skip
    assert summ["param_digest"] == summary(cluster, "ref")["param_digest"]


def test_an_elastic_job_recovers_from_a_deleted_worker_to_the_same_weights(cluster, jobs):
    """torchrun on worker-0 re-forms the rendezvous when worker-1 goes (its pod is not
    restarted: --max-restarts at the torchrun level); the recreated worker-1 joins within
    the rendezvous' last call (k8s.elastic.last_call_s=120), and the world of 4 resumes from
    the SIGTERM save to the uninterrupted run's weights. (With torchrun's own 30 s, a
    recreated pod slower than that finds worker-0 training in a group of 2, and the weights
    differ: CI saw it once under load; test_an_elastic_job_trains_on_without_a_worker...)"""
    wait_until("PyTorchJob el finished", lambda: finished(cluster, "pytorchjob", "el"), 600,
               cluster)  # fmt: skip
    assert "el-worker-1" in jobs["deleted"], "el-worker-1 was never deleted while training"
    assert finished(cluster, "pytorchjob", "el") == "Succeeded"
    summ = summary(cluster, "el")
    step = int(str(summ["resumed_from"]).rsplit("-", 1)[-1])
    assert 40 <= step < STEPS and summ["world_size"] == 4, summ["resumed_from"]
    logs = pod_logs(cluster, "el-worker-0") + pod_logs(cluster, "el-worker-1")
    worlds = re.findall(r"^world: (\d+) ranks", logs, re.M)
    assert set(worlds) == {"4"}, f"worlds {worlds}; resumes {re.findall('resumed from .*', logs)}"
    wait_until("PyTorchJob ref finished", lambda: finished(cluster, "pytorchjob", "ref"), 600,
               cluster)  # fmt: skip
    assert summ["param_digest"] == summary(cluster, "ref")["param_digest"]
    # Rank 0 after the new rendezvous may be either pod, and the operator may already have
    # removed the other: the node agent's log files outlive the pods.
    assert f"resumed from runs/el/checkpoints/step-{step} at step {step}" in logs, logs[-3000:]


def test_an_elastic_job_trains_on_without_a_worker_slow_to_return_and_grows_back(cluster, jobs):
    """sg: worker-1 deleted at step 40 and its recreated pod held; worker-0's rendezvous
    (last call 10 s) starts a group of 2 from the SIGTERM save (global batch 256 -> 128), and
    when worker-1 comes, torchrun stops that group (a SIGTERM save at step M) and the world of
    4 resumes from step M to the end. (A worker-1 that starts more than 10 s after worker-0
    makes the same shrink at start-up, grown back at step 0: CI's load can do that.)"""
    wait_until("PyTorchJob sg finished", lambda: finished(cluster, "pytorchjob", "sg"), 600,
               cluster)  # fmt: skip
    assert jobs["held"] == ["sg-worker-1"], f"deleted {jobs['deleted']}, held {jobs['held']}"
    logs = pod_logs(cluster, "sg-worker-0") + pod_logs(cluster, "sg-worker-1")
    tail = logs[-3000:]
    assert jobs.get("thawed"), "worker-0 never trained in a group of its own\n" + tail
    assert finished(cluster, "pytorchjob", "sg") == "Succeeded", tail
    # The resumes after the deletion, in the order of their steps (rank 0 of a group may be
    # on either pod).
    resumes = re.findall(r"resumed from runs/sg/checkpoints/step-(\d+) at step \d+.*?"
                         r"world size (\d) -> (\d): global batch (\d+) -> (\d+)", logs)  # fmt: skip
    resumes = sorted((r for r in resumes if int(r[0]) >= 40), key=lambda r: int(r[0]))
    assert [r[1:] for r in resumes] == [("4", "2", "256", "128"), ("2", "4", "128", "256")], tail
    shrunk_at, grown_at = int(resumes[0][0]), int(resumes[1][0])
    assert shrunk_at < grown_at < SG_STEPS, resumes  # the group of 2 trained steps
    summ = summary(cluster, "sg")
    assert summ["world_size"] == 4 and summ["steps"] == SG_STEPS
    assert summ["resumed_from"] == f"runs/sg/checkpoints/step-{grown_at}"
    assert f"done: {SG_STEPS} steps" in logs


def test_cancel_deletes_a_running_job_and_its_pods(cluster, tmp_path):
    r = ddpkit(cluster, tmp_path, "submit", "k8s", *tiny("gone", "--set", "train.steps=100000"))
    assert r.returncode == 0, r.stdout + r.stderr

    def running() -> bool:
        phase = kubectl(cluster, "get", "pod", "gone-master-0", "-o", "jsonpath={.status.phase}")
        return phase.stdout == "Running"

    wait_until("gone-master-0 runs", running, 240, cluster)
    # The same job again: the server's dry run answers AlreadyExists, in one line.
    again = ddpkit(cluster, tmp_path, "submit", "k8s", *tiny("gone"))
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert again.stderr.startswith("error: PyTorchJob gone: already exists"), again.stderr
    assert "cancel k8s gone -n default" in again.stderr, again.stderr
    c = ddpkit(cluster, tmp_path, "cancel", "k8s")
    assert c.returncode == 0 and "deleted pytorchjob/gone" in c.stdout, c.stdout + c.stderr

    def gone() -> bool:
        pods = kubectl(cluster, "get", "pods", "-l", "training.kubeflow.org/job-name=gone",
                       "-o", "name").stdout  # fmt: skip
        return not pods.strip() and kubectl(cluster, "get", "pytorchjob", "gone").returncode != 0

    wait_until("job and pods deleted", gone, 120, cluster)
    assert kubectl(cluster, "get", "pvc", "gone-ckpt").returncode == 0  # the claim stays
    st = ddpkit(cluster, tmp_path, "status", "k8s", "gone")
    assert st.returncode == 2 and "not found" in st.stderr and "Traceback" not in st.stderr


def test_submit_refuses_a_missing_secret_or_namespace_in_one_line_and_creates_nothing(
    cluster, tmp_path
):
    """submit reads the real Secret's key names (never a value) and the namespace before it
    creates anything."""
    sets = ("--set", "name=sec", "--set", "k8s.pvc_size=1Gi",
            "--set", "k8s.secret_env.WANDB_API_KEY=wandb/api-key")  # fmt: skip
    r = ddpkit(cluster, tmp_path, "submit", "k8s", *sets)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Secret 'wandb' does not exist in namespace 'default'" in r.stderr
    assert "kubectl create secret generic wandb -n default --from-literal=api-key=" in r.stderr
    made = kubectl(cluster, "create", "secret", "generic", "wandb", "--from-literal=token=s3cr3t")
    assert made.returncode == 0, made.stderr
    try:
        r = ddpkit(cluster, tmp_path, "submit", "k8s", *sets)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "has no key api-key (it has: token)" in r.stderr and "s3cr3t" not in r.stderr
    finally:
        kubectl(cluster, "delete", "secret", "wandb")
    r = ddpkit(cluster, tmp_path, "submit", "k8s", "--set", "name=sec", "--set",
               "k8s.namespace=nope")  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "namespace 'nope' does not exist" in r.stderr, r.stderr
    for kind in ("pytorchjob/sec", "pvc/sec-ckpt"):
        assert kubectl(cluster, "get", kind).returncode != 0, kind


# ---- the user's own project as the pods' image ---------------------------------------------
USER_TRAIN_PY = '''\
"""The user's own plain DDP script: it knows nothing of ddpkit."""
import argparse, json, os, socket
import torch, torch.distributed as dist
from helpers import MARKER, out_path  # the project's own module, next to this script

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
ranks = torch.tensor([float(rank)])
dist.all_reduce(ranks)
print(f"{MARKER} rank {rank}/{world} on {socket.gethostname()} ran {os.path.abspath(__file__)}"
      f" for {args.steps} steps", flush=True)
if rank == 0:
    json.dump({"world_size": world, "rank_sum": ranks.item(), "steps": args.steps,
               "script": os.path.abspath(__file__)}, open(out_path(), "w"))
dist.destroy_process_group()
'''
USER_HELPERS_PY = (
    'MARKER = "myproj-train-py:"\n\n'
    "def out_path():\n"
    '    return "runs/myproj/result.json"  # the run dir: the job\'s claim is mounted there\n'
)
USER_JOB = """\
name = "myproj"
image = "myproj:1"
script = "train.py"
args = ["--steps", "7"]
[k8s]
pvc_size = "1Gi"
"""


def test_a_users_own_project_and_image_run_as_the_pods_container(cluster):
    """A project of the user's own (train.py, a module it imports, ddpkit.toml naming the
    image `myproj:1` its `ddpkit build` would push), rendered by the installed `ddpkit`
    from the project dir and applied with kubectl: the pods run that image (the node agent
    maps `myproj:*` to this venv with the project as /workspace) and the project's script,
    not the kit's trainer, trains in a world of 4."""
    project = Path(cluster["DDPKIT_TEST_PROJECT"])
    (project / "train.py").write_text(USER_TRAIN_PY)
    (project / "helpers.py").write_text(USER_HELPERS_PY)
    (project / "ddpkit.toml").write_text(USER_JOB)
    r = subprocess.run([str(DDPKIT), "render", "k8s", "--nodes", "2", "--gpus", "2"],
                       cwd=project, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "image: myproj:1" in r.stdout and "- train.py" in r.stdout, r.stdout
    applied = kubectl(cluster, "apply", "-f", "-", input=r.stdout)
    assert applied.returncode == 0, applied.stderr
    wait_until("PyTorchJob myproj finished", lambda: finished(cluster, "pytorchjob", "myproj"),
               600, cluster)  # fmt: skip
    assert finished(cluster, "pytorchjob", "myproj") == "Succeeded"
    images = kubectl(cluster, "get", "pods", "-l", "training.kubeflow.org/job-name=myproj", "-o",
                     "jsonpath={.items[*].spec.containers[*].image}").stdout.split()  # fmt: skip
    # The master's pod at least (the operator may have deleted a worker still exiting at
    # the job's end; the node agent's log files below outlive the pods).
    assert images and set(images) == {"myproj:1"}, images
    claim = Path(cluster["DDPKIT_K8S_STATE"]) / "node" / "pvc" / "default" / "myproj-ckpt"
    result = json.loads((claim / "runs" / "myproj" / "result.json").read_text())
    # Ranks 0..3 all reduced: the script's own world, from the project's copy in /workspace.
    assert result == {"world_size": 4, "rank_sum": 6.0, "steps": 7,
                      "script": "/workspace/train.py"}, result  # fmt: skip
    pods = Path(cluster["DDPKIT_K8S_STATE"]) / "node" / "pods"
    logs = "".join(f.read_text() for f in pods.glob("default_myproj-*/pytorch.log"))
    for rank in range(4):
        assert f"myproj-train-py: rank {rank}/4 " in logs, logs[-3000:]
    assert "ran /workspace/train.py for 7 steps" in logs
    assert WORLD not in logs and not (claim / "runs" / "myproj" / "summary.json").exists()
