"""Progress in the TrainJob's own status, on the real local Trainer controller (v2.3.0) with
its TrainJobStatus feature on (k8s/local/up.sh): the controller gives the pods its status
server, the kit's trainer and a user's script (with `trainjob_status.progress`) post to it,
and `kubectl get trainjob` shows `status.trainerStatus` moving while they run and their
final state at the end. A job whose endpoint is a closed port trains to the end as before,
with one warning line.

Three one-pod jobs at once, their steps paced asleep (most of their time is waiting): tjk
(the kit's trainer, a TrainJob), tju (a user's project and image, a TrainJob) and tjx (the
kit's trainer in a PyTorchJob, where Trainer injects nothing, with the endpoint set by hand
to a closed port)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.k8s_cluster import VENV, binaries_missing, cluster_env, running_cluster

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
KIT_STEPS, USER_STEPS, CLOSED_STEPS = 50, 32, 40
WARNING = "warning: TrainJob status not posted to"

USER_TRAIN_PY = '''\
"""A user's own loop: no torch, one call per step for the TrainJob's status."""
import sys, time
from ddpkit.train import trainjob_status

total = int(sys.argv[1])
for step in range(1, total + 1):
    time.sleep(0.5)  # the step's work
    shown = trainjob_status.progress(step, total, loss=1.0 / step, samples_per_s=128)
print(f"user script: {total} steps, status endpoint there: {shown}", flush=True)
'''
USER_JOB = f"""\
name = "tju"
image = "tjsproj:1"
script = "train.py"
args = ["{USER_STEPS}"]
nodes = 1
nproc_per_node = 1
[k8s]
api = "trainjob"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = binaries_missing()
    if reason:
        pytest.skip(reason)
    project = tmp_path_factory.mktemp("tjsproj")
    (project / "train.py").write_text(USER_TRAIN_PY)
    (project / "ddpkit.toml").write_text(USER_JOB)
    state = tmp_path_factory.mktemp("k8s-state")
    env = cluster_env(state / "s", f"ddpkit:*={VENV} tjsproj:*={VENV}:{project}", tag="dks",
                      net=244, nodes=1)  # fmt: skip
    yield from running_cluster({**env, "TJS_PROJECT": str(project)})


def ddpkit(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DDPKIT), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def kit(name: str, steps: int, pace_s: float, *extra: str) -> list[str]:
    return ["--nodes", "1", "--gpus", "1", "--set", f"name={name}",
            "--set", f"train.steps={steps}", "--set", "train.log_interval=4",
            "--set", f"env.DDPKIT_STEP_PACE_S={pace_s}", *extra]  # fmt: skip


def pod_log(env: dict, job: str) -> str:
    """Every container run of the job's pods, as the node agent wrote them."""
    pods = Path(env["DDPKIT_K8S_STATE"]) / "node" / "pods"
    return "".join(f.read_text() for f in sorted(pods.glob(f"default_{job}-*/*.log")))


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Submit the three jobs, then read both TrainJobs every 0.5 s (the API, as kubectl get
    does) until all three have finished: name -> the trainerStatus values seen while the
    job ran (no Complete/Failed condition yet), and its last object."""
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(cluster["KUBECONFIG"]))
    builtin = tmp_path_factory.mktemp("builtin")
    submitted = [
        ddpkit(cluster, builtin, "submit", "k8s",
               *kit("tjk", KIT_STEPS, 0.4, "--set", "k8s.api=trainjob")),
        ddpkit(cluster, Path(cluster["TJS_PROJECT"]), "submit", "k8s"),
        ddpkit(cluster, builtin, "submit", "k8s", *kit(
            "tjx", CLOSED_STEPS, 0.25, "--set", "env.KUBEFLOW_TRAINER_SERVER_URL=https://"
            "127.0.0.1:9/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/tjx/status")),
    ]  # fmt: skip
    for r in submitted:
        assert r.returncode == 0, r.stdout + r.stderr
    seen: dict[str, list[dict]] = {"tjk": [], "tju": []}
    last: dict[str, dict] = {}

    def ended(obj: dict) -> bool:
        conds = obj.get("status", {}).get("conditions", [])
        return any(c["type"] in ("Complete", "Failed", "Succeeded") and c["status"] == "True"
                   for c in conds)  # fmt: skip

    end = time.monotonic() + 600
    while time.monotonic() < end:
        for name in seen:
            obj = api.get_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", "default", "trainjobs", name
            )
            last[name] = obj
            st = obj.get("status", {}).get("trainerStatus")
            if st and not ended(obj):
                seen[name].append(st)
        pj = api.get_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", "tjx")
        last["tjx"] = pj
        if all(ended(o) for o in last.values()):
            break
        time.sleep(0.5)
    return {"seen": seen, "last": last}


def _metrics(status: dict) -> dict[str, str]:
    return {m["name"]: m["value"] for m in status["metrics"]}


def _moved(statuses: list[dict]) -> list[int]:
    """The distinct progress values seen while the job ran, in the order seen (the last may
    be the final 100: the pod posts it before it exits, so before the job is Complete)."""
    out: list[int] = []
    for st in statuses:
        p = st.get("progressPercentage")
        if p is not None and (not out or out[-1] != p):
            out.append(p)
    return out


def test_the_kits_trainer_shows_progress_eta_and_goodput_in_the_trainjob_status(cluster, runs):
    obj = runs["last"]["tjk"]
    assert any(c["type"] == "Complete" and c["status"] == "True"
               for c in obj["status"]["conditions"]), obj["status"]  # fmt: skip
    moved = _moved(runs["seen"]["tjk"])
    assert len([p for p in moved if p < 100]) >= 2 and moved == sorted(moved), moved
    running = [_metrics(st) for st in runs["seen"]["tjk"] if st.get("progressPercentage") != 100]
    assert {m["state"] for m in running} == {"training"}
    assert all("loss" in m and "samples_per_s" in m for m in running), running
    assert any("estimatedRemainingSeconds" in st for st in runs["seen"]["tjk"])
    final = obj["status"]["trainerStatus"]
    m = _metrics(final)
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    assert m["state"] == "finished" and m["step"] == m["total_steps"] == str(KIT_STEPS), m
    assert 0 < float(m["goodput"]) <= 1 and m["failures"] == "0", m
    log = pod_log(cluster, "tjk")
    assert f"step {KIT_STEPS:>6}/{KIT_STEPS} loss {float(m['loss']):.4f}" in log, log[-2000:]
    assert WARNING not in log


def test_a_users_script_shows_its_progress_with_one_call(cluster, runs):
    obj = runs["last"]["tju"]
    assert any(c["type"] == "Complete" and c["status"] == "True"
               for c in obj["status"]["conditions"]), obj["status"]  # fmt: skip
    moved = _moved(runs["seen"]["tju"])
    assert len([p for p in moved if p < 100]) >= 2 and moved == sorted(moved), moved
    final = obj["status"]["trainerStatus"]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    # The script's own metrics, and what the run dir's records say (no goodput figure: the
    # script notes no steps; its attempt and no failure).
    assert _metrics(final) == {"state": "finished", "step": str(USER_STEPS),
                               "total_steps": str(USER_STEPS), "loss": f"{1 / USER_STEPS:.6g}",
                               "samples_per_s": "128", "attempts": "1", "failures": "0",
                               "lost_s": "0"}  # fmt: skip
    log = pod_log(cluster, "tju")
    assert f"user script: {USER_STEPS} steps, status endpoint there: True" in log, log[-2000:]


def test_an_unreachable_endpoint_leaves_training_untouched(cluster, runs):
    """tjx's endpoint is a closed port: the job trains every step and succeeds, and its log
    has the one warning line (the failed posts after it are quiet)."""
    conds = runs["last"]["tjx"]["status"]["conditions"]
    assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in conds), conds
    log = pod_log(cluster, "tjx")
    assert f"step {CLOSED_STEPS:>6}/{CLOSED_STEPS} " in log and "done: " in log, log[-2000:]
    assert log.count(WARNING) == 1, log[-3000:]
    assert "https://127.0.0.1:9/apis/" in log and "ConnectionRefusedError" in log
