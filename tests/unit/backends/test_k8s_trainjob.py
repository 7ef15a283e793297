"""TrainJob per Kubeflow Trainer release: the rendered shape against each release's CRD schema
(pruning as the API server does it), and `submit` checking the served CRD and doing a strict
server-side dry run before it creates anything (tests/k8s_apiserver.py).

Here the tests that run in this process; those that start processes in
tests/process/backends/test_k8s_trainjob.py."""

from __future__ import annotations

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.k8s import crds as k8s_crds
from ddpkit.tools.jobspec import load_spec

from tests.k8s_apiserver import trainjob_crd

VERSIONS = k8s_crds.VERSIONS


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


def test_older_releases_refuse_what_they_cannot_carry(capsys) -> None:
    from ddpkit.tools import submit as launch

    rc = launch.main(["render", "k8s", "--set", "k8s.api=trainjob", "--set",
                      "k8s.trainer_version=2.0", "--set", "k8s.image_pull_secrets=['reg']"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "k8s.image_pull_secrets is not supported" in err and "trainer_version=2.0" in err
    text = k8s.render(load_spec(None, ["k8s.api=trainjob", "k8s.trainer_version=2.1"]))
    assert "# Trainer 2.1 takes no per-job security context, deadline, grace" in text
