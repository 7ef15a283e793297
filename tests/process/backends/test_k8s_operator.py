"""The pods' launch script (k8s/launch.sh) alone, with a stand-in node launcher: what the
local cluster cannot show (a listener that comes late, a name that never resolves, the RDMA
memlock check on a machine without RDMA).

The operator emulation that ran the rendered pods as local processes with the environment
the controllers inject (tests/k8s_fakes.py) is gone: tests/engines/k8s/test_k8s_real.py trains the same
static PyTorchJob, TrainJob and elastic job on the real controllers.

Here the tests that start processes; the in-process ones in
tests/unit/backends/test_k8s_operator.py. Helpers both use are in
tests/unit/backends/test_k8s_operator.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

from tests.unit.backends.test_k8s_operator import launch_script


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    # the node launcher's flags (it adds the contract's torchrun flags itself), with the
    # in-place budget every backend runs (JobSpec.restart_budget)
    assert got[: got.index("--")] == [
        "--run-dir", "runs/emu", "--shutdown-timeout", "30", "--max-restarts=3"]  # fmt: skip


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


WATCHER = """\
import sys, time
from ddpkit.k8s import attempt
run = sys.argv[1]
attempt.watch_for_newer(run, attempt.join_attempt(run, "node0", "a"), "node0", every=0.05)
print("watching", flush=True)
time.sleep(30)
"""


def test_a_pod_whose_peer_was_recreated_alone_is_recreated_into_the_same_attempt(tmp_path):
    """A pod lost with every process of it comes back in the next attempt; its peer, restarted
    in place by torchrun, would wait at its own attempt's store keys and never meet it (a
    drill lost 401 s to that): the peer's pod exits EXIT_RESTART_POD to be recreated into the
    new attempt, with one line. A non-host pod starts its launcher only once the host pod is
    in its attempt, and gives up with a line when it never comes."""
    from ddpkit.k8s import attempt

    run = tmp_path / "run"
    assert attempt.join_attempt(run, "node1", "c") == 0
    peer = subprocess.Popen([sys.executable, "-c", WATCHER, str(run)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert peer.stdout.readline() == "watching\n"
        time.sleep(0.3)
        assert peer.poll() is None  # nothing newer: it runs on
        assert attempt.join_attempt(run, "node1", "d") == 1  # node1's pod recreated alone
        _, err = peer.communicate(timeout=20)
    finally:
        peer.kill()
    assert peer.returncode == attempt.EXIT_RESTART_POD, err
    assert "node0: another pod of the job started attempt 1 (this pod is in 0)" in err, err
    # node1 in attempt 1 waits for the host pod's start in attempt 1, then for its endpoint
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(
        attempt.wait_for_host(str(run), 1, "node1", wait_s=20, every=0.05)))  # fmt: skip
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()
    assert attempt.join_attempt(run, "node0", "b") == 1
    waiter.join(timeout=10)
    assert got == [None]
    assert attempt.wait_for_host(str(run), 0, "node1", wait_s=5, every=0.05) is None  # there too
    attempt.join_attempt(run, "node1", "e")  # attempt 2 begins while a pod waits in 1
    assert attempt.wait_for_host(str(run), 1, "node1", wait_s=5) is None  # the host is in 1 already
    assert (
        attempt.wait_for_host(str(run), 3, "node1", wait_s=0.2, every=0.05) == attempt.EXIT_FAILED
    )
    attempt.join_attempt(run, "node1", "f")  # attempt 3
    assert (
        attempt.wait_for_host(str(run), 2, "node1", wait_s=5, every=0.05)
        == attempt.EXIT_RESTART_POD
    )
