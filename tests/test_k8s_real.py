"""Rendered jobs against a REAL Kubernetes API server with the real Kubeflow controllers and
their validating webhooks (make k8s-up: etcd, kube-apiserver, kube-controller-manager, the
training operator v1.9, JobSet and Trainer v2.3, built from their Go modules). What the
schema checks and the fake API server could only approximate, the real server decides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "k8s" / "local"
pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def _binaries_missing() -> str | None:
    probe = subprocess.run(
        ["bash", "-c", f'source {LOCAL}/versions.sh; for b in "$ETCD_BIN" "$APISERVER_BIN" '
         '"$KCM_BIN" "$TRAINING_OPERATOR_BIN" "$JOBSET_BIN" "$TRAINER_BIN"; do '
         '[ -x "$b" ] || echo "$b"; done'],
        capture_output=True, text=True,
    )  # fmt: skip
    missing = probe.stdout.split()
    return (
        f"control plane not built ({missing[0]} missing): k8s/local/build.sh" if missing else None
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _binaries_missing()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("k8s-state")
    env = {**os.environ, "DDPKIT_K8S_STATE": str(state / "s"), "DDPKIT_K8S_NODES": "0"}
    up = subprocess.run(["bash", str(LOCAL / "up.sh")], env=env, capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield {**env, "KUBECONFIG": str(state / "s" / "kubeconfig")}
    finally:
        subprocess.run(["bash", str(LOCAL / "down.sh"), "--purge"], env=env,
                       capture_output=True, timeout=120)  # fmt: skip


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
        ("--nodes", "2", "--set", "k8s.elastic.min=1", "--set", "k8s.elastic.max=2"),
        ("--nodes", "2", "--gpus", "2", "--set", "k8s.api=trainjob"),  # Trainer v2.3
        ("--nodes", "2", "--set", "k8s.pvc_size=10Gi", "--set", "accelerator=cpu"),
    ],
    ids=["pytorchjob", "elastic", "trainjob-2.3", "pvc-cpu"],
)
def test_the_real_server_and_webhooks_accept_what_render_prints(cluster, tmp_path, args):
    r = server_dry_run(cluster, render(tmp_path, *args))
    assert r.returncode == 0, r.stderr
    assert "created (server dry run)" in r.stdout


@pytest.mark.parametrize("version", ["2.0", "2.1"])
def test_a_trainjob_shaped_for_another_trainer_release_is_refused_by_the_real_server(
    cluster, tmp_path, version
):
    manifest = render(
        tmp_path, "--set", "k8s.api=trainjob", "--set", f"k8s.trainer_version={version}"
    )
    r = server_dry_run(cluster, manifest)
    assert r.returncode != 0 and "unknown field" in r.stderr, r.stdout + r.stderr


def test_the_webhook_refuses_what_render_refuses_first(cluster, tmp_path):
    """A name the PyTorchJob webhook denies (a leading digit) is refused by render too, in
    one line, before anything reaches a server."""
    r = subprocess.run([sys.executable, "-m", "ddpkit", "render", "k8s", "--set", "name=1bad"],
                       cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "DNS-1035" in r.stderr
    good = render(tmp_path, "--nodes", "2").replace("name: default", "name: 1bad")
    denied = server_dry_run(cluster, good)
    assert denied.returncode != 0 and "denied the request" in denied.stderr, denied.stderr
