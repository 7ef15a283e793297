"""submit k8s through the real `kubernetes` client against a small API server on loopback
(tests/k8s_apiserver.py), for what the local cluster of tests/engines/k8s/test_k8s_real.py cannot be: a
namespace the user may not write, a cluster without the training operator or Trainer, a job
that ends as asked (--wait on Succeeded and Failed), and the requests a sweep makes.

What the real API server and controllers now cover, and where (removed from here):
submit/status/logs/cancel of the last job, a resubmit refused as "already exists", the claim
kept on cancel, `status` of a job that is gone (test_cancel_deletes_a_running_job_and_its_pods);
logs of a PyTorchJob and of a TrainJob (container `node`), `logs --follow`, `list` of both
kinds (test_kubectl_apply_of_the_default_render_..., test_a_trainjob_submitted_...); a missing
namespace, a missing Secret or key (test_submit_refuses_a_missing_secret_or_namespace_...)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests import k8s_apiserver
from tests.k8s_apiserver import cli

ROOT = Path(__file__).resolve().parents[3]

cluster = k8s_apiserver.cluster  # the fake API server (a fixture)


@pytest.mark.parametrize(
    ("sets", "setup", "expect"),
    [
        (["k8s.namespace=locked"], None, "forbidden"),
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


@pytest.mark.parametrize("claim", [False, True])
def test_a_plain_submit_never_loads_the_core_api_a_claim_does(cluster, tmp_path, claim):
    """The client's CoreV1Api costs about 0.5 CPU-s to import (kubernetes 37's pydantic
    models), a third of `ddpkit submit k8s` against kubectl's 0.05: it is built on first use,
    so a job with no claim, Secret or RBAC to create never loads it, and one with a claim
    still creates it (the CLI in a fresh process, which then says whether it was loaded)."""
    import subprocess
    import sys

    sets = ["--set", "k8s.pvc_size=1Gi"] if claim else []
    argv = ["ddpkit", "submit", "k8s", "--set", f"name=lazy{int(claim)}", *sets]
    probe = (
        "import runpy, sys\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    runpy.run_module('ddpkit', run_name='__main__')\n"
        "finally:\n    print('core api loaded:', 'kubernetes.client.api.core_v1_api' in "
        "sys.modules, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"created pytorchjob/lazy{int(claim)}" in r.stdout
    assert any(k[0] == "pytorchjobs" for k in cluster.objects)
    assert f"core api loaded: {claim}" in r.stderr, r.stderr
    assert any(k[0] == "persistentvolumeclaims" for k in cluster.objects) is claim
