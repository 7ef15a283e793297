"""`ddpkit chaos`: a fault drill against a real job run from a user's project (torchrun
processes, real SIGKILL and SIGSTOP), and its report.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_chaos.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ddpkit.tools.chaos import ChaosError, Injection


@pytest.mark.parametrize(
    "text",
    ["crash@step=3", "kill-rank", "kill-rank@when=3", "kill-rank@step=x", "stop-rank@step=3:pid=4"],
)
def test_a_bad_injection_is_one_line(text):
    import random

    with pytest.raises(ChaosError, match="--inject"):
        Injection.parse(text, random.Random(0))


def test_random_times_follow_the_seed():
    import random

    a = Injection.parse("preempt@random=10-20", random.Random(7))
    b = Injection.parse("preempt@random=10-20", random.Random(7))
    assert a == b and a.when == "time" and 10 <= a.at <= 20


@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(),
    reason="a mount namespace of its own needs root and unshare",
)
def test_a_worker_is_found_by_its_run_dir_inside_its_own_mount_namespace(tmp_path):
    """A pod's or a container's worker got its run dir at another path (a bind mount in its
    own mount namespace): the drill finds it by the directory, read through /proc/PID/root,
    not by the path string, so `--attach` to the claim's directory reaches a pod's ranks."""
    from ddpkit.tools import chaos

    run = tmp_path / "claim" / "runs" / "j"  # what this machine sees
    run.mkdir(parents=True)
    inside = tmp_path / "ws"  # where the worker sees it: <ws>/runs/j, a bind mount
    (inside / "runs" / "j").mkdir(parents=True)
    script = (
        f"mount --bind {run} {inside}/runs/j && cd {inside} && "
        "exec env RANK=1 GROUP_RANK=0 DDPKIT_RUN_DIR=runs/j sleep 30"
    )
    p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash", "-c", script])
    try:
        for _ in range(100):
            found = [w for w in chaos.workers(run) if w.pid == p.pid]
            if found:
                break
            time.sleep(0.1)
        assert [(w.rank, w.node_rank) for w in found] == [(1, 0)]
        # the same path string on this machine is an empty dir, not the run dir: not matched
        assert not [w for w in chaos.workers(inside / "runs" / "j") if w.pid == p.pid]
    finally:
        p.kill()
        p.wait()


def test_the_preemption_signal_is_the_target_jobs_own(monkeypatch):
    """A SLURM job requeues on its --signal (USR1 by default) only: the drill sends the signal
    the launcher's environment names, not its own default (SIGTERM read as a cancel)."""
    from ddpkit.tools import chaos
    from ddpkit.train.contract import REQUEUE_SIGNALS_ENV

    monkeypatch.delenv(REQUEUE_SIGNALS_ENV, raising=False)
    env = {**os.environ, REQUEUE_SIGNALS_ENV: "SIGUSR2"}
    p = subprocess.Popen(["sleep", "30"], env=env)
    try:
        # Popen returns once exec has begun; the kernel fills the new image's environment a
        # moment later (until then /proc/PID/environ reads empty: seen once in CI).
        deadline = time.monotonic() + 10
        while not chaos._environ(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert chaos._preempt_signal(p.pid) == signal.SIGUSR2
    finally:
        p.kill()
        p.wait()


def test_an_attached_drill_ends_with_the_runs_last_attempt_not_an_earlier_runs_end():
    from ddpkit.tools.chaos import _ended

    recs = [{"kind": "attempt", "time": 1.0}, {"kind": "finished", "time": 9.0}]
    assert _ended(recs)  # a user's script: node 0's launcher exited 0
    assert _ended([{"kind": "attempt", "time": 1.0}, {"kind": "done", "time": 8.0}])
    assert not _ended([*recs, {"kind": "attempt", "time": 12.0}])  # the run dir used again
    assert not _ended([{"kind": "attempt", "time": 1.0}])
