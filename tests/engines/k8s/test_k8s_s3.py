"""Kubernetes with no volume: the kit's trainer as a PyTorchJob on the local control plane
(tests/engines/k8s/test_k8s_real.py's cluster: two nodes whose pods are local processes in
network namespaces) with `ckpt_dir = "s3://..."` on the real S3 server (tests/s3_fixtures.py),
listening on the pod bridge's address, the host's side of every pod's default route. No claim
is rendered or mounted; the store's credentials come from a Kubernetes Secret named by
k8s.secret_env. A worker pod deleted while training saves to the store (both nodes' launchers
see the save), the recreated pods resume from that save in the store and the job ends with
every step, its summary in the store (beside the steps: the pods' run dirs go with them).
Neither credential appears in the rendered manifest, the job the server stores, or any log.
That the resumed weights are bit for bit an uninterrupted run's is not compared here again
(an uninterrupted 4-rank job beside this one, ~40% of its time): a resume from the store is
compared in tests/engines/s3/test_ckpt_s3.py, a deleted pod's resume on this cluster in
test_k8s_recovery.py.

In the k8s chunk (marked k8s only: that chunk waits for the control plane's build; the S3
server's own build, if absent, is waited on or built by tests/s3_fixtures.start)."""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import s3_fixtures
from tests.engines.k8s.test_k8s_real import cluster, ddpkit, finished, kubectl, wait_until  # noqa: F401

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
STEPS = 200
BUCKET = "k8s"
HOLD_S = 15  # under torchrun's 30 s shutdown timeout: the SIGTERM save still fits after it


@pytest.fixture(scope="module")
def store(cluster, tmp_path_factory) -> Iterator[s3_fixtures.S3Server]:  # noqa: F811
    """The S3 server on the pod network's gateway (the bridge's address on the host) and
    the Secret `s3cred` holding its keys (given on stdin: no file, no command line)."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (make setup installs it)")
    net = ipaddress.ip_network(cluster["DDPKIT_K8S_POD_CIDR"])
    gateway = str(next(net.hosts()))
    server, proc = s3_fixtures.start(tmp_path_factory.mktemp("s3"), host=gateway)
    try:
        server.bucket(BUCKET)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3cred"},
                  "stringData": {"access": server.access, "secret": server.secret}}  # fmt: skip
        made = kubectl(cluster, "apply", "-f", "-", input=json.dumps(secret))
        assert made.returncode == 0, made.stderr
        yield server
    finally:
        s3_fixtures.stop(proc)


def job_args(name: str, endpoint: str) -> list[str]:
    """2 nodes x 2 processes, checkpoints in the store only (no k8s.pvc_size: no claim)."""
    return ["--nodes", "2", "--gpus", "2", "--set", f"name={name}",
            "--set", f"ckpt_dir=s3://{BUCKET}/{name}", "--set", f"train.steps={STEPS}",
            "--set", "train.ckpt_interval=100", "--set", "train.log_interval=10",
            "--set", f"env.AWS_ENDPOINT_URL={endpoint}", "--set", "env.AWS_DEFAULT_REGION=us-east-1",
            "--set", "k8s.secret_env.AWS_ACCESS_KEY_ID=s3cred/access",
            "--set", "k8s.secret_env.AWS_SECRET_ACCESS_KEY=s3cred/secret"]  # fmt: skip


def test_a_job_with_no_volume_resumes_from_its_save_in_the_store(
    cluster,  # noqa: F811
    store: s3_fixtures.S3Server,
    tmp_path: Path,
) -> None:
    keys = (store.access.encode(), store.secret.encode())
    rendered = ddpkit(cluster, tmp_path, "render", "k8s", *job_args("s3cut", store.endpoint))
    assert rendered.returncode == 0, rendered.stderr
    manifest = rendered.stdout
    assert "persistentVolumeClaim" not in manifest and "kind: PersistentVolumeClaim" not in manifest
    assert "secretKeyRef" in manifest and not any(k.decode() in manifest for k in keys)
    # Rank 3 sleeps HOLD_S at step 45 (the weights are the same): the job sits just past the
    # step-40 line the watcher waits for, so the deletion lands there however slowly kubectl
    # answers. Without it, on a loaded machine it landed as late as the step-100 save (200
    # steps take ~8 s): the job then restarted from step 0.
    hold = ["--set", f"env.DDPKIT_FAULT=hang@45:3:{HOLD_S}"]
    sub = ddpkit(cluster, tmp_path, "submit", "k8s", *job_args("s3cut", store.endpoint), *hold)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    assert not any(k.decode() in sub.stdout + sub.stderr for k in keys)

    deleted: list[str] = []

    def delete_once_training() -> None:
        end = time.monotonic() + 540
        while time.monotonic() < end:
            if f" 40/{STEPS} " in kubectl(cluster, "logs", "s3cut-master-0").stdout:
                if (
                    kubectl(cluster, "delete", "pod", "s3cut-worker-0", "--wait=false").returncode
                    == 0
                ):
                    deleted.append("s3cut-worker-0")
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=delete_once_training, daemon=True)
    watcher.start()
    wait_until("PyTorchJob s3cut finished",
               lambda: finished(cluster, "pytorchjob", "s3cut"), 900, cluster)  # fmt: skip
    watcher.join(timeout=1)
    assert deleted == ["s3cut-worker-0"], "s3cut-worker-0 was never deleted while training"
    pods = Path(cluster["DDPKIT_K8S_STATE"]) / "node" / "pods"
    name = "s3cut"
    if finished(cluster, "pytorchjob", name) != "Succeeded":  # every pod run's log says why
        logs = "".join(f"== {f}\n{f.read_text()[-4000:]}" for f in
                       sorted(pods.glob(f"default_{name}-*/pytorch.log")))  # fmt: skip
        st = ddpkit(cluster, tmp_path, "status", "k8s", name)
        # Last, as CI shows a failure's tail: the operator's reason and each pod's restarts.
        job = kubectl(cluster, "get", "pytorchjob", name, "-o", "json").stdout
        conds = json.loads(job or "{}").get("status", {}).get("conditions", [])
        said = "\n".join(f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                         for c in conds)  # fmt: skip
        listing = kubectl(cluster, "get", "pods", "-o", "wide").stdout
        daemons = sorted((Path(cluster["DDPKIT_K8S_STATE"]) / "logs").glob("*.log"))
        naming = [f"{f.name}: {line}" for f in daemons
                  for line in f.read_text().splitlines()[-4000:] if name in line]  # fmt: skip
        agent = "\n".join(naming[-60:])
        pytest.fail(f"PyTorchJob {name} did not succeed\n{logs}\n{st.stdout}{st.stderr}\n"
                    f"== the daemons' lines naming it (last 60)\n{agent}\n"
                    f"== pods\n{listing}\n== {name}'s conditions\n{said}")  # fmt: skip
    assert kubectl(cluster, "get", "pvc", "-o", "name").stdout.strip() == ""  # no claim at all

    fs = store.fs()
    cut = json.loads(fs.cat_file(f"{BUCKET}/s3cut/summary.json"))
    assert cut["world_size"] == 4 and cut["steps"] == STEPS, cut
    assert fs.exists(f"{BUCKET}/s3cut/step-{STEPS}/.complete")

    state = Path(cluster["DDPKIT_K8S_STATE"])
    pod_logs = sorted((state / "node" / "pods").glob("default_s3*/*.log"))
    text = "".join(f.read_text() for f in pod_logs)
    stored = kubectl(cluster, "get", "pytorchjob", "s3cut", "-o", "yaml")
    assert stored.returncode == 0 and "secretKeyRef" in stored.stdout, stored.stderr
    logs = [*pod_logs, *(state / "logs").rglob("*.log")]  # the pods', the agent's, the servers'
    for blob in [stored.stdout.encode(), *(f.read_bytes() for f in logs)]:
        assert not any(k in blob for k in keys)

    # Both nodes' launchers saw the save (each pod has a run dir of its own: every node's
    # local rank 0 writes the requeue marker), none sent the user to the preemption docs.
    cut_text = "".join(f.read_text() for f in pod_logs if f.parent.name.startswith("default_s3cut"))
    assert cut_text.count("a checkpoint was saved on a stop signal; exit 75") == 2, cut_text
    assert "without a requeue request" not in cut_text, cut_text
    # The resume is from the SIGTERM save (not the step-100 one, nor from scratch).
    assert cut["resumed_from"] is not None, f"s3cut started again from scratch: {cut}"
    step = int(str(cut["resumed_from"]).rsplit("-", 1)[-1])
    assert cut["resumed_from"] == f"s3://{BUCKET}/s3cut/step-{step}" and 45 <= step < 100, cut
    assert f"resumed from s3://{BUCKET}/s3cut/step-{step} at step {step}" in text, text[-3000:]
