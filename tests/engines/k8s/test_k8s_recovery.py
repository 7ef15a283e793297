"""Recovery on Kubernetes, on the real control plane and training operator (v1.9.4) with two
nodes run by k8s/local/node_agent.py: a PyTorchJob the kit submits (2 pods x 2 ranks, the
checkpoints and the goodput records on its claim) meets a SIGKILLed worker (torchrun restarts
it in place), a deleted pod (the operator recreates the pods: restartPolicy ExitCode), a pod
lost with every process of it (recreated alone; its peer's pod is recreated into the same
attempt), the user's code raising on every attempt (the job fails once, not retried) and a failure that
comes back on every attempt (the kit's count on the claim stops it at backoffLimit). The
recovered jobs end with the parameters of a run without failures (the same digest)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest

from tests.engines.k8s.test_k8s_real import (  # noqa: F401  (cluster: the module's control plane)
    DELETED,
    PACED,
    cluster,
    ddpkit,
    finished,
    kubectl,
    summary,
    wait_until,
)

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
STEPS = 200
LAUNCHER_LINE = "ddpkit: python -m ddpkit.k8s.attempt"  # launch.sh's line, once per pod start


def job(name: str, *extra: str) -> list[str]:
    return ["--nodes", "2", "--gpus", "2", "--set", f"name={name}", "--set", "k8s.pvc_size=1Gi",
            "--set", f"train.steps={STEPS}", "--set", "train.ckpt_interval=50",
            "--set", "train.log_interval=10", *extra]  # fmt: skip


def claim_run(env: dict, name: str) -> Path:
    return (
        Path(env["DDPKIT_K8S_STATE"]) / "node" / "pvc" / "default" / f"{name}-ckpt" / "runs" / name
    )


def pod_logs(env: dict, name: str) -> str:
    """Every run of every pod of job `name`, from the node agent's files (they outlive the
    pods the operator deletes and recreates)."""
    pods = Path(env["DDPKIT_K8S_STATE"]) / "node" / "pods"
    return "".join(f.read_text() for f in sorted(pods.glob(f"default_{name}-*/pytorch.log")))


BAD_PY = """\
import torch.distributed as dist
dist.init_process_group("gloo")
raise ValueError(f"column 'label' not in the data (rank {dist.get_rank()})")
"""


BUG_JOB = """\
name = "bug"
image = "myproj:1"
script = "bad.py"
[k8s]
pvc_size = "1Gi"
"""


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):  # noqa: F811
    """Six jobs at once: ref (no failure), kill (rank 3, on the worker pod, SIGKILLs itself at
    step 60), gone (the worker pod deleted once the job trains), lost (every process of the
    worker pod SIGKILLed at step 40, as `ddpkit chaos` kill-node does), bug (the user's script
    raises on every rank), loop (a worker killed on every attempt; no in-place budget,
    backoffLimit 1). Name -> its workspace; "deleted_at": when the pod was deleted; "lost":
    what the drill did."""
    out: dict = {n: tmp_path_factory.mktemp(n) for n in ("ref", "kill", "gone", "lost", "loop")}
    extra = {
        "kill": ("--set", "env.DDPKIT_FAULT=kill@60:3"),
        "gone": DELETED,  # struck from outside once step 40 is logged
        "lost": PACED,
        # train.timeout_s: once in CI the job took 597 s of wait_finished's 600, as if the
        # master pod's ranks saw the killed peer only at the collective timeout (600 s by
        # default; likely no FIN reached them, the pod's network torn down with it)
        "loop": ("--set", "env.DDPKIT_FAULT=kill@30:3", "--set", "max_restarts=0",
                 "--set", "k8s.backoff_limit=1", "--set", "train.timeout_s=120"),
    }  # fmt: skip
    for name in ("ref", "kill", "gone", "lost", "loop"):
        sub = ddpkit(cluster, out[name], "submit", "k8s", *job(name, *extra.get(name, ())))
        assert sub.returncode == 0, sub.stdout + sub.stderr
    project = Path(cluster["DDPKIT_TEST_PROJECT"])  # the image myproj:* (this venv + project)
    (project / "bad.py").write_text(BAD_PY)
    (project / "ddpkit.toml").write_text(BUG_JOB)
    r = ddpkit(cluster, project, "render", "k8s", "--nodes", "2", "--gpus", "2")
    assert r.returncode == 0, r.stderr
    applied = kubectl(cluster, "apply", "-f", "-", input=r.stdout)
    assert applied.returncode == 0, applied.stderr

    def delete_once_training() -> None:
        end = time.monotonic() + 540
        while time.monotonic() < end:
            if f" 40/{STEPS} " in kubectl(cluster, "logs", "gone-master-0").stdout:
                if (
                    kubectl(cluster, "delete", "pod", "gone-worker-0", "--wait=false").returncode
                    == 0
                ):
                    out["deleted_at"] = time.time()
                return
            time.sleep(0.5)

    def lose_the_worker_pod() -> None:
        from ddpkit.tools import chaos

        run, end = claim_run(cluster, "lost"), time.monotonic() + 540
        while time.monotonic() < end and chaos.logged_step(run) < 40:
            time.sleep(0.5)
        with contextlib.suppress(chaos.ChaosError):  # no workers (the job gone): the test says
            out["lost"] = chaos.inject(run, chaos.Injection("kill-node", "step", 40, 1))

    def note_the_killed_ranks_node() -> None:  # the operator may delete the pod at the end
        end = time.monotonic() + 540
        while time.monotonic() < end and not out.get("kill_node"):
            got = kubectl(cluster, "get", "pod", "kill-worker-0", "-o",
                          "jsonpath={.spec.nodeName}").stdout  # fmt: skip
            out["kill_node"] = got.strip()
            time.sleep(1)

    watchers = [
        threading.Thread(target=f, daemon=True)
        for f in (delete_once_training, lose_the_worker_pod, note_the_killed_ranks_node)
    ]
    for w in watchers:
        w.start()
    yield out
    for w in watchers:
        w.join(timeout=1)


def wait_finished(env: dict, name: str, timeout: float = 600) -> str:
    wait_until(f"PyTorchJob {name} finished", lambda: finished(env, "pytorchjob", name), timeout,
               env)  # fmt: skip
    return str(finished(env, "pytorchjob", name))


def launches(env: dict, name: str) -> set[str]:
    """The attempts the job's goodput records name (ddpkit.k8s.attempt: k8s-<pod restarts>)."""
    folder = claim_run(env, name) / "goodput"
    recs = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return {r.get("launch") for r in recs if r.get("kind") != "inject"}  # a drill's: no launch


def test_a_killed_worker_restarts_in_place_and_resumes_to_the_same_weights(cluster, jobs):  # noqa: F811
    assert wait_finished(cluster, "kill") == "Succeeded"
    summ = summary(cluster, "kill")
    assert wait_finished(cluster, "ref") == "Succeeded"
    assert summ["param_digest"] == summary(cluster, "ref")["param_digest"]
    assert summ["resumed_from"] == "runs/kill/checkpoints/step-50", summ["resumed_from"]
    # torchrun restarted the group in the pods: no pod was recreated (one launch id), once.
    assert launches(cluster, "kill") == {"k8s-0"}
    assert pod_logs(cluster, "kill").count(LAUNCHER_LINE) == 2
    good = summ["goodput"]
    assert good["attempts"] == 2 and len(good["failures"]) == 1, good
    (f,) = good["failures"]
    records = sorted(p.read_text() for p in (claim_run(cluster, "kill") / "goodput").iterdir())
    assert f["kind"] == "killed" and f["rank"] == 3 and f["node"] == jobs.get("kill_node"), (
        f, records)  # fmt: skip
    assert f["recovered"] and f["detect_s"] < 120 and f["restart_s"] < 120, f
    print(f"killed worker: detect {f['detect_s']:.1f} s, restart {f['restart_s']:.1f} s, "
          f"load {f['load_s']:.1f} s")  # fmt: skip
    st = ddpkit(cluster, jobs["kill"], "status", "k8s", "kill")
    assert st.returncode == 0 and "goodput " in st.stdout, st.stdout + st.stderr
    # the one way a rank is named (ddpkit.train.places): its node and the Kubernetes node
    placed = f"failure: killed rank 3 (node 1, host {f['node']}) in attempt 0"
    assert placed in st.stdout and "recovered" in st.stdout, st.stdout


def test_a_deleted_pod_is_recreated_and_the_job_resumes_to_the_same_weights(cluster, jobs):  # noqa: F811
    assert wait_finished(cluster, "gone") == "Succeeded"
    assert "deleted_at" in jobs, "gone-worker-0 was never deleted while training"
    summ = summary(cluster, "gone")
    assert wait_finished(cluster, "ref") == "Succeeded"
    assert summ["param_digest"] == summary(cluster, "ref")["param_digest"]
    assert summ["resumed_from"], pod_logs(cluster, "gone")[-8000:]  # what the pods said
    step = int(str(summ["resumed_from"]).rsplit("-", 1)[-1])
    assert 40 <= step < STEPS, summ["resumed_from"]
    # Both pods were recreated once (ExitCode: the worker's peers exit EXIT_RESTART_POD).
    assert launches(cluster, "gone") == {"k8s-0", "k8s-1"}
    logs = pod_logs(cluster, "gone")
    assert logs.count(LAUNCHER_LINE) == 4, logs[-3000:]
    assert "saved on SIGTERM: pod restart 1 of 3 (exit 200)" in logs, logs[-3000:]
    good = summ["goodput"]
    assert good["attempts"] == 2 and [f["kind"] for f in good["failures"]] == ["preempted"], good
    f = good["failures"][0]
    assert f["recovered"] and f["restart_s"] < 300, f
    print(f"deleted pod: deleted -> next attempt ready in "
          f"{f['restart_s'] + f['load_s']:.1f} s (restart {f['restart_s']:.1f} s, "
          f"load {f['load_s']:.1f} s)")  # fmt: skip
    st = ddpkit(cluster, jobs["gone"], "status", "k8s", "gone")
    assert "failure: preempted on " in st.stdout, st.stdout + st.stderr


def test_a_pod_lost_with_its_processes_comes_back_and_its_peer_joins_its_attempt(cluster, jobs):  # noqa: F811
    """Every process of the worker pod SIGKILLed (a node lost): the operator recreates that pod
    alone (exit 137), which opens attempt k8s-1; the master's pod, its workers restarted in
    place by torchrun at another attempt's store keys, sees the newer attempt and is recreated
    into it (ddpkit.k8s.attempt), and the job resumes to the same weights. Before, the two
    never met: the recreated pod's ranks crashed again and again (a drill lost 401 s)."""
    assert wait_finished(cluster, "lost") == "Succeeded"
    assert "SIGKILL to node rank 1" in jobs.get("lost", ""), jobs.get("lost")
    summ = summary(cluster, "lost")
    assert wait_finished(cluster, "ref") == "Succeeded"
    assert summ["param_digest"] == summary(cluster, "ref")["param_digest"]
    assert launches(cluster, "lost") == {"k8s-0", "k8s-1"}  # one new attempt, no more
    logs = pod_logs(cluster, "lost")
    assert logs.count(LAUNCHER_LINE) == 4, logs[-3000:]
    joined = "node0: another pod of the job started attempt 1 (this pod is in 0)"
    assert logs.count(joined) == 1, logs[-3000:]
    good = summ["goodput"]
    assert good["attempts"] == 2 and [f["kind"] for f in good["failures"]] == ["node lost"], good
    f = good["failures"][0]
    assert f["recovered"] and f["restart_s"] < 180, f
    print(f"lost pod: detect {f['detect_s']:.1f} s, restart {f['restart_s']:.1f} s, "
          f"load {f['load_s']:.1f} s")  # fmt: skip


def test_the_users_code_failing_is_not_retried(cluster, jobs):  # noqa: F811
    assert wait_finished(cluster, "bug") == "Failed"
    logs = pod_logs(cluster, "bug")
    assert logs.count(LAUNCHER_LINE) == 2, logs[-3000:]  # each pod started once
    assert "ValueError: column 'label' not in the data" in logs, logs[-3000:]
    assert "failed in its own code: not restarted (exit 1)" in logs, logs[-3000:]
    pods = kubectl(cluster, "get", "pods", "-l", "training.kubeflow.org/job-name=bug", "-o",
                   "jsonpath={.items[*].status.containerStatuses[0].state.terminated.exitCode}")  # fmt: skip
    assert set(pods.stdout.split()) <= {"1"}, pods.stdout


def test_a_failure_on_every_attempt_stops_at_the_restart_budget(cluster, jobs):  # noqa: F811
    """v1.9.4 holds ExitCode restarts to no backoffLimit: the kit's count on the claim does."""
    assert wait_finished(cluster, "loop") == "Failed"
    logs = pod_logs(cluster, "loop")
    assert logs.count(LAUNCHER_LINE) == 4, logs[-3000:]  # 2 pods x (1 + backoffLimit 1)
    assert "the pod restart limit (1) is reached: not restarted (exit 1)" in logs, logs[-3000:]
    assert not list((claim_run(cluster, "loop") / "k8s-attempts").iterdir())  # the next job's


FLAKY_PY = """\
import os, signal, time
from pathlib import Path

node = os.environ["DDPKIT_NODE_NAME"]
mark = Path(os.environ["DDPKIT_RUN_DIR"]) / "bad-node"  # on the claim: outlives the pods
if not mark.exists():
    mark.write_text(node)  # the node of the first attempt is the bad one
if node == mark.read_text():
    print(f"flaky.py: dying on {node}", flush=True)
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)  # no exception: a node fault, not the user's code
print(f"flaky.py: done on {node}", flush=True)
"""

FLAKY_JOB = """\
name = "flaky"
image = "myproj:1"
script = "flaky.py"
max_restarts = 0
[k8s]
pvc_size = "1Gi"
exclude_failed_nodes = true
"""


def test_a_node_that_fails_twice_is_kept_out_of_the_recreated_pods(cluster):  # noqa: F811
    """A user's script whose process dies on one node (SIGKILL, every time it runs there) and
    succeeds elsewhere. The node agent places a recreated pod of an otherwise idle cluster
    where its predecessor was (least loaded, first by name), so the job fails on its node
    twice; the second time the pod adds `kubernetes.io/hostname NotIn [node]` to its own
    PyTorchJob before it exits, through the service account and Role that submit created,
    and the third pod runs on the other node and succeeds."""
    project = Path(cluster["DDPKIT_TEST_PROJECT"])
    (project / "flaky.py").write_text(FLAKY_PY)
    (project / "flaky.toml").write_text(FLAKY_JOB)
    # What a cluster admin grants for the room check (a cluster-scoped right the job's Role
    # cannot give): the pod lists the Ready nodes, and 2 leave room to exclude one.
    for args in (("clusterrole", "flaky-nodes", "--verb=list", "--resource=nodes"),
                 ("clusterrolebinding", "flaky-nodes", "--clusterrole=flaky-nodes",
                  "--serviceaccount=default:flaky-ddpkit")):  # fmt: skip
        made = kubectl(cluster, "create", *args)
        assert made.returncode == 0, made.stderr
    sub = ddpkit(cluster, project, "submit", "k8s", "--config", "flaky.toml", "--nodes", "1",
                 "--gpus", "1")  # fmt: skip
    assert sub.returncode == 0, sub.stdout + sub.stderr
    for kind in ("serviceaccount", "role", "rolebinding"):
        assert f"created {kind}/flaky-ddpkit" in sub.stderr, sub.stderr
    assert wait_finished(cluster, "flaky") == "Succeeded"
    bad = (claim_run(cluster, "flaky") / "bad-node").read_text()
    got = kubectl(cluster, "get", "pytorchjob", "flaky", "-o", "json")
    spec = json.loads(got.stdout)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms == {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad]}]}]}  # fmt: skip
    logs = pod_logs(cluster, "flaky")
    assert logs.count(f"flaky.py: dying on {bad}") == 2, logs[-3000:]
    assert "flaky.py: done on " in logs and f"flaky.py: done on {bad}" not in logs, logs[-3000:]
    assert f"ddpkit: node {bad} failed twice: kept out of PyTorchJob flaky's next pods" in logs
    assert "not excluding" not in logs, logs[-3000:]
    assert launches(cluster, "flaky") == {"k8s-0", "k8s-1", "k8s-2"}
    done = kubectl(cluster, "get", "pods", "-l", "training.kubeflow.org/job-name=flaky", "-o",
                   "jsonpath={.items[*].spec.nodeName}").stdout.split()  # fmt: skip
    assert done and bad not in done, done
    st = ddpkit(cluster, project, "status", "k8s", "flaky")
    assert f"excluded nodes: {bad} (failed twice" in st.stdout, st.stdout + st.stderr
    gone = ddpkit(cluster, project, "cancel", "k8s", "flaky")
    assert gone.returncode == 0 and "deleted rolebinding/flaky-ddpkit" in gone.stdout, gone.stdout
