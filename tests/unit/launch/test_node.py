"""The node launcher's outcome rules (ddpkit.train.node), in process: which rank is blamed,
which exit status a scheduler sees, and the one forgiven teardown abort.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_node.py."""

from __future__ import annotations

import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REQUEUE
from ddpkit.train.failure import Failure, culprit
from ddpkit.train.launch.outcome import WorkerEnd, last_attempt_exits_0, outcome

from tests.trainrun import as_a_process

TERM, KILL, ABRT, SEGV = (-signal.SIGTERM, -signal.SIGKILL, -signal.SIGABRT, -signal.SIGSEGV)


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


def test_a_worker_reaped_by_torchrun_before_its_watcher_ran_is_noted_with_its_code(monkeypatch):
    """Under load torchrun's poll may reap a worker between its exit waking the watcher and the
    watcher running: waitid then finds no child. The end is still noted, with the code the
    Popen that reaped it read (before: not noted at all, and a SIGKILLed rank's peer that
    gave up waiting for it was reported as the failure, a hang)."""
    from ddpkit.train import diagnosis, goodput
    from ddpkit.train.launch import hooks as node

    noted: list[tuple] = []
    monkeypatch.setattr(goodput, "launcher_end", lambda *a, **k: noted.append(a))
    monkeypatch.setattr(diagnosis, "publish_end", lambda env, rank, code: None)
    monkeypatch.setattr(node, "_STOP_AT", [])
    child = subprocess.Popen([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"])
    child.wait(timeout=30)  # torchrun's poll came first: reaped, returncode -9
    node._watch_end(child.pid, 1, 0, "", None, child)
    assert node.ENDS[child.pid].code == -signal.SIGKILL
    assert noted and noted[0][:2] == (1, -signal.SIGKILL)
