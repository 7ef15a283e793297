"""The node launcher's outcome rules (ddpkit.train.node), in process: which rank is blamed,
which exit status a scheduler sees, and the one forgiven teardown abort."""

from __future__ import annotations

import signal

import pytest
from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_REQUEUE
from ddpkit.train.node import Failure, culprit, outcome

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
    import subprocess
    import sys

    (tmp_path / "abortpkg.py").write_text(ABORT_AT_EXIT)
    node = [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2"]
    train = ["-m", "ddpkit.train", "--model", "abortpkg:build", "--steps", "3", "--no-eval"]
    r = subprocess.run(
        [*node, "--", *train, "--run-dir", "runs/t"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "runs/t/summary.json").is_file()
    assert "rank 1 ended by signal SIGABRT after the run finished" in r.stderr

    (tmp_path / "plain.py").write_text(
        "import torch.distributed as dist\nimport abortpkg\n"
        "dist.init_process_group('gloo'); abortpkg.build(None); dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    r = subprocess.run(
        [*node, "--", "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rank 1 failed (signal SIGABRT)" in r.stderr, r.stderr
