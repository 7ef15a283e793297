"""The node launcher's outcome rules (ddpkit.train.node), in process: which rank is blamed,
which exit status a scheduler sees, and the one forgiven teardown abort.

Here the tests that start processes; the in-process ones in tests/unit/launch/test_node.py.
Helpers both use are in tests/unit/launch/test_node.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddpkit.train.contract import EXIT_FAILED

from tests.unit.launch.test_node import NODE

HERE = f"(node 0, host {socket.gethostname()})"  # where a one-node launch's ranks ran


ABORT_AT_EXIT = """
import atexit, os
import torch

def build(cfg):
    # What a library's C++ teardown does on one rank: abort once everything else is done.
    if os.environ.get("RANK") == "1":
        atexit.register(os.abort)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
"""


@pytest.mark.slow
def test_a_teardown_abort_after_the_summary_exits_0_and_before_it_fails(tmp_path):
    """Rank 1 aborts at interpreter exit. After the kit trainer wrote this launch's
    summary.json that is forgiven (exit 0, one line naming the rank); the same abort in a
    plain script, which leaves no summary, fails and names rank 1, not the rank torchrun
    stopped afterwards."""
    (tmp_path / "abortpkg.py").write_text(ABORT_AT_EXIT)
    node = [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2"]
    train = ["-m", "ddpkit.train", "--model", "abortpkg:build", "--steps", "3", "--no-eval"]
    r = subprocess.run(
        [*node, "--", *train, "--run-dir", "runs/t"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "runs/t/summary.json").is_file()
    assert f"rank 1 {HERE} ended by signal SIGABRT after the run finished" in r.stderr

    (tmp_path / "plain.py").write_text(
        "import torch.distributed as dist\nimport abortpkg\n"
        "dist.init_process_group('gloo'); abortpkg.build(None); dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    r = subprocess.run(
        [*node, "--", "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"rank 1 {HERE} failed (signal SIGABRT)" in r.stderr, r.stderr


def test_a_bad_node_flag_from_torchruns_environment_names_the_variable(tmp_path, one_line_error):
    env = {**os.environ, "PET_NNODES": "abc"}
    r = subprocess.run(
        [*NODE, "--", "s.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert "--nnodes (from PET_NNODES) abc" in one_line_error(r)


def test_a_bad_node_flag_is_named_even_without_an_entry_point(tmp_path, one_line_error):
    r = subprocess.run(
        [*NODE, "--nnodes", "abc"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "--nnodes abc" in one_line_error(r)


# --- a SIGKILLed launcher leaves no workers ---------------------------------------------------

SLEEPER = """
import os, sys, time
from pathlib import Path
Path(f"pid{os.environ['RANK']}.tmp").write_text(str(os.getpid()))
os.replace(f"pid{os.environ['RANK']}.tmp", f"pid{os.environ['RANK']}")
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that may never come, as PID 1 in a container
    often is, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@pytest.mark.slow
def test_the_workers_of_a_user_script_die_with_a_sigkilled_launcher(tmp_path):
    """torchrun starts every worker in a session of its own: without the parent-death
    signal the launcher sets, a user script (which knows nothing of ddpkit) trains on after
    the launcher is SIGKILLed, holding its port and GPU."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    env = {**os.environ, "MKL_DYNAMIC": "TRUE"}  # the job's own value, kept (read below)
    env.pop("OMP_DYNAMIC", None)
    proc = subprocess.Popen(
        [*NODE, "--standalone", "--nproc-per-node", "2", "--", "sleeper.py"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        files = [tmp_path / "pid0", tmp_path / "pid1"]
        assert _wait_for(lambda: all(f.exists() for f in files), 120), "workers never started"
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
        # While they run: the launcher's REPRODUCIBLE_MATH_ENV reached both workers, under
        # the job's own MKL_DYNAMIC.
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert b"OMP_DYNAMIC=FALSE" in environ and b"MKL_DYNAMIC=TRUE" in environ, pid
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_for(lambda: not any(_alive(p) for p in pids), 5), (
            f"workers {[p for p in pids if _alive(p)]} outlived the SIGKILLed launcher"
        )
    finally:
        proc.kill()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- Ctrl-C -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_at_the_launcher_saves_and_stops_with_130_in_one_line_no_requeue(tmp_path):
    """SIGINT (Ctrl-C) reaches the launcher alone (torchrun's workers have sessions of their
    own); torchrun forwards it. Every rank used to print a KeyboardInterrupt traceback: now
    the trainer saves on the way out, writes no requeue marker, and the launch exits 130."""
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*NODE, "--standalone", "--nproc-per-node", "2", "--", "-m", "ddpkit.train",
             "--steps", "100000", "--no-eval", "--progress", "plain", "--log-interval", "1",
             "--run-dir", "runs/t"],
            cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        metrics = tmp_path / "runs/t/metrics.jsonl"
        assert _wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 180), (
            out.read_text()
        )
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "ddpkit node: stopped by SIGINT (Ctrl-C); exit 130, not requeued" in text
    assert list((tmp_path / "runs/t/checkpoints").glob("step-*/.complete")), text
    assert not (tmp_path / "runs/t/requeue.json").exists()


@pytest.mark.slow
def test_a_second_stop_signal_during_the_stop_does_not_change_the_story(tmp_path):
    """Ctrl-C, and another stop signal before torchrun has passed it on (`ddpkit run`
    repeats the SIGINT to the launcher; a scheduler's SIGTERM): the first one decides. It
    used to cut torchrun's shutdown short, whose `finally` then SIGTERMed the workers: the
    trainer saved as for a preemption (`exiting 75 (requeue)`, a requeue marker) under the
    launcher's `stopped by SIGINT`."""
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*NODE, "--standalone", "--nproc-per-node", "2", "--", "-m", "ddpkit.train",
             "--steps", "100000", "--no-eval", "--progress", "plain", "--log-interval", "1",
             "--run-dir", "runs/t"],
            cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        metrics = tmp_path / "runs/t/metrics.jsonl"
        assert _wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 180), (
            out.read_text()
        )
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 130, text
    assert "exiting 75" not in text and "requeue)" not in text, text
    assert text.count("ddpkit node:") == 1, text
    assert "ddpkit node: stopped by SIGINT (Ctrl-C); exit 130, not requeued" in text
    assert "stopped by SIGINT at step" in text, text  # the trainer's one line, the same story
    assert not (tmp_path / "runs/t/requeue.json").exists()


USER_LOOP = """
import time
from pathlib import Path

import torch
import torch.distributed as dist


def step():
    t = torch.ones(4)
    dist.all_reduce(t)
    time.sleep(0.05)


dist.init_process_group("gloo")
Path(f"ready{dist.get_rank()}").write_text("")
while True:
    step()
"""

USER_BOOM = """
import torch.distributed as dist


def fails():
    raise ValueError(f"a real bug on rank {dist.get_rank()}")


dist.init_process_group("gloo")
if dist.get_rank() == 1:
    fails()
dist.barrier()
"""


@pytest.mark.slow
def test_ctrl_c_in_a_user_script_is_one_line_and_130_not_a_traceback_per_rank(tmp_path):
    """A user's own script knows nothing of ddpkit: torchrun forwards SIGINT to every rank,
    and each used to print its KeyboardInterrupt traceback."""
    (tmp_path / "loop.py").write_text(USER_LOOP)
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*NODE, "--standalone", "--nproc-per-node", "2", "--", "loop.py"],
            cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        ready = [tmp_path / "ready0", tmp_path / "ready1"]
        assert _wait_for(lambda: all(f.exists() for f in ready), 120), out.read_text()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text()
    assert code == 130, text
    assert text == "ddpkit node: stopped by SIGINT (Ctrl-C); exit 130, not requeued\n", text


@pytest.mark.slow
def test_a_user_scripts_own_exception_keeps_its_traceback_as_python_prints_it(tmp_path):
    (tmp_path / "boom.py").write_text(USER_BOOM)
    p = subprocess.run(
        [*NODE, "--standalone", "--nproc-per-node", "2", "--", "boom.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == EXIT_FAILED, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("[rank1]: ")]
    assert lines[:3] == [
        "[rank1]: Traceback (most recent call last):",
        f'[rank1]:   File "{tmp_path / "boom.py"}", line 11, in <module>',
        "[rank1]:     fails()",
    ], p.stderr  # the user's frames first: none of the launcher's runner or runpy
    assert lines[-1] == "[rank1]: ValueError: a real bug on rank 1", p.stderr
    assert (
        p.stderr.splitlines()[-1]
        == f"ddpkit node: rank 1 {HERE} failed (exit code 1); see its output above"
    )


OOM_KILLED = """
import os, signal, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(100000):
    dist.all_reduce(torch.ones(4))
    if step == 20 and dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    time.sleep(0.01)
"""

LEAVES_EARLY = """
import datetime, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
# a dataset whose length differs per rank: rank 1 runs out first and returns
for step in range(20 if dist.get_rank() == 1 else 10000):
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
dist.destroy_process_group()
"""

HUNG = """
import datetime, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
for step in range(100000):
    if step == 20 and dist.get_rank() == 1:
        time.sleep(100000)  # hung in its own code: it never calls the next all_reduce
    dist.all_reduce(torch.ones(4))
    time.sleep(0.01)
"""

BARRIER_ON_RANK_0 = """
import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
for step in range(20):
    dist.all_reduce(torch.ones(4))
if dist.get_rank() == 0:
    dist.barrier()
for step in range(200):
    dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "expect"),
    [
        (OOM_KILLED, f"ddpkit node: rank 1 {HERE} failed (signal SIGKILL); "),
        (
            LEAVES_EARLY,
            f"ddpkit node: rank 1 {HERE} left first (exit 0) while the others still ran; "
            f"rank 0 {HERE} then failed",
        ),
        (
            HUNG,
            f"ddpkit node: rank 1 {HERE} never reached the collective all_reduce() at job.py:10 ",
        ),
        (
            BARRIER_ON_RANK_0,
            f"ddpkit node: the ranks called different collectives: rank 0 {HERE} called barrier() "
            f"at job.py:10 (in <module>); rank 1 {HERE} called all_reduce() at job.py:12 (in "
            "<module>)",
        ),
    ],
    ids=["sigkilled", "left-early", "hung", "barrier-on-rank-0"],
)
def test_the_rank_that_stopped_taking_part_is_named_not_the_first_to_notice(
    tmp_path, script, expect
):
    """A user's script at world 2: rank 1 is SIGKILLed, returns early (exit 0) or hangs in
    its own code; rank 0 then fails in its next collective and torchrun stops the rest. The
    line names rank 1: the launcher times every worker's end itself instead of trusting
    torchrun's stamps (whole seconds: rank 0's SIGTERM tied with rank 1's SIGKILL), and a
    rank whose collective failed says, through the rendezvous store, which ranks never
    reached it or called another one (`if rank == 0: dist.barrier()`)."""
    (tmp_path / "job.py").write_text(script)
    p = subprocess.run(
        [*NODE, "--standalone", "--nproc-per-node", "2", "--", "job.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert p.returncode == EXIT_FAILED, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(expect), p.stderr[-3000:]
    assert "rank 0 failed (" not in last, last  # the first to notice is not the cause


def test_a_dir_a_live_job_holds_is_refused_before_any_worker_starts(tmp_path, one_line_error):
    """A second job reaching a running job's checkpoint dir (here through a symlink) is
    refused by the node launcher in one line, before torchrun starts a worker: no rank's
    start-up (torch, model, data, process group) takes a loaded node's CPU from the job
    that holds the dir, and the second run writes nothing."""
    import json

    held = tmp_path / "held"
    held.mkdir()
    owner = subprocess.Popen(["sleep", "300"])
    try:
        lock = {"host": socket.gethostname(), "pid": owner.pid, "agent_pid": None,
                "launch_id": "first", "time": time.time()}  # fmt: skip
        (held / ".lock").write_text(json.dumps(lock))
        (tmp_path / "linked").symlink_to(held)
        p = subprocess.run(
            [*NODE, "--standalone", "--nproc-per-node", "2", "--", "-m", "ddpkit.train",
             "--steps", "2", "--ckpt-dir", "linked", "--run-dir", "runs/second"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        line = one_line_error(p)
        assert line.startswith(f"error: linked is in use by another job (pid {owner.pid} on ")
        assert not (tmp_path / "runs").exists()  # no worker ran: no goodput attempt, no run dir
        assert json.loads((held / ".lock").read_text()) == lock
    finally:
        owner.kill()
        owner.wait()
