"""Failure classes (train/failclass.py): a user's script whose own code raises is not retried
into the job's restart budget (the default, 3), driven from its project by `ddpkit run`.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_failclass.py."""

from __future__ import annotations

import pytest
from ddpkit.train import failure
from ddpkit.train.launch import verdicts


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (KeyError("label"), failure.CODE),
        (ValueError("shapes (3,) and (4,) not aligned"), failure.CODE),
        (RuntimeError("Connection closed by peer [10.0.0.2]:4242"), failure.INFRA),
        (RuntimeError("NCCL communicator was aborted on rank 3"), failure.INFRA),
        (TimeoutError("store get"), failure.INFRA),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), failure.INFRA),
    ],
)
def test_the_cause_of_an_exception(error, cause):
    assert failure.cause_of(error) == cause
    assert failure.is_code_failure(1, cause) is (cause == failure.CODE)


def test_bad_input_and_divergence_are_never_retried_and_signals_always_are():
    assert failure.is_code_failure(2, "") and failure.is_code_failure(3, "")
    assert not failure.is_code_failure(-9, failure.CODE)
    assert not failure.is_code_failure(1, "")  # unexplained: a restart may cure it


def test_a_node_that_failed_twice_is_excluded_from_the_requeue(tmp_path):
    from ddpkit.train import goodput

    def attempt(launch: str, t: float, lost: str) -> None:  # two nodes; `lost` never reports
        for node in ("c1", "c2"):
            goodput.record(tmp_path, "attempt", time=t, launch=launch, node=node)
        other = "c2" if lost == "c1" else "c1"
        goodput.record(tmp_path, "end", time=t + 5, launch=launch, node=other, rank=0, code=143)

    attempt("job-0", 0, "c2")
    again, bad, line = verdicts.requeue_verdict(str(tmp_path), "job-0", 137, 0, 3)
    assert again and bad == [] and "requeue 1 of 3" in line
    attempt("job-1", 10, "c1")
    attempt("job-2", 20, "c2")  # c2's second failure
    again, bad, line = verdicts.requeue_verdict(str(tmp_path), "job-2", 137, 2, 3)
    assert again and bad == ["c2"] and "excluding c2 (failed 2 times" in line
    again, _, line = verdicts.requeue_verdict(str(tmp_path), "job-2", 137, 3, 3)
    assert not again and "requeue limit (3) is reached" in line
    assert not verdicts.requeue_verdict(str(tmp_path), "job-2", 143, 0, 3)[0]  # a scancel
    from ddpkit.train import goodput as gp

    lines = gp.status_lines(tmp_path)
    assert any("excluded from the next attempt (SLURM): c2 (failed 2 times" in x for x in lines)
    assert gp.report(tmp_path).to_dict()["failing_nodes"] == ["c2"]


def test_a_one_node_job_whose_node_dies_twice_excludes_it_on_the_second(tmp_path):
    """Every process of the job's only node SIGKILLed: no end record is left, yet the batch
    shell's verdict counts this attempt's loss, so the second failure excludes the node."""
    from ddpkit.train import goodput

    goodput.record(tmp_path, "attempt", time=1, launch="job-0", node="c1")
    goodput.record(tmp_path, "ready", time=2, launch="job-0", node="c1", step=0, load_s=0)
    again, bad, line = verdicts.requeue_verdict(str(tmp_path), "job-0", 137, 0, 3)
    assert again and bad == [] and "requeue 1 of 3" in line
    goodput.record(tmp_path, "attempt", time=10, launch="job-1", node="c1")
    again, bad, line = verdicts.requeue_verdict(str(tmp_path), "job-1", 137, 1, 3)
    assert again and bad == ["c1"] and "requeue 2 of 3, excluding c1" in line
    lost = goodput.report(tmp_path, ended=True).failures
    assert [(f.kind, f.node) for f in lost] == [("node lost", "c1")] * 2
    assert goodput.report(tmp_path).failures[0].recovered  # without `ended`: the last runs on
