"""TrainJob per Kubeflow Trainer release: the rendered shape against each release's CRD schema
(pruning as the API server does it), and `submit` checking the served CRD and doing a strict
server-side dry run before it creates anything (tests/k8s_apiserver.py)."""

from __future__ import annotations

import itertools

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.k8s import crds as k8s_crds
from ddpkit.tools.jobspec import load_spec

from tests import k8s_apiserver
from tests.k8s_apiserver import cli, prune_object, trainjob_crd

VERSIONS = k8s_crds.VERSIONS

cluster = k8s_apiserver.cluster  # the fake API server (a fixture)


def trainjob(version: str, *sets: str) -> dict:
    spec = load_spec(
        "configs/default.toml",
        ["k8s.api=trainjob", f"k8s.trainer_version={version}", "k8s.pvc_size=5Gi", *sets],
        nodes=2,
        gpus=4,
    )
    (job,) = [d for d in yaml.safe_load_all(k8s.render(spec)) if d["kind"] == "TrainJob"]
    return job


def pod_spec(job: dict, version: str) -> dict:
    """The pod fields the TrainJob changes, wherever its release keeps them."""
    s = job["spec"]
    if version == "2.0":
        (o,) = s["podSpecOverrides"]
        assert o["targetJobs"] == [{"name": "node"}]
        return o
    if version == "2.1":
        (o,) = s["podTemplateOverrides"]
        assert o["targetJobs"] == [{"name": "node"}]
        return o["spec"]
    (patch,) = s["runtimePatches"]
    assert patch["manager"] == "ddpkit.io/launcher"
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    return rjob["template"]["spec"]["template"]["spec"]


def test_default_is_the_newest_release() -> None:
    spec = load_spec("configs/default.toml", ["k8s.api=trainjob"])
    assert spec.k8s.trainer_version == k8s_crds.NEWEST == "2.3"


@pytest.mark.parametrize("version", VERSIONS)
def test_each_release_gets_its_own_field_and_what_it_supports(version: str) -> None:
    job = trainjob(version)
    fields = {"podSpecOverrides", "podTemplateOverrides", "runtimePatches"} & set(job["spec"])
    assert fields == {k8s_crds.OVERRIDE_FIELD[version]}
    pod = pod_spec(job, version)
    (c,) = pod["containers"]
    assert c["name"] == "node"
    assert {m["mountPath"] for m in c["volumeMounts"]} == {
        "/dev/shm", "/workspace/runs/default"}  # fmt: skip
    assert {v["name"] for v in pod["volumes"]} == {"dshm", "checkpoints"}
    can = k8s_crds.supports(version)
    # The grace covers the save: the shutdown budget (30 s default) plus the margin.
    assert pod.get("terminationGracePeriodSeconds") == (60 if can["grace"] else None)
    assert (pod.get("securityContext") or {}).get("fsGroup") == (1000 if can["security_context"]
                                                                  else None)  # fmt: skip
    assert job["spec"].get("activeDeadlineSeconds") == (3600 if can["deadline"] else None)
    t = job["spec"]["trainer"]
    assert (t["numNodes"], t["numProcPerNode"]) == (2, 4)


@pytest.mark.parametrize("version", VERSIONS)
def test_crd_of_each_release_is_recognised(version: str) -> None:
    assert k8s_crds.served_version(trainjob_crd(version)) == version


@pytest.mark.parametrize(("rendered", "served"), list(itertools.product(VERSIONS, VERSIONS)))
def test_the_api_server_keeps_every_field_exactly_when_the_shapes_match(rendered, served):
    """Pruned against each release's schema: nothing dropped for the matching release (and
    2.2 on 2.3); for any other pair the fields that carry /dev/shm and the PVC are dropped,
    which is what `compatible` and submit's refusal are for."""
    secrets = ["k8s.image_pull_secrets=['reg']"] if rendered != "2.0" else []
    job = trainjob(rendered, "k8s.node_selector.gpu=h100", *secrets)
    kept, dropped = prune_object(job, trainjob_crd(served))
    assert (dropped == []) == k8s_crds.compatible(rendered, served), dropped
    if not dropped:
        assert kept == job
    assert k8s_crds.missing_paths(job, kept) == dropped


def test_older_releases_refuse_what_they_cannot_carry(capsys) -> None:
    from ddpkit.tools import submit as launch

    rc = launch.main(["render", "k8s", "--set", "k8s.api=trainjob", "--set",
                      "k8s.trainer_version=2.0", "--set", "k8s.image_pull_secrets=['reg']"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "k8s.image_pull_secrets is not supported" in err and "trainer_version=2.0" in err
    text = k8s.render(load_spec(None, ["k8s.api=trainjob", "k8s.trainer_version=2.1"]))
    assert "# Trainer 2.1 takes no per-job security context, deadline, grace" in text


# --- submit against the fake API server ---------------------------------------------------------


def _posts(c) -> list[tuple[str, dict]]:
    return [(path, body.get("?", {})) for m, path, body in c.requests if m == "POST"]


def test_submit_reads_the_crd_dry_runs_then_creates(cluster, capsys) -> None:
    cluster.objects[("persistentvolumeclaims", "ml", "tj-ckpt")] = {"metadata": {"name": "x"}}
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "name=tj", "--set", "k8s.api=trainjob",
                       "--set", "k8s.namespace=ml", "--set", "k8s.pvc_size=5Gi")  # fmt: skip
    assert rc == 0, err
    assert cluster.requests[0][1].endswith(
        "/customresourcedefinitions/trainjobs.trainer.kubeflow.org"
    )
    posts = _posts(cluster)
    assert posts[0] == ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs",
                        {"dryRun": "All", "fieldValidation": "Strict"})  # fmt: skip
    assert [p for p, _ in posts[1:]] == [
        "/api/v1/namespaces/ml/persistentvolumeclaims",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs",
    ]
    assert "persistentvolumeclaim/tj-ckpt exists; reusing it" in err
    stored = cluster.objects[("trainjobs", "ml", "tj")]
    assert stored["spec"]["runtimePatches"][0]["manager"] == "ddpkit.io/launcher"  # nothing pruned


@pytest.mark.parametrize("served", ["2.0", "2.1", "2.2"])
def test_submit_refuses_a_shape_the_cluster_does_not_serve(cluster, capsys, served) -> None:
    cluster.trainer_version = served
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "k8s.api=trainjob",
                       "--set", "k8s.pvc_size=5Gi")  # fmt: skip
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"serves the TrainJob of Kubeflow Trainer {served}" in err
    assert f"pass --set k8s.trainer_version={served}" in err
    assert _posts(cluster) == [] and cluster.objects == {}  # not even the PVC
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "k8s.api=trainjob",
                       "--set", f"k8s.trainer_version={served}")  # fmt: skip
    assert rc == 0, err


def test_submit_without_crd_access_relies_on_the_strict_dry_run(cluster, capsys) -> None:
    cluster.crd_forbidden, cluster.trainer_version = True, "2.1"
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "k8s.api=trainjob")
    assert rc == 2 and "Traceback" not in err
    assert "cannot read CRD trainjobs.trainer.kubeflow.org (403" in err
    last = err.splitlines()[-1]
    assert last.startswith("error: TrainJob default: the cluster rejects the manifest")
    assert 'unknown field "spec.runtimePatches"' in last and "k8s.trainer_version=" in last
    assert cluster.objects == {}


def test_submit_detects_fields_an_old_server_prunes_silently(cluster, capsys) -> None:
    cluster.crd_forbidden, cluster.ignores_field_validation = True, True
    cluster.trainer_version = "2.0"
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "k8s.api=trainjob",
                       "--set", "k8s.trainer_version=2.2")  # fmt: skip
    assert rc == 2, err
    last = err.splitlines()[-1]
    assert "the cluster would drop spec.runtimePatches, spec.activeDeadlineSeconds" in last
    assert cluster.objects == {}


def test_missing_crd_is_one_line(cluster, capsys) -> None:
    cluster.trainer_version = None
    rc, out, err = cli(capsys, "submit", "k8s", "--set", "k8s.api=trainjob")
    assert rc == 2 and err.count("\n") == 1 and "install Kubeflow Trainer v2" in err
