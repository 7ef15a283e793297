"""PyTorchJob/TrainJob rendering: goldens (exact), parsed back and checked against the core
schemas (kubernetes-validate --strict), the controller's webhook rules, and YAML safety.

Regenerate goldens only on purpose:
DDPKIT_UPDATE_GOLDENS=1 pytest tests/unit/backends/test_k8s_render.py

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_k8s_render.py. Helpers both use are in
tests/unit/backends/test_k8s_render.py."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from tests.unit.backends.test_k8s_render import CASES, REPO, docs_for, job_of, pods_of

VALIDATE = Path(sys.executable).parent / "kubernetes-validate"


def test_every_pod_and_pvc_validates_strictly_against_the_core_schemas(tmp_path: Path) -> None:
    docs = []
    for case in sorted(CASES):
        rendered = docs_for(case)
        docs += [d for d in rendered if d["kind"] == "PersistentVolumeClaim"]
        docs += pods_of(job_of(rendered))
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    p = subprocess.run([str(VALIDATE), "--strict", str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(" passed for resource ") == len(docs), p.stdout
    # The check has teeth: a misspelt field fails it.
    bad = copy.deepcopy(docs[-1])
    bad["spec"]["containers"][0]["volumeMount"] = []
    path.write_text(yaml.safe_dump(bad))
    p = subprocess.run([str(VALIDATE), "--strict", str(path)], capture_output=True, text=True)
    assert p.returncode != 0 and "volumeMount" in p.stdout + p.stderr


def test_an_elastic_jobs_last_call_reaches_torchrun_through_the_operator() -> None:
    """k8s.elastic.last_call_s: elasticPolicy.rdzvConf, which the operator hands the pods as
    PET_RDZV_CONF; launch.sh passes it to torchrun's --rdzv-conf beside is_host."""
    assert "rdzvConf" not in job_of(docs_for("gpt-elastic-gang"))["spec"]["elasticPolicy"]
    job = job_of(docs_for("gpt-elastic-gang", "k8s.elastic.last_call_s=120"))
    assert job["spec"]["elasticPolicy"]["rdzvConf"] == [
        {"key": "last_call_timeout", "value": "120"}
    ]
    (c,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert '--rdzv-conf "${PET_RDZV_CONF:+$PET_RDZV_CONF,}is_host=$is_host"' in c["command"][2]


def test_make_k8s_render_prints_and_writes_into_the_workspace(tmp_path: Path) -> None:
    p = subprocess.run(
        ["make", "-s", "-f", str(REPO / "Makefile"), "k8s-render", "NODES=2"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    written = tmp_path / ".ddpkit" / "rendered" / "k8s" / "default.yaml"
    assert written.read_text() == p.stdout
    job = job_of(list(yaml.safe_load_all(p.stdout)))
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
