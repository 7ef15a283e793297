"""Operator emulation: the rendered PyTorchJob's pods, run as local processes with the
environment the Kubeflow controller injects (tests/k8s_fakes.py), train for real."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import yaml

from tests.k8s_fakes import pods, running, wait_all, wait_for
from tools.backends import k8s
from tools.spec import load_spec

pytestmark = pytest.mark.slow

TRAIN = [
    "train.steps=12", "train.batch_size=16", "train.log_interval=1", "train.eval=false",
    "train.synthetic_samples=512", "train.progress=plain", "train.warmup_steps=0",
]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendered_job(*sets: str, nodes: int, gpus: int) -> dict:
    spec = load_spec(
        None,
        ["name=emu", "accelerator=cpu", f"rdzv_port={free_port()}", "k8s.pvc=ckpt", *TRAIN, *sets],
        nodes=nodes,
        gpus=gpus,
    )
    docs = list(yaml.safe_load_all(k8s.render(spec)))
    assert [d["kind"] for d in docs] == ["PyTorchJob"]
    return docs[0]


def summary_of(root: Path) -> dict:
    found = list((root / "pods").glob("*/workspace/runs/emu/summary.json"))
    assert len(found) == 1, found  # rank 0 writes it, in its own pod
    return json.loads(found[0].read_text())


def test_static_job_trains_with_world_size_nodes_times_nproc(tmp_path):
    job = rendered_job("train.ckpt_interval=6", nodes=2, gpus=2)
    with running(pods(job)) as (master, worker):
        _static(tmp_path, master, worker)


def _static(tmp_path, master, worker):
    assert (master.name, worker.name) == ("emu-master-0", "emu-worker-0")
    assert worker.env["WORLD_SIZE"] == "4" and worker.env["PET_NODE_RANK"] == "1"
    assert worker.env["PET_MASTER_ADDR"] == "127.0.0.1"  # <job>-master-0, resolved
    # The worker starts first, as it may on a cluster: it must wait for the master's port.
    worker.start(tmp_path)
    time.sleep(3)
    assert worker.proc.poll() is None and "ddpkit: torchrun" not in worker.log(), worker.log()
    master.start(tmp_path)
    assert wait_all([master, worker], timeout=240) == [0, 0], worker.log() + master.log()
    assert "rendezvous endpoint 127.0.0.1:" in worker.log()
    s = summary_of(tmp_path)
    assert s["world_size"] == 4 and s["steps"] == 12
    assert s["final_loss"] < s["first_loss"]
    # Checkpoints went to the shared claim (the mount path is the checkpoint path).
    ckpts = tmp_path / "pvc" / "ckpt"
    assert (ckpts / "step-12" / ".complete").is_file(), sorted(ckpts.rglob("*"))


def test_elastic_job_recovers_from_a_killed_replica(tmp_path):
    job = rendered_job(
        "k8s.elastic.min=1", "k8s.elastic.max=2", "train.ckpt_interval=2", nodes=2, gpus=1
    )
    with running(pods(job)) as (w0, w1):
        _elastic(tmp_path, w0, w1)


def _elastic(tmp_path, w0, w1):
    assert w0.env["PET_RDZV_ENDPOINT"].startswith("127.0.0.1:")  # <job>-worker-0, resolved
    assert w0.env["PET_NNODES"] == "1:2" and "MASTER_ADDR" not in w0.env
    w0.start(tmp_path)
    # Rank 1 (on worker-1, the second to join) hangs before step 7, after the step-6
    # checkpoint; then the whole replica is killed, like a lost node.
    w1.start(tmp_path, {"DDPKIT_FAULT": "hang@7:1:600"})
    wait_for(lambda: "[fault injection] hang on rank 1" in w1.log(), 180, "the hang", [w0, w1])
    assert "[fault injection]" not in w0.log()
    w1.kill()
    w1.start(tmp_path)  # restartPolicy OnFailure: the kubelet restarts the container
    assert wait_all([w0, w1], timeout=300) == [0, 0], w0.log() + w1.log()
    s = summary_of(tmp_path)
    assert s["world_size"] == 2 and s["steps"] == 12
    assert s["resumed_from"] and Path(s["resumed_from"]).name.startswith("step-")
    assert int(Path(s["resumed_from"]).name[5:]) >= 2
