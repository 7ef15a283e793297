"""The node launcher's outcome rules (ddpkit.train.node), in process: which rank is blamed,
which exit status a scheduler sees, and the one forgiven teardown abort."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REQUEUE
from ddpkit.train.failure import Failure, culprit
from ddpkit.train.launch.outcome import WorkerEnd, last_attempt_exits_0, outcome

from tests.trainrun import as_a_process

TERM, KILL, ABRT, SEGV = (-signal.SIGTERM, -signal.SIGKILL, -signal.SIGABRT, -signal.SIGSEGV)
HERE = f"(node 0, host {socket.gethostname()})"  # where a one-node launch's ranks ran


def test_the_rank_that_failed_first_is_blamed_not_the_one_torchrun_stopped():
    # rank 1 raised (exit 1); torchrun then SIGTERMed rank 0, which reports too.
    failures = {0: Failure(TERM, 100.0), 1: Failure(1, 100.0)}
    assert culprit(failures)[0] == 1
    code, line = outcome(failures, marker_fresh=False)
    assert code == EXIT_FAILED and "rank 1 failed (exit code 1)" in line


def test_an_abort_that_torchrun_answered_with_sigterm_names_the_aborting_rank():
    failures = {0: Failure(TERM, 5.0), 1: Failure(ABRT, 5.0)}
    code, line = outcome(failures, marker_fresh=False)
    assert code == EXIT_FAILED and "rank 1 failed (signal SIGABRT)" in line


def test_among_real_failures_the_earliest_wins_then_the_lowest_rank():
    assert culprit({0: Failure(1, 9.0), 3: Failure(1, 4.0)})[0] == 3
    assert culprit({2: Failure(1, 4.0), 1: Failure(1, 4.0)})[0] == 1
    assert culprit({2: Failure(TERM), 1: Failure(KILL)})[0] == 1  # all collateral: lowest


@pytest.mark.parametrize(
    ("failures", "finished", "expect"),
    [
        ({0: Failure(TERM), 1: Failure(ABRT)}, True, EXIT_OK),  # the forgiven case
        ({1: Failure(ABRT)}, True, EXIT_OK),
        ({1: Failure(ABRT)}, False, EXIT_FAILED),  # no summary of this launch: a crash
        ({1: Failure(SEGV)}, True, EXIT_FAILED),  # not a teardown abort
        ({1: Failure(1)}, True, EXIT_FAILED),  # an exit code is the program's own word
        ({1: Failure(EXIT_BAD_INPUT)}, True, EXIT_BAD_INPUT),
    ],
)
def test_only_an_abort_after_this_launchs_summary_is_forgiven(failures, finished, expect):
    code, line = outcome(failures, marker_fresh=False, finished=finished)
    assert code == expect
    if expect == EXIT_OK:
        assert "after the run finished" in line and "exit 0" in line


def test_a_fresh_requeue_marker_wins_over_collateral_failures():
    assert outcome({0: Failure(TERM)}, marker_fresh=True)[0] == EXIT_REQUEUE
    assert outcome({}, marker_fresh=False) == (EXIT_OK, None)


# --- real processes -------------------------------------------------------------------------

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


# --- the launcher's own flags ---------------------------------------------------------------

NODE = [sys.executable, "-m", "ddpkit.train.node"]


@pytest.mark.parametrize(
    ("flags", "named", "accepted"),
    [
        (["--nnodes", "abc"], "--nnodes abc", "MIN:MAX"),
        (["--nnodes", "0"], "--nnodes 0", ">= 1"),
        (["--nnodes", "3:2"], "--nnodes 3:2", "MIN <= MAX"),
        (["--shutdown-timeout", "nan"], "--shutdown-timeout nan", "(0, 604800]"),
        (["--shutdown-timeout", "-5"], "--shutdown-timeout -5", "(0, 604800]"),
        (["--shutdown-timeout", "inf"], "--shutdown-timeout inf", "(0, 604800]"),
        (["--shutdown-timeout", "1e30"], "--shutdown-timeout 1e+30", "(0, 604800]"),
        (["--nproc-per-node", "0"], "--nproc-per-node 0", ">= 1"),
        (["--nproc-per-node", "two"], "--nproc-per-node two", "gpu, cpu, auto"),
        (["--max-restarts", "-1"], "--max-restarts -1", ">= 0"),
        (["--max-restarts", "x"], "--max-restarts", "invalid int value"),
        (["--monitor-interval", "0"], "--monitor-interval 0", "(0, 3600]"),
        (["--node-rank", "-1"], "--node-rank -1", "0..0"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank 2", "0..1"),
        (["--master-port", "70000"], "--master-port 70000", "1..65535"),
    ],
)
def test_a_bad_number_for_a_node_flag_is_one_line_and_starts_nothing(
    tmp_path, one_line_error, flags, named, accepted, monkeypatch, capfd
):
    """The launcher's main in this process, as `python -m ddpkit.train.node` runs it (its exit
    status is run_cli's; the two tests below run the process itself): a process per flag
    would import torch again. A warning that a process would print counts as a second line."""
    from ddpkit.train.errors import run_cli
    from ddpkit.train.launch import node

    (tmp_path / "s.py").write_text("open('started', 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    argv = ["--standalone", *flags, "--", "s.py"]
    rc, out, err = as_a_process(capfd, lambda: run_cli(lambda: node.main(argv)))
    line = one_line_error(subprocess.CompletedProcess([*NODE, *argv], rc, out, err))
    assert named in line and accepted in line, line
    assert not (tmp_path / "started").exists()


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


def test_the_rank_another_rank_waited_for_is_blamed_not_the_one_that_timed_out():
    # rank 0 timed out in a collective rank 1 never reached; torchrun then stopped rank 1
    # (its watchdog gives up: stuck) or it had died by SIGKILL.
    waited = Failure(1, 10.0, missing=(1,), phase="final barrier after the last step (6)")
    for rank1 in (Failure(1, 12.0, stuck=True), Failure(KILL, 9.0), Failure(TERM, 11.0)):
        code, line = outcome({0: waited, 1: rank1}, marker_fresh=False)
        assert code == EXIT_FAILED
        assert line.startswith("ddpkit node: rank 1 never reached the collective final barrier")
    # a missing rank that failed of its own accord (a Python error): its own exit is the clue
    code, line = outcome({0: waited, 1: Failure(1, 9.0)}, marker_fresh=False)
    assert "rank 1 failed (exit code 1)" in line


def test_a_rank_that_took_another_path_is_blamed_as_its_diagnosis_says():
    said = "rank 0 called barrier() at m.py:3 (in forward), while rank 1 was in the ..."
    failures = {0: Failure(1, 5.0, blame=said), 1: Failure(1, 5.0, blame=said)}
    assert outcome(failures, marker_fresh=False) == (EXIT_FAILED, f"ddpkit node: {said}")


def test_a_rank_stuck_after_torchruns_sigterm_is_not_the_culprit():
    # rank 1 was SIGKILLed; torchrun SIGTERMed rank 0, whose watchdog left with exit 1
    failures = {0: Failure(1, 12.0, stuck=True), 1: Failure(KILL, 9.0)}
    assert outcome(failures, marker_fresh=False)[1].startswith("ddpkit node: rank 1 failed")


def test_with_exact_ends_the_first_rank_to_end_is_blamed_whatever_its_signal():
    # rank 1 SIGKILLed (the OOM killer); rank 0's collective failed 10 ms later (exit 1):
    # torchrun's whole-second stamps tie them, the launcher's own times do not.
    failures = {0: Failure(1, 100.01, exact=True), 1: Failure(KILL, 100.0, exact=True)}
    code, line = outcome(failures, marker_fresh=False)
    assert code == EXIT_FAILED and "rank 1 failed (signal SIGKILL)" in line
    # and the SIGTERM torchrun sent rank 0 afterwards is never the cause
    assert (
        culprit({0: Failure(TERM, 100.2, exact=True), 1: Failure(KILL, 100.0, exact=True)})[0] == 1
    )


def test_a_rank_that_left_with_exit_0_before_the_failure_is_named():
    failures = {0: Failure(1, 50.0, exact=True)}
    code, line = outcome(failures, marker_fresh=False, left={1: 49.0})
    assert code == EXIT_FAILED and line.startswith("ddpkit node: rank 1 left first (exit 0)")
    assert "rank 0 then failed (exit code 1)" in line
    # after the failure but before torchrun began stopping the workers: it left by itself
    assert "rank 1 left first" in outcome(failures, False, left={1: 50.2}, stopped_at=50.3)[1]
    # after torchrun's stop (a script that handles its SIGTERM and returns): no clue
    assert "left first" not in outcome(failures, False, left={1: 50.5}, stopped_at=50.3)[1]

    # rank 0's collective diagnosis says rank 1 never reached it: the exit 0 says why
    waited = {0: Failure(1, 50.0, missing=(1,), phase="all_reduce()", exact=True)}
    assert "rank 1 left first (exit 0)" in outcome(waited, False, left={1: 49.0})[1]


def test_a_rank_that_fails_in_its_exit_after_its_code_returned_is_named_alone():
    """Every rank's code returned; rank 1 then aborted in interpreter teardown: nobody was
    left waiting, so no rank 'left first', the failure is rank 1's own."""
    abrt = -signal.SIGABRT
    code, line = outcome({1: Failure(abrt, 50.0, exact=True)}, False, left={0: 49.0, 1: 49.5})
    assert code == EXIT_FAILED and "left first" not in line
    assert line.startswith("ddpkit node: rank 1 failed (signal SIGABRT)")


def test_only_the_last_attempts_exits_0_count():
    ends = {
        11: WorkerEnd(rank=1, code=0, when=49.0, attempt=1),
        12: WorkerEnd(rank=2, code=-9, when=48.0, attempt=1),
        13: WorkerEnd(rank=3, code=0, when=10.0, attempt=0),
        # its script had returned; torchrun's SIGTERM found it still exiting: it left at 47.5
        14: WorkerEnd(rank=4, code=TERM, when=50.0, attempt=1, returned=47.5),
    }
    assert last_attempt_exits_0(ends) == {1: 49.0, 4: 47.5}


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


def test_a_python_whose_torch_does_not_import_is_one_line_before_anything_starts(tmp_path):
    """The local backend runs no separate import check for torch (issue 34: it cost a second
    interpreter's torch import on every run); the node launcher is that check: one line, exit 2,
    no traceback, no run dir."""
    code = (
        "import sys; sys.modules['torch'] = None; from ddpkit.train.launch import node; "
        "from ddpkit.train.errors import run_cli; "
        "sys.exit(run_cli(lambda: node.main(['--standalone', '--nproc-per-node=1', '--', "
        "'train.py'])))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == EXIT_BAD_INPUT, r.stderr
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1 and "torch does not import with" in lines[0], lines
    assert "install torch" in lines[0] and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


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


def test_ranks_on_other_nodes_are_placed_from_the_rendezvous_store(monkeypatch):
    """What node 0's launcher learns at torchrun's rank assignment (ddpkit.train.launch.hooks): each
    node's entry in the (real) store, ranks in node order; every line names a rank so."""
    import json

    from ddpkit.train import places
    from ddpkit.train.launch import hooks
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    store.set("ddpkit/place/0", json.dumps({"node": 1, "host": "node2", "n": 2}))
    store.set("ddpkit/place/1", json.dumps({"node": 0, "host": "node1", "n": 2}))
    monkeypatch.setattr(places, "PLACES", {})
    hooks._learn(store, 0, 2, [])
    assert places.PLACES == {0: (1, "node2"), 1: (1, "node2"), 2: (0, "node1"), 3: (0, "node1")}
    assert places.name(3) == "rank 3 (node 0, host node1)" and places.name(9) == "rank 9"
    assert places.names([1, 2]) == "ranks 1 (node 1, host node2), 2 (node 0, host node1)"
    said = "rank 0 called barrier() at m.py:3 (in forward), while rank 3 was in the step"
    assert places.placed(said) == (
        "rank 0 (node 1, host node2) called barrier() at m.py:3 (in forward), while "
        "rank 3 (node 0, host node1) was in the step"
    )
    waited = {0: Failure(1, 10.0, missing=(3,), phase="all_reduce()")}
    assert outcome(waited, marker_fresh=False)[1].startswith(
        "ddpkit node: rank 3 (node 0, host node1) never reached the collective all_reduce()"
    )


@pytest.mark.parametrize(
    ("exit_code", "published"),
    [(1, True), (130, False), (-signal.SIGINT, False), (-signal.SIGTERM, False)],
    ids=["failed", "ctrl-c 130", "ctrl-c signal", "sigterm"],
)
def test_a_workers_failure_is_published_to_its_peers_but_not_a_stops_own_end(
    monkeypatch, exit_code, published
):
    """_watch_end on a real child: a failure goes to the attempt's store (diagnosis.publish_end), a
    Ctrl-C's or a stop's end does not (after one, the store may be gone, and torch's client
    printed a warning after the launcher's one line)."""
    from ddpkit.train import diagnosis, goodput
    from ddpkit.train.launch import hooks as node

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        diagnosis, "publish_end", lambda env, rank, code: calls.append((rank, code))
    )
    monkeypatch.setattr(goodput, "launcher_end", lambda *a, **k: None)
    monkeypatch.setattr(node, "_STOP_AT", [])

    class Inline:  # the publishing thread, run at start(): no wait for it, however loaded
        def __init__(self, target, args, daemon):
            self.run = lambda: target(*args)

        def start(self):
            self.run()

    monkeypatch.setattr(node, "threading", SimpleNamespace(Thread=Inline))
    # The child dies by the signal whatever this process inherited: a shell without job control
    # starts a background job with SIGINT ignored, and an ignored SIGINT is inherited across
    # exec, so the child lived on and exited 0 (CI's cold run, issue 54 item 25: reproduced by
    # running this test under SIG_IGN; the launcher read the child's real end correctly).
    body = (
        f"import os, signal; signal.signal({-exit_code}, signal.SIG_DFL); "
        f"os.kill(os.getpid(), {-exit_code})"
        if exit_code < 0
        else f"raise SystemExit({exit_code})"
    )
    child = subprocess.Popen([sys.executable, "-c", body])
    try:
        node._watch_end(child.pid, 1, 0, "", {"MASTER_ADDR": "127.0.0.1"})
    finally:
        child.wait(timeout=30)
    assert node.ENDS[child.pid].code == exit_code
    assert calls == ([(1, exit_code)] if published else [])
