"""The goodput timeline picture (tools/timeline.py, `ddpkit plot RUN_DIR --timeline`): what it
draws from a run's records, read back from the matplotlib artists. A unit test at heart, in
the process tier for matplotlib's import alone (1-5 s on this machine)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ddpkit.tools import timeline
from ddpkit.train import goodput


def _at(run_dir: Path, kind: str, t: float, launch: str = "a", attempt: int = 0, **f) -> None:
    assert goodput.record(run_dir, kind, time=t, launch=launch, run="r", attempt=attempt, **f)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """Attempt 0: ready at 12 (2 s load), saves at 20 (1 s blocking) and 30, rank 1 on n1
    killed at 34 (its peer down at 35); attempt 1 ready at 41 (1.5 s load), preempted at 50;
    the requeue (launch b) ready at 70 after a 1 s load, a save at 75, done at 80."""
    d = tmp_path / "myrun"
    _at(d, "attempt", 10, ranks=[0, 2], node="n1")
    _at(d, "ready", 12, step=0, load_s=2)
    _at(d, "save", 20, step=10, blocking_s=1)
    _at(d, "save", 30, step=20, blocking_s=0)
    _at(d, "end", 34, rank=1, code=-signal.SIGKILL, node="n1")
    _at(d, "end", 35, rank=0, code=1, node="n1")
    _at(d, "attempt", 37, attempt=1)
    _at(d, "ready", 41, attempt=1, step=20, load_s=1.5)
    _at(d, "stop", 50, attempt=1)
    _at(d, "attempt", 60, launch="b")
    _at(d, "ready", 70, launch="b", step=29, load_s=1)
    _at(d, "save", 75, launch="b", step=35, blocking_s=0.2)
    _at(d, "done", 80, launch="b", step=40)
    return d


def _patches(ax, gid: str) -> list:
    return [p for p in ax.patches if p.get_gid() == gid]


def test_the_timeline_draws_each_attempt_failure_cost_and_save(run_dir):
    recs, rep = goodput.read(run_dir), goodput.report(run_dir)
    kill, preempt = rep.failures
    tl = timeline.build(recs, rep)
    fig = timeline.figure(tl, "myrun")
    (ax,) = fig.axes
    assert len(_patches(ax, "attempt")) == 3  # one bar per attempt
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "attempt 0", "attempt 1", "attempt 2 (launch 2)"]  # fmt: skip
    # productive: ready -> the last kept save (attempt 0), ready -> stop, ready -> done
    widths = sorted(round(p.get_width(), 3) for p in _patches(ax, "productive"))
    assert widths == sorted([30 - 12, 50 - 41, 80 - 70])
    # the kill's cost, each part where the report counts it (t = seconds since 10)
    (redo,) = _patches(ax, "recompute")
    assert (redo.get_x(), redo.get_width()) == pytest.approx((30 - 10, kill.recompute_s))
    det = _patches(ax, "detection")
    assert [(p.get_x(), p.get_width()) for p in det] == [pytest.approx((24, kill.detect_s))]
    restarts = sorted((p.get_x(), p.get_width()) for p in _patches(ax, "restart"))
    assert restarts == [pytest.approx((25, kill.restart_s)), pytest.approx((40, preempt.restart_s))]
    reloads = sorted(p.get_width() for p in _patches(ax, "reload"))
    assert reloads == pytest.approx(sorted([2, kill.load_s, preempt.load_s]))  # + the first
    # the restart is drawn on the attempt it started (row 1), the detection on the failed one
    assert det[0].get_y() + det[0].get_height() / 2 == pytest.approx(0)
    assert min(p.get_y() + p.get_height() / 2 for p in _patches(ax, "restart")) == pytest.approx(1)
    # failures marked and named (kind, rank, node, what it cost)
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "failure-label"]
    assert len(labels) == 2 and labels[0].startswith("killed rank 1 on n1: ")
    assert f"{kill.lost_s:.1f} s lost" in labels[0] and "restart" in labels[0]
    assert labels[1].startswith("preempted")
    marks = [ln for ln in ax.lines if ln.get_gid() == "failure"]
    assert sorted(float(m.get_xdata()[0]) for m in marks) == pytest.approx([24, 40])
    # every save: a marker, its blocking time a bar, its step written
    saves = [ln for ln in ax.lines if ln.get_gid() == "save"]
    assert sorted(float(m.get_xdata()[0]) for m in saves) == pytest.approx([10, 20, 65])
    assert sorted(p.get_width() for p in _patches(ax, "save")) == pytest.approx([0.2, 1])
    assert {"10", "20", "35"} <= {t.get_text() for t in ax.texts}
    assert ax.get_title().startswith(f"myrun: {rep.line()}")
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"productive", "detection", "restart", "checkpoint reload", "steps redone"} <= set(
        legend
    )
