"""Operator emulation: the rendered PyTorchJob's pods, run as local processes with the
environment the Kubeflow controller injects (tests/k8s_fakes.py), train for real."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from ddpkit.tools.backends import k8s
from ddpkit.tools.spec import load_spec

from tests.k8s_fakes import pods, running, trainjob_pods, wait_all, wait_for

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
    """rank 0 writes it into the run dir, which is on the claim: one file, seen by every pod."""
    found = list((root / "pvc").glob("*/runs/emu/summary.json"))
    assert len(found) == 1, found
    seen = list((root / "pods").glob("*/workspace/runs/emu/summary.json"))
    assert seen and all(p.resolve() == found[0].resolve() for p in seen), seen
    return json.loads(found[0].read_text())


@pytest.mark.slow
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
    assert worker.proc.poll() is None and "ddpkit.train.node" not in worker.log(), worker.log()
    master.start(tmp_path)
    assert wait_all([master, worker], timeout=240) == [0, 0], worker.log() + master.log()
    assert "rendezvous endpoint 127.0.0.1:" in worker.log()
    s = summary_of(tmp_path)
    assert s["world_size"] == 4 and s["steps"] == 12
    assert s["final_loss"] < s["first_loss"]
    # Checkpoints went to the shared claim (the mount path is the checkpoint path).
    ckpts = tmp_path / "pvc" / "ckpt" / "runs" / "emu" / "checkpoints"  # the run dir on the claim
    assert (ckpts / "step-12" / ".complete").is_file(), sorted(ckpts.rglob("*"))


@pytest.mark.slow
def test_trainjob_trains_on_the_torch_distributed_runtime(tmp_path):
    """The Trainer 2.3 TrainJob: its pods as the runtime makes them, the node launcher in each,
    checkpoints on the claim the runtimePatches mount."""
    port = free_port()
    spec = load_spec(
        None,
        ["name=emu", "accelerator=cpu", "k8s.api=trainjob", "k8s.pvc=ckpt",
         "train.ckpt_interval=6", *TRAIN],
        nodes=2, gpus=2,
    )  # fmt: skip
    (job,) = list(yaml.safe_load_all(k8s.render(spec)))
    with running(trainjob_pods(job, port)) as (node0, node1):
        node1.start(tmp_path)  # the other node first: it waits for node 0's port
        node0.start(tmp_path)
        assert wait_all([node0, node1], timeout=240) == [0, 0], node1.log() + node0.log()
    s = summary_of(tmp_path)
    assert s["world_size"] == 4 and s["steps"] == 12
    assert (tmp_path / "pvc" / "ckpt" / "runs/emu/checkpoints/step-12/.complete").is_file()


@pytest.mark.slow
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


# --- the launch script alone (a stand-in torchrun records what it was given) -----------------


def launch_script(tmp_path: Path, env: dict[str, str], wait_s: int = 30) -> tuple[int, str, list]:
    spec = load_spec(None, ["name=emu", "accelerator=cpu"], nodes=2)
    cmd, args = k8s.command(spec)
    args[1] = str(wait_s)
    fake = tmp_path / "bin" / "python"  # records the node launcher's command line
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
    fake.chmod(0o755)
    out = tmp_path / "args.txt"
    out.unlink(missing_ok=True)
    base = {"PATH": f"{fake.parent}:/usr/bin:/bin", "ARGS_OUT": str(out)}
    p = subprocess.run(cmd + args, env=base | env, capture_output=True, text=True, timeout=60)
    got = out.read_text().splitlines() if out.exists() else []
    if got:
        assert got[:2] == ["-m", "ddpkit.train.node"]
        assert got[got.index("--") :][:3] == ["--", "-m", "ddpkit.train"]
        got = got[2:]
    return p.returncode, p.stderr, got


def test_launch_script_waits_for_a_tcp_listener_not_just_dns(tmp_path):
    port = free_port()
    env = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port), "PET_NODE_RANK": "1"}
    listener = socket.socket()

    def listen_later():
        time.sleep(3)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    t = threading.Thread(target=listen_later)
    t.start()
    start = time.monotonic()
    try:
        rc, err, got = launch_script(tmp_path, env)
    finally:
        t.join()
        listener.close()
    assert rc == 0, err
    assert time.monotonic() - start >= 3  # it waited for the port
    assert "rendezvous endpoint 127.0.0.1:" in err and "--rdzv-conf" not in got
    # the node launcher's flags (it adds the contract's torchrun flags itself)
    assert got[: got.index("--")] == [
        "--run-dir", "runs/emu", "--shutdown-timeout", "30", "--max-restarts=0"]  # fmt: skip


def test_launch_script_rank0_does_not_wait_and_others_give_up_with_a_message(tmp_path):
    env = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(free_port())}
    rc, err, got = launch_script(tmp_path, env | {"PET_NODE_RANK": "0"}, wait_s=1)
    assert rc == 0 and got, err
    # A name that does not resolve (a Service not created yet) is waited on too.
    missing = {"PET_MASTER_ADDR": "emu-master-0.invalid", "PET_NODE_RANK": "1"}
    rc, err, got = launch_script(tmp_path, env | missing, wait_s=1)
    assert rc == 1 and not got
    assert "rendezvous endpoint emu-master-0.invalid:" in err and "not reachable" in err
    rc, err, got = launch_script(tmp_path, {}, wait_s=1)
    assert rc != 0 and "not started by a PyTorchJob/TrainJob controller" in err


def test_launch_script_elastic_host_is_worker_0(tmp_path):
    port = free_port()
    env = {"PET_RDZV_ENDPOINT": f"127.0.0.1:{port}", "PET_RDZV_CONF": "join_timeout=60"}
    rc, err, got = launch_script(tmp_path, env | {"POD_NAME": "emu-master-0"}, wait_s=1)
    assert rc == 0 and got[:2] == ["--rdzv-conf", "join_timeout=60,is_host=1"], err
    rc, err, got = launch_script(tmp_path, env | {"POD_NAME": "emu-worker-1"}, wait_s=1)
    assert rc == 1 and "not reachable" in err  # worker 1 waits for the host


def test_launch_script_refuses_rdma_without_an_unlimited_memlock(tmp_path):
    """This machine's memlock limit is finite (and a non-root process cannot raise it): an
    RDMA job stops at once with the fix instead of NCCL failing to register memory."""
    import resource

    assert resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] != resource.RLIM_INFINITY
    env = {"PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "1", "PET_NODE_RANK": "0"}
    rc, err, got = launch_script(tmp_path, env | {"DDPKIT_REQUIRE_MEMLOCK": "unlimited"}, wait_s=1)
    assert rc == 1 and not got
    assert "RDMA needs an unlimited locked-memory limit" in err and "LimitMEMLOCK=infinity" in err
    assert err.count("\n") == 1
    rc, err, got = launch_script(tmp_path, env, wait_s=1)  # no RDMA: no such check
    assert rc == 0 and got, err


def test_launch_script_passes_shellcheck():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    p = subprocess.run([str(shellcheck), str(k8s.LAUNCH_SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout
