"""submit/status/logs/cancel/list k8s through the real `kubernetes` client, against a small
API server on loopback (tests/k8s_apiserver.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ddpkit.tools.backends import k8s
from ddpkit.tools.spec import load_spec

from tests import k8s_apiserver
from tests.k8s_apiserver import cli

ROOT = Path(__file__).resolve().parents[1]

cluster = k8s_apiserver.cluster  # the fake API server (a fixture)


def test_submit_creates_the_rendered_objects_and_remembers_the_job(cluster, capsys):
    sets = ["--set", "name=ctest", "--set", "k8s.pvc_size=5Gi", "--nodes", "2"]
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 0, err
    spec = load_spec(ROOT / "configs/default.toml", ["name=ctest", "k8s.pvc_size=5Gi"], 2)
    rendered = list(yaml.safe_load_all(k8s.render(spec)))
    assert cluster.objects[("persistentvolumeclaims", "default", "ctest-ckpt")] == rendered[0]
    assert cluster.objects[("pytorchjobs", "default", "ctest")] == rendered[1]
    assert "created pytorchjob/ctest" in out
    # The dry run comes first: the job was created before, so 409 -> one line saying what
    # to do, and nothing else is touched (no second PVC attempt).
    posts = sum(1 for r in cluster.requests if r[0] == "POST")
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1
    assert sum(1 for r in cluster.requests if r[0] == "POST") == posts + 1
    last = err.splitlines()[-1]
    assert last.startswith("error: PyTorchJob ctest: already exists")
    assert "cancel k8s ctest -n default" in last and "--set name=" in last

    # status/logs/cancel without a job name use the last one submitted.
    cluster.objects[("pytorchjobs", "default", "ctest")]["status"] = {
        "conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
                       {"type": "Running", "status": "True", "message": "job is running"}],
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1, "failed": 0}},
    }  # fmt: skip
    labels = {"training.kubeflow.org/job-name": "ctest"}
    cluster.pods[("default", "ctest-master-0")] = {
        "labels": labels | {"training.kubeflow.org/replica-type": "master"},
        "phase": "Running", "log": "step 1/3 loss 2.3\nstep 2/3 loss 2.1\n", "restarts": 0,
    }  # fmt: skip
    cluster.pods[("default", "other-master-0")] = {
        "labels": {"training.kubeflow.org/job-name": "other"},
        "phase": "Running",
        "log": "no",
    }
    cluster.pods[("default", "ctest-worker-0")] = {
        "labels": labels,
        "phase": "Running",
        "log": "worker\n",
        "restarts": 2,
    }
    rc, out, err = cli(capsys, "status", "k8s")
    assert rc == 0, err
    assert "condition Running=True  job is running" in out
    assert "Worker: active 1, succeeded 0, failed 0" in out
    assert "pod ctest-worker-0: Running (restarts 2)" in out and "other-master-0" not in out

    rc, out, err = cli(capsys, "logs", "k8s")  # every pod of the job, prefixed
    assert rc == 0, err
    assert out == (
        "[ctest-master-0] step 1/3 loss 2.3\n[ctest-master-0] step 2/3 loss 2.1\n"
        "[ctest-worker-0] worker\n"
    )
    method, path, body = cluster.requests[-1]
    assert path == "/api/v1/namespaces/default/pods/ctest-worker-0/log"
    assert body["?"] == {"container": "pytorch"}

    rc, out, err = cli(capsys, "cancel", "k8s")
    assert rc == 0 and "deleted pytorchjob/ctest" in out
    assert cluster.requests[-1][0] == "DELETE"
    assert cluster.requests[-1][2]["?"] == {"propagationPolicy": "Foreground"}
    assert ("pytorchjobs", "default", "ctest") not in cluster.objects
    assert ("persistentvolumeclaims", "default", "ctest-ckpt") in cluster.objects  # kept
    rc, out, err = cli(capsys, "status", "k8s", "ctest")
    assert rc == 2 and "not found" in err and "Traceback" not in err


def test_elastic_logs_and_trainjob_goes_to_trainer_api(cluster, capsys):
    rc, _, err = cli(capsys, "submit", "k8s", "--set", "name=el", "--set", "k8s.elastic.min=1",
                     "--set", "k8s.elastic.max=2")  # fmt: skip
    assert rc == 0, err
    cluster.pods[("default", "el-worker-0")] = {
        "labels": {"training.kubeflow.org/job-name": "el"}, "phase": "Running", "log": "w0\n"}  # fmt: skip
    rc, out, err = cli(capsys, "logs", "k8s", "el")
    assert rc == 0 and out == "[el-worker-0] w0\n", err

    rc, _, err = cli(capsys, "submit", "k8s", "--set", "name=tj", "--set", "k8s.api=trainjob",
                     "--set", "k8s.namespace=ml")  # fmt: skip
    assert rc == 0, err
    assert cluster.objects[("trainjobs", "ml", "tj")]["kind"] == "TrainJob"
    cluster.pods[("ml", "tj-node-0-0-abcde")] = {
        "labels": {"jobset.sigs.k8s.io/jobset-name": "tj",
                   "batch.kubernetes.io/job-completion-index": "0"},
        "phase": "Running", "log": "node0\n"}  # fmt: skip
    rc, out, err = cli(capsys, "logs", "k8s")  # the last job: tj in ml
    assert rc == 0 and out == "[tj-node-0-0-abcde] node0\n", err
    assert cluster.requests[-1][2]["?"]["container"] == "node"


@pytest.mark.parametrize(
    ("sets", "setup", "expect"),
    [
        (["k8s.namespace=locked"], None, "forbidden"),
        (["k8s.namespace=nope"], None, "namespace 'nope' does not exist"),
        ([], lambda c: c.served.clear(), "install the Kubeflow training operator"),
        (["k8s.api=trainjob"], lambda c: c.served.discard(
            ("trainer.kubeflow.org", "v1alpha1", "trainjobs")), "install Kubeflow Trainer v2"),
    ],
)  # fmt: skip
def test_api_errors_are_one_clear_line(cluster, capsys, sets, setup, expect):
    if setup:
        setup(cluster)
    rc, out, err = cli(capsys, "submit", "k8s", *[a for s in sets for a in ("--set", s)])
    assert rc == 2 and expect in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not any(k[0] == "pytorchjobs" for k in cluster.objects)


def test_no_kubeconfig_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rc, out, err = cli(capsys, "status", "k8s", "some-job")
    assert rc == 2 and "no Kubernetes credentials" in err and "KUBECONFIG" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("outcome", "rc"), [("Succeeded", 0), ("Failed", 1)])
def test_submit_wait_follows_the_job_to_its_end(cluster, capsys, outcome, rc):
    cluster.finish_as = outcome
    got, out, err = cli(capsys, "submit", "k8s", "--set", "name=w", "--wait")
    assert (
        got == rc and f"job w: {outcome.lower()} exit={rc} (PyTorchJob default/w: {outcome})" in err
    )


def test_logs_follow_streams_every_pod_until_the_job_ends(cluster, capsys):
    rc, _, err = cli(capsys, "submit", "k8s", "--set", "name=fw", "--nodes", "2")
    assert rc == 0, err
    labels = {"training.kubeflow.org/job-name": "fw"}
    cluster.pods[("default", "fw-master-0")] = {"labels": labels, "phase": "Running",
                                                "log": "m1\nm2\n"}  # fmt: skip
    cluster.pods[("default", "fw-worker-0")] = {"labels": labels, "phase": "Succeeded",
                                                "log": "w1\npartial"}  # fmt: skip
    cluster.pods[("default", "fw-worker-1")] = {"labels": labels, "phase": "Pending", "log": ""}
    cluster.objects[("pytorchjobs", "default", "fw")]["status"] = {
        "conditions": [{"type": "Succeeded", "status": "True"}]}  # fmt: skip
    rc, out, err = cli(capsys, "logs", "k8s", "--follow")
    assert rc == 0, err
    assert sorted(out.splitlines()) == [
        "[fw-master-0] m1", "[fw-master-0] m2", "[fw-worker-0] partial", "[fw-worker-0] w1"]  # fmt: skip
    watches = [b["?"] for m, p, b in cluster.requests if p.endswith("/pods") and "?" in b]
    assert watches and all(q.get("watch") == "true" for q in watches)
    assert watches[0]["labelSelector"] == "training.kubeflow.org/job-name=fw"
    follows = [p for m, p, b in cluster.requests if p.endswith("/log")]
    assert sorted(follows) == [f"/api/v1/namespaces/default/pods/fw-{p}/log"
                               for p in ("master-0", "worker-0")]  # fmt: skip


def test_list_shows_the_namespaces_ddpkit_jobs_of_both_kinds(cluster, capsys):
    for name, api in (("a1", "pytorchjob"), ("b2", "trainjob")):
        rc, _, err = cli(capsys, "submit", "k8s", "--set", f"name={name}", "--set",
                         f"k8s.api={api}")  # fmt: skip
        assert rc == 0, err
    cluster.objects[("pytorchjobs", "default", "other")] = {
        "kind": "PyTorchJob", "metadata": {"name": "other", "labels": {"app": "x"}}}  # fmt: skip
    rc, out, err = cli(capsys, "list", "k8s")
    assert rc == 0, err
    assert sorted(line.split("\t")[:3] for line in out.splitlines()) == [
        ["a1", "PyTorchJob", "Pending"], ["b2", "TrainJob", "Pending"]]  # fmt: skip


def test_a_sweep_is_n_named_jobs(cluster, capsys):
    sweep = ["--sweep", "train.lr=1e-3,3e-4", "--set", "name=sw"]
    rc, out, err = cli(capsys, "render", "k8s", *sweep)
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))  # the members' manifests, one stream
    assert [d["metadata"]["name"] for d in docs] == ["sw-0", "sw-1"]
    rc, out, err = cli(capsys, "submit", "k8s", *sweep)
    assert rc == 0, err
    created = {k[2]: v for k, v in cluster.objects.items() if k[0] == "pytorchjobs"}
    assert sorted(created) == ["sw-0", "sw-1"]
    for name, lr in (("sw-0", "0.001"), ("sw-1", "0.0003")):
        args = created[name]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"][
            "containers"][0]["args"]  # fmt: skip
        assert args[args.index("--lr") + 1] == lr
        assert args[args.index("--run-dir") + 1] == f"runs/{name}"


def test_submit_checks_the_secrets_exist_without_printing_them(cluster, capsys):
    sets = ["--set", "k8s.secret_env.WANDB_API_KEY=wandb/api-key", "--set", "name=sec"]
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 2 and err.count("\n") == 1, err
    assert "Secret 'wandb' does not exist in namespace 'default'" in err
    assert "kubectl create secret generic wandb -n default --from-literal=api-key=" in err
    cluster.secrets[("default", "wandb")] = ["token"]
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 2 and "has no key api-key (it has: token)" in err
    assert not [k for k in cluster.objects if k[0] == "pytorchjobs"]
    cluster.secrets[("default", "wandb")] = ["api-key"]
    rc, out, err = cli(capsys, "submit", "k8s", *sets)
    assert rc == 0, err
    assert "c2VjcmV0" not in out + err and "secret" not in (out + err).replace("Secret", "")
    env = cluster.objects[("pytorchjobs", "default", "sec")]["spec"]["pytorchReplicaSpecs"][
        "Master"]["template"]["spec"]["containers"][0]["env"]  # fmt: skip
    assert {"name": "WANDB_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}} in env  # fmt: skip
