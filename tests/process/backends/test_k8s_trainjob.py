"""TrainJob per Kubeflow Trainer release: the rendered shape against each release's CRD schema
(pruning as the API server does it), and `submit` checking the served CRD and doing a strict
server-side dry run before it creates anything (tests/k8s_apiserver.py).

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_k8s_trainjob.py. Helpers both use are in
tests/unit/backends/test_k8s_trainjob.py."""

from __future__ import annotations

import itertools

import pytest
from ddpkit.k8s import crds as k8s_crds

from tests import k8s_apiserver
from tests.k8s_apiserver import cli, prune_object, trainjob_crd
from tests.unit.backends.test_k8s_trainjob import VERSIONS, trainjob

cluster = k8s_apiserver.cluster  # the fake API server (a fixture)


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
