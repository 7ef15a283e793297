"""Goodput accounting (train/goodput.py): the report's arithmetic from records, and a real
torchrun job through the node launcher whose worker is SIGKILLed mid-run.

Here the tests that run in this process; those that start processes in
tests/process/train/test_goodput.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ddpkit.train import goodput


def _at(run_dir: Path, kind: str, t: float, launch: str, attempt: int = 0, **f) -> None:
    assert goodput.record(run_dir, kind, time=t, launch=launch, attempt=attempt, **f)


def test_report_splits_wall_time_by_failure_and_survives_a_requeue(tmp_path):
    # attempt 0 (launch a): ready at 12 after a 2 s load; saves at 20 (1 s blocking) and 30;
    # rank 3 SIGKILLed at 34, the group down at 35. Attempt 1 (launch a, in place): ready at
    # 41 after a 1.5 s load; stopped by a preemption at 50. Launch b (the requeue): ready
    # at 70, done at 80.
    _at(tmp_path, "attempt", 10, "a")
    _at(tmp_path, "ready", 12, "a", step=0, load_s=2)
    _at(tmp_path, "save", 20, "a", step=10, blocking_s=1)
    _at(tmp_path, "save", 30, "a", step=20, blocking_s=0)
    _at(tmp_path, "end", 34, "a", rank=3, code=-signal.SIGKILL)
    _at(tmp_path, "end", 35, "a", rank=2, code=-signal.SIGTERM)
    _at(tmp_path, "attempt", 37, "a", attempt=1)
    _at(tmp_path, "ready", 41, "a", attempt=1, step=20, load_s=1.5)
    _at(tmp_path, "stop", 50, "a", attempt=1)
    _at(tmp_path, "attempt", 60, "b")
    _at(tmp_path, "ready", 70, "b", step=29, load_s=1)
    _at(tmp_path, "done", 80, "b", step=40)
    (tmp_path / goodput.GOODPUT_DIR / ".torn.json.tmp").write_text("{")  # a write cut short
    rep = goodput.report(tmp_path)
    assert rep is not None and rep.finished and rep.attempts == 3
    assert rep.wall_s == pytest.approx(70)
    assert rep.productive_s == pytest.approx((30 - 12 - 1) + (50 - 41) + (80 - 70))
    assert rep.ckpt_blocking_s == pytest.approx(1)
    kill, preempt = rep.failures
    assert (kill.kind, kill.rank, kill.attempt, kill.recovered) == ("killed", 3, 0, True)
    assert kill.detect_s == pytest.approx(1)  # 34 -> 35
    assert kill.recompute_s == pytest.approx(4)  # the last save (30) -> the kill (34)
    assert kill.load_s == pytest.approx(1.5)
    assert kill.restart_s == pytest.approx(41 - 35 - 1.5)
    assert preempt.kind == "preempted" and preempt.recompute_s == 0
    assert preempt.restart_s == pytest.approx(70 - 50 - 1)  # the queue wait is lost time
    assert rep.line() == f"goodput {rep.goodput:.0%}: 2 failures, {rep.lost_s:.0f} s lost"
    assert "killed" in rep.table() and "preempted" in rep.table()
    # a long node name (a Kubernetes node's) is printed whole, its column as wide
    rep.failures[0].node = "ddpkit-node-1.example.internal"
    lines = rep.table().splitlines()
    assert "ddpkit-node-1.example.internal" in lines[3]
    assert len({len(x) for x in lines[2:]}) == 1, lines


def test_a_hang_blames_the_rank_waited_for_and_a_silent_node_is_lost(tmp_path):
    _at(tmp_path, "attempt", 0, "a", node="n1")
    _at(tmp_path, "attempt", 0, "a", node="n2")
    _at(tmp_path, "ready", 1, "a")
    _at(tmp_path, "end", 9, "a", rank=0, code=1, missing=[2], node="n1")
    _at(tmp_path, "attempt", 12, "a", attempt=1, node="n1")
    _at(tmp_path, "attempt", 12, "a", attempt=1, node="n2")
    _at(tmp_path, "ready", 13, "a", attempt=1)
    _at(tmp_path, "end", 20, "a", attempt=1, rank=1, code=1, node="n1")  # n2 never spoke
    hang, lost = goodput.report(tmp_path, now=25).failures
    assert (hang.kind, hang.rank) == ("hang", 2)
    assert (lost.kind, lost.node, lost.recovered) == ("node lost", "n2", False)


def test_a_pods_in_place_restart_cut_short_by_its_peers_new_attempt_is_that_failures_recovery(
    tmp_path,
):
    """Kubernetes, a pod lost with every process of it (a drill's kill-node at 10): the
    surviving pod's torchrun restarts its workers in place (k8s-0, attempt 1), which never get
    ready; the lost pod comes back in attempt k8s-1 and the survivor's pod is recreated into it
    (ddpkit.k8s.attempt). One failure, whose restart lasts to k8s-1's ready; not a second,
    silent "node lost" (before, the report booked one per cut-short restart)."""
    _at(tmp_path, "attempt", 0.5, "k8s-0", node="n1")  # (time 0 reads as "now")
    _at(tmp_path, "attempt", 0.5, "k8s-0", node="n2")
    _at(tmp_path, "ready", 1, "k8s-0", load_s=0)
    assert goodput.record(tmp_path, "inject", time=10, what="node lost", node="n2")
    _at(tmp_path, "end", 11, "k8s-0", rank=0, code=1, node="n1")
    _at(tmp_path, "attempt", 13, "k8s-0", attempt=1, node="n1")
    _at(tmp_path, "attempt", 30, "k8s-1", node="n1")
    _at(tmp_path, "attempt", 30, "k8s-1", node="n3")
    _at(tmp_path, "ready", 34, "k8s-1", load_s=1)
    rep = goodput.report(tmp_path, now=40)
    assert rep.attempts == 2 and len(rep.failures) == 1, rep.table()
    (lost,) = rep.failures
    assert (lost.kind, lost.node, lost.recovered) == ("node lost", "n2", True)
    assert lost.detect_s == pytest.approx(1) and lost.restart_s == pytest.approx(34 - 11 - 1)
    # the same restart that failed on its own (a worker ended) is a failure of its own
    _at(tmp_path, "end", 20, "k8s-0", attempt=1, rank=0, code=1, node="n1")
    assert len(goodput.report(tmp_path, now=40).failures) == 2


def test_a_node_whose_launcher_restarted_in_place_was_not_lost(tmp_path):
    """Rank 3 killed on n2; n1's workers' ends went unnoted (torchrun reaped them first, under
    load: a Kubernetes test saw it) but n1's launcher started the next in-place attempt, so
    n1 was not lost: the failure is rank 3's kill, not "node lost" on n1."""
    _at(tmp_path, "attempt", 1, "k8s-0", node="n1")
    _at(tmp_path, "attempt", 1, "k8s-0", node="n2")
    _at(tmp_path, "ready", 2, "k8s-0")
    _at(tmp_path, "end", 9, "k8s-0", rank=3, code=-signal.SIGKILL, node="n2")
    _at(tmp_path, "end", 9.5, "k8s-0", rank=2, code=-signal.SIGTERM, node="n2")
    _at(tmp_path, "attempt", 12, "k8s-0", attempt=1, node="n2")
    assert goodput.report(tmp_path, now=13).failures[0].kind == "node lost"  # n1: no word
    _at(tmp_path, "attempt", 12, "k8s-0", attempt=1, node="n1")
    (killed,) = goodput.report(tmp_path, now=13).failures
    assert (killed.kind, killed.rank, killed.node) == ("killed", 3, "n2")


def test_a_rank_sigkilled_by_the_stop_past_its_budget_does_not_make_its_node_lost(tmp_path):
    """Rank 3 killed on n2; rank 2 beside it did not end within the shutdown budget and got
    the stop's SIGKILL (CI, Kubernetes: read as "node lost" on n2). Every worker of n2 then
    ended by SIGKILL, but one of them by torchrun's stop: the failure is rank 3's kill. Both
    killed at once, neither by the stop: the node's."""
    for node, lo in (("n1", 0), ("n2", 2)):
        _at(tmp_path, "attempt", 1, "k8s-0", node=node, node_number=lo // 2, ranks=[lo, lo + 2])
    _at(tmp_path, "ready", 2, "k8s-0")
    _at(tmp_path, "end", 9, "k8s-0", rank=3, code=-signal.SIGKILL, node="n2")
    _at(tmp_path, "end", 9.6, "k8s-0", rank=0, code=-signal.SIGTERM, node="n1", stopped=True)
    _at(tmp_path, "end", 39.5, "k8s-0", rank=2, code=-signal.SIGKILL, node="n2", stopped=True)
    for node in ("n1", "n2"):
        _at(tmp_path, "attempt", 41, "k8s-0", attempt=1, node=node)
    (killed,) = goodput.report(tmp_path, now=45).failures
    assert (killed.kind, killed.rank, killed.node) == ("killed", 3, "n2")
    other = tmp_path / "lost"
    for node, lo in (("n1", 0), ("n2", 2)):
        _at(other, "attempt", 1, "k8s-0", node=node, node_number=lo // 2, ranks=[lo, lo + 2])
    _at(other, "end", 9, "k8s-0", rank=3, code=-signal.SIGKILL, node="n2")
    _at(other, "end", 9.1, "k8s-0", rank=2, code=-signal.SIGKILL, node="n2")
    _at(other, "end", 9.6, "k8s-0", rank=0, code=-signal.SIGTERM, node="n1", stopped=True)
    (lost,) = goodput.report(other, now=45).failures
    assert (lost.kind, lost.node) == ("node lost", "n2")


def test_a_rank_that_left_before_the_failure_is_named_and_placed(tmp_path):
    """Rank 3 (node 1) returned with exit 0 while rank 0 still ran its collectives; rank 0
    then failed. The rank that left is the culprit, placed by its node's attempt record;
    a rank whose own code had returned before it failed is its own failure."""
    _at(tmp_path, "attempt", 0, "a", node="n1", node_number=0, ranks=[0, 2])
    _at(tmp_path, "attempt", 0, "a", node="n2", node_number=1, ranks=[2, 4])
    _at(tmp_path, "end", 5, "a", rank=3, code=0, returned=4.0, node="n2")
    _at(tmp_path, "end", 9, "a", rank=0, code=1, missing=[3], node="n1")
    _at(tmp_path, "end", 9.2, "a", rank=1, code=-signal.SIGTERM, node="n1")
    (left,) = goodput.report(tmp_path, now=10).failures
    assert (left.kind, left.rank, left.node, left.node_number) == ("left early", 3, "n2", 1)
    assert "failure: left early rank 3 (node 1, host n2) in attempt 0" in "\n".join(
        goodput.status_lines(tmp_path)
    )
    # the failing rank's own code had returned too: it waited on nobody
    _at(tmp_path, "attempt", 20, "b", node="n1", node_number=0, ranks=[0, 2])
    _at(tmp_path, "end", 21, "b", rank=0, code=0, node="n1")
    _at(tmp_path, "end", 22, "b", rank=1, code=-signal.SIGABRT, returned=20.5, node="n1")
    crash = goodput.report(tmp_path, now=25).failures[-1]
    assert (crash.kind, crash.rank, crash.node_number) == ("signal SIGABRT", 1, 0)


def test_a_torchft_jobs_status_has_a_block_per_replica_group(tmp_path):
    """fault_tolerance = "torchft": each group's launcher keeps its records in its own
    group-<g> dir (group 1 restarted once by the supervisor); status shows both, in order."""
    for g in (0, 1, 10):
        _at(tmp_path / f"group-{g}", "attempt", 0, f"g{g}")
        _at(tmp_path / f"group-{g}", "ready", 2, f"g{g}", step=0, load_s=0)
    _at(tmp_path / "group-1", "end", 5, "g1", rank=0, code=-signal.SIGKILL)
    _at(tmp_path / "group-1", "attempt", 7, "g1b")
    (tmp_path / "group-x").mkdir()  # not a group's dir
    lines = goodput.status_lines(tmp_path)
    heads = [line for line in lines if not line.startswith("    ")]
    assert heads == ["  group-0:", "  group-1:", "  group-10:"], lines
    block = lines[lines.index("  group-1:") + 1 :]
    assert block[0].startswith("    goodput ") and "1 failure" in block[0]
    assert block[1].startswith("    failure: killed rank 0"), lines


def test_a_script_that_notes_nothing_gets_failures_and_no_figure(tmp_path):
    _at(tmp_path, "attempt", 0, "a")
    _at(tmp_path, "end", 5, "a", rank=0, code=1)
    rep = goodput.report(tmp_path, now=6)
    assert rep.goodput is None and [f.kind for f in rep.failures] == ["crashed"]
    assert rep.line().startswith("goodput unknown (1 failure")


def test_a_fresh_start_leaves_the_run_dirs_earlier_runs_out(tmp_path):
    # an earlier run in this run dir: a kill, an in-place restart, done
    _at(tmp_path, "attempt", 0.5, "old")
    _at(tmp_path, "ready", 1, "old", step=0, load_s=0, fresh=True)
    _at(tmp_path, "end", 5, "old", rank=1, code=-signal.SIGKILL)
    _at(tmp_path, "attempt", 6, "old", attempt=1)
    _at(tmp_path, "ready", 7, "old", attempt=1, step=3, load_s=1)
    _at(tmp_path, "done", 9, "old", attempt=1, step=10)
    # `--resume never` in the same run dir: a new run from its first attempt on; its own
    # in-place restart keeps the run (a restart is no fresh start: fresh is false there)
    _at(tmp_path, "attempt", 100, "new")
    _at(tmp_path, "ready", 102, "new", step=0, load_s=0, fresh=True)
    _at(tmp_path, "end", 110, "new", rank=0, code=-signal.SIGKILL)
    _at(tmp_path, "attempt", 111, "new", attempt=1)
    _at(tmp_path, "ready", 112, "new", attempt=1, step=0, load_s=0, fresh=False)
    _at(tmp_path, "done", 120, "new", attempt=1, step=10)
    rep = goodput.report(tmp_path)
    assert rep.attempts == 2 and rep.wall_s == pytest.approx(20)
    assert [(f.kind, f.rank) for f in rep.failures] == [("killed", 0)]
    assert len(goodput.read_all(tmp_path)) == 12 and len(goodput.read(tmp_path)) == 6


def test_first_start_counts_restarts_and_requeues(monkeypatch):
    for var in ("TORCHELASTIC_RESTART_COUNT", "DDPKIT_SCHEDULER_ATTEMPT", "DDPKIT_RDZV_ROUND"):
        monkeypatch.delenv(var, raising=False)
    assert goodput.first_start()
    monkeypatch.setenv("DDPKIT_SCHEDULER_ATTEMPT", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert goodput.first_start()
    monkeypatch.setenv("DDPKIT_SCHEDULER_ATTEMPT", "1")  # a requeue: the same run goes on
    assert not goodput.first_start()
    monkeypatch.setenv("DDPKIT_SCHEDULER_ATTEMPT", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")  # an in-place restart
    assert not goodput.first_start()
    # a node restarted for another node's failure keeps torchrun's count 0; the round says it
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("DDPKIT_RDZV_ROUND", "1")
    assert not goodput.first_start()
    monkeypatch.setenv("DDPKIT_RDZV_ROUND", "0")
    assert goodput.first_start()


def test_a_finished_runs_wall_ends_at_its_last_step_and_its_teardown_is_said(tmp_path):
    # done at 150; the launchers note their workers' exit 30 s later (a pod's slow exit). The
    # figure at the last step (the summary's) and after the exit (goodput.json) are one.
    _at(tmp_path, "attempt", 100, "a")
    _at(tmp_path, "ready", 110, "a", step=0, load_s=0)
    _at(tmp_path, "done", 150, "a", step=40)
    at_done = goodput.report(tmp_path)
    _at(tmp_path, "end", 180, "a", rank=1, code=-signal.SIGTERM)
    after = goodput.report(tmp_path, now=300.0)
    assert at_done.wall_s == after.wall_s == pytest.approx(50)
    assert at_done.goodput == after.goodput == pytest.approx(40 / 50)
    assert at_done.teardown_s == 0 and after.teardown_s == pytest.approx(30)
    assert "after the last step 30.0 s" in after.table()
    assert after.to_dict()["teardown_s"] == pytest.approx(30)
    # a run still going is measured to now, with no teardown
    _at(tmp_path / "b", "attempt", 100, "b")
    _at(tmp_path / "b", "ready", 110, "b", step=0, load_s=0)
    going = goodput.report(tmp_path / "b", now=130.0)
    assert going.wall_s == pytest.approx(30) and going.teardown_s == 0


def test_the_stop_srun_sends_after_a_node_was_lost_is_that_failure_not_a_cancel(tmp_path):
    # (times from 1: a record's time 0 means "now") A SLURM job step: node n2 lost at 20 (a drill's note), n1's rank 0 gave up waiting for
    # rank 1 at 26, then srun stopped n1's launcher (SIGTERM, noted as a cancel) at 26.1; the
    # requeued job resumed and finished. Seen in CI: the report said "0 failures".
    _at(tmp_path, "attempt", 1, "j-0", node="n1")
    _at(tmp_path, "attempt", 1, "j-0", node="n2")
    _at(tmp_path, "ready", 2, "j-0", node="n1")
    _at(tmp_path, "save", 10, "j-0", node="n1", step=100)
    goodput.record(tmp_path, "inject", time=20, node="n2", what="node lost")
    _at(tmp_path, "end", 26, "j-0", node="n1", rank=0, code=1, missing=[1])
    _at(tmp_path, "stop", 26.1, "j-0", node="n1", cancel="SIGTERM")
    _at(tmp_path, "attempt", 100, "j-1", node="n1")
    _at(tmp_path, "attempt", 100, "j-1", node="n2")
    _at(tmp_path, "ready", 104, "j-1", node="n1", step=100, load_s=0.2)
    _at(tmp_path, "done", 110, "j-1", node="n1", step=300)
    rep = goodput.report(tmp_path)
    assert rep.cancelled is None
    [lost] = rep.failures
    assert (lost.kind, lost.node, lost.recovered) == ("node lost", "n2", True)
    assert lost.recompute_s == pytest.approx(10)  # the save at 10 -> the loss at 20


def test_a_cancel_whose_signal_reached_the_workers_first_is_still_a_cancel(tmp_path):
    # scancel signals every process of the step: a worker may die of the SIGTERM (or its
    # handler's exit 143) a moment before its launcher notes the stop.
    _at(tmp_path, "attempt", 1, "j-0", node="n1")
    _at(tmp_path, "ready", 2, "j-0", node="n1")
    _at(tmp_path, "end", 30, "j-0", node="n1", rank=0, code=-signal.SIGTERM)
    _at(tmp_path, "end", 30, "j-0", node="n1", rank=1, code=143)
    _at(tmp_path, "stop", 30.2, "j-0", node="n1", cancel="SIGTERM")
    rep = goodput.report(tmp_path, ended=True)
    assert rep.cancelled == "SIGTERM" and rep.failures == []


def test_a_killed_rank_reaped_after_its_peer_gave_up_waiting_is_killed_not_hung(tmp_path):
    # Under load the launcher noted rank 1's SIGKILL after rank 0 had given up waiting for it
    # (seen in tests/process/launch/test_observe_run.py: "hang rank 1" for a killed rank).
    _at(tmp_path, "attempt", 1, "a", node="n1")
    _at(tmp_path, "ready", 2, "a", node="n1")
    _at(tmp_path, "end", 9, "a", node="n1", rank=0, code=1, missing=[1])
    _at(tmp_path, "end", 9.4, "a", node="n1", rank=1, code=-signal.SIGKILL)
    _at(tmp_path, "attempt", 12, "a", attempt=1, node="n1")
    _at(tmp_path, "ready", 13, "a", attempt=1, node="n1")
    [f] = goodput.report(tmp_path, now=20).failures
    assert (f.kind, f.rank) == ("killed", 1)
    # one the launcher stopped (its SIGTERM after the others ended) was hung: a hang
    _at(tmp_path, "end", 14, "a", attempt=1, node="n1", rank=0, code=1, missing=[1])
    _at(tmp_path, "end", 16, "a", attempt=1, node="n1", rank=1, code=-15, stopped=True)
    _at(tmp_path, "attempt", 18, "a", attempt=2, node="n1")
    _, hang = goodput.report(tmp_path, now=20).failures
    assert (hang.kind, hang.rank) == ("hang", 1)
