"""A node that failed twice kept out of a PyTorchJob's recreated pods (k8s.exclude_failed_nodes),
in process: the patch the pod makes to its own job (ddpkit.k8s.exclude), the objects and env
the renderer adds for it, and the local node agent's scheduling that honours it
(k8s/local/nodeagent/schedule.py). The real cluster's run is in test_k8s_recovery.py.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/backends/test_k8s_exclusion.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.k8s import exclude
from ddpkit.tools.jobspec import load_spec

from tests.unit.backends.test_k8s_exclusion import REPO

VALIDATE = Path(sys.executable).parent / "kubernetes-validate"


def _docs(*sets: str) -> list[dict]:
    spec = load_spec(REPO / "configs/default.toml", ["k8s.pvc_size=1Gi", *sets], 2, 2)
    return list(yaml.safe_load_all(k8s.render(spec)))


def test_the_option_renders_the_rights_the_service_account_and_the_env(tmp_path) -> None:
    plain = _docs()
    docs = _docs("k8s.exclude_failed_nodes=true", "name=j")
    assert [d["kind"] for d in plain] == ["PersistentVolumeClaim", "PyTorchJob"]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["PersistentVolumeClaim", "ServiceAccount", "Role", "RoleBinding", "PyTorchJob"]
    sa, role, binding, pj = docs[1:]
    assert sa["metadata"]["name"] == "j-ddpkit"
    assert role["rules"] == [{"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
                              "resourceNames": ["j"], "verbs": ["get", "patch"]}]  # fmt: skip
    assert binding["roleRef"]["name"] == "j-ddpkit"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "j-ddpkit",
                                    "namespace": "default"}]  # fmt: skip
    for r in pj["spec"]["pytorchReplicaSpecs"].values():
        pod = r["template"]["spec"]
        assert pod["serviceAccountName"] == "j-ddpkit"
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env[exclude.JOB_ENV]["value"] == "j"
        assert env[exclude.NAMESPACE_ENV]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}}  # fmt: skip
    path = tmp_path / "rbac.yaml"
    path.write_text(yaml.safe_dump_all(docs[1:4]))
    p = subprocess.run([str(VALIDATE), "--strict", str(path)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.count(" passed for resource ") == 3, p.stdout + p.stderr
    # the user's own service account gets the rights; no account of the job's own
    own = _docs("k8s.exclude_failed_nodes=true", "name=j", "k8s.service_account=trainer")
    assert [d["kind"] for d in own][1:3] == ["Role", "RoleBinding"]
    assert own[2]["subjects"][0]["name"] == "trainer"
