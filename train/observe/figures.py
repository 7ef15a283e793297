"""A run's figures as the exporter shows them, gathered from where each one lives: the goodput
report (failures, restarts, productive time and the time lost, by category), the trainer's
last logged step (metrics.jsonl: step, loss, samples/s, ETA, the slowest rank), its summary
once it finished (summary.json: the run's median samples/s, its final loss) and the goodput
`save` records (the newest complete checkpoint: a `save` is noted once its marker is down).

Torch-free and prometheus_client-free: the launcher, `ddpkit status` and the tests read it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpkit.train.contract import METRICS_FILE, SUMMARY_FILE

# The report's time that is not productive, by what it went to. A failure's cost is split as
# the report splits it (train/goodput/report.py Loss): detection, restart, reload, recompute.
BADPUT = ("startup", "checkpoint", "detection", "restart", "reload", "recompute", "other")


@dataclass
class Figures:
    """One look at a run. None: not known (yet): the exporter leaves that series out."""

    run: str  # the run's name (its run dir's): the label every series carries
    run_id: str | None = None
    updated: float = field(default_factory=time.time)  # when these figures were taken
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    eta_s: float | None = None
    world_size: int | None = None
    step_time_s: float | None = None  # rank 0's, the last logging interval's mean
    # Each rank's mean step time over the last logging interval (the trainer's logging step
    # all-reduces them: only the live trainer has them all; metrics.jsonl keeps the slowest)
    rank_step_s: dict[int, float] = field(default_factory=dict)
    slowest_rank: int | None = None
    slowest_step_s: float | None = None
    goodput: float | None = None
    wall_s: float | None = None
    productive_s: float | None = None
    badput_s: dict[str, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)  # by kind
    failure_lost_s: dict[str, float] = field(default_factory=dict)  # by kind
    last_failures: list[dict[str, Any]] = field(default_factory=list)  # newest last
    restarts: int | None = None
    ckpt_blocking_s: float | None = None
    ckpt_step: int | None = None
    ckpt_time: float | None = None  # when the newest complete checkpoint was noted
    finished: bool = False

    @property
    def ckpt_age_s(self) -> float | None:
        return None if self.ckpt_time is None else max(0.0, self.updated - self.ckpt_time)


def badput(rep: Any) -> dict[str, float]:
    """The report's lost time by category (BADPUT). `other` is the wall time that is neither
    productive nor one of the others: a running attempt's steps since its last save (kept
    only once saved), the time between attempts no failure claims."""
    own = getattr(rep, "badput_s", None)  # a report that splits it itself
    if isinstance(own, dict) and own:
        return {str(k): float(v) for k, v in own.items()}
    fs = rep.failures
    out = {
        "startup": rep.startup_s,
        "checkpoint": rep.ckpt_blocking_s,
        "detection": sum(f.detect_s for f in fs),
        "restart": sum(f.restart_s for f in fs),
        "reload": sum(f.load_s for f in fs),
        "recompute": sum(f.recompute_s or 0.0 for f in fs),
    }
    if rep.productive_s is not None:
        out["other"] = max(0.0, rep.wall_s - rep.productive_s - sum(out.values()))
    return {k: float(v) for k, v in out.items()}


def add_report(fig: Figures, rep: Any) -> None:
    """The goodput report's figures (a train.goodput.Report)."""
    fig.run_id = fig.run_id or rep.run
    fig.goodput = rep.goodput
    fig.wall_s = rep.wall_s
    fig.productive_s = rep.productive_s
    fig.badput_s = badput(rep)
    fig.restarts = max(0, rep.attempts - 1)
    fig.ckpt_blocking_s = rep.ckpt_blocking_s
    fig.finished = bool(rep.finished)
    fig.failures, fig.failure_lost_s = {}, {}
    for f in rep.failures:
        fig.failures[f.kind] = fig.failures.get(f.kind, 0) + 1
        fig.failure_lost_s[f.kind] = fig.failure_lost_s.get(f.kind, 0.0) + f.lost_s
    fig.last_failures = [
        {"kind": f.kind, "rank": f.rank, "node": f.node, "lost_s": f.lost_s,
         "recovered": f.recovered, "attempt": f.attempt}
        for f in rep.failures[-3:]
    ]  # fmt: skip


def add_records(fig: Figures, recs: list[dict[str, Any]]) -> None:
    """From the goodput records: the newest complete checkpoint, and the step a user's
    script noted last (its `save`, `ready` or `done`) where no trainer logged one."""
    saves = [r for r in recs if r.get("kind") == "save"]
    if saves:
        fig.ckpt_time = float(saves[-1]["time"])
        fig.ckpt_step = _int(saves[-1].get("step"))
    if fig.step is None:
        noted = [r for r in recs if r.get("kind") in ("save", "ready", "done")]
        if noted:
            fig.step = _int(noted[-1].get("step"))


def add_step_record(fig: Figures, rec: dict[str, Any]) -> None:
    """A metrics.jsonl step record (the trainer's logging step)."""
    fig.step = _int(rec.get("step"))
    fig.loss = _num(rec.get("loss"))
    fig.samples_per_s = _num(rec.get("samples_per_s"))
    fig.eta_s = _num(rec.get("eta_s"))
    fig.total_steps = _int(rec.get("total_steps")) or fig.total_steps
    fig.step_time_s = _num(rec.get("step_time_s"))
    fig.slowest_rank = _int(rec.get("slowest_rank"))
    fig.slowest_step_s = _num(rec.get("step_time_max_s"))


def add_summary(fig: Figures, summary: dict[str, Any]) -> None:
    """summary.json: the finished run's own figures win (the run's median samples/s)."""
    fig.step = _int(summary.get("steps")) if summary.get("steps") is not None else fig.step
    fig.loss = (
        _num(summary.get("final_loss")) if summary.get("final_loss") is not None else fig.loss
    )
    if (s := _num(summary.get("samples_per_s"))) is not None:
        fig.samples_per_s = s
    fig.world_size = _int(summary.get("world_size")) or fig.world_size
    fig.eta_s = 0.0 if fig.finished else fig.eta_s


def last_step_record(run_dir: str | Path) -> dict[str, Any] | None:
    """metrics.jsonl's last step record (not an evaluation's), from its last 16 KB."""
    try:
        with (Path(run_dir) / METRICS_FILE).open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and "loss" in rec and isinstance(rec.get("step"), int):
                return rec
    return None


def read_summary(run_dir: str | Path, run_id: str | None) -> dict[str, Any] | None:
    """summary.json, when it is this run's (its launch id names the run, or neither says)."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    good = summary.get("goodput") or {}
    if run_id and isinstance(good, dict) and good.get("run") not in (None, run_id):
        return None  # an earlier run's, in a run dir used again
    return summary


def from_run_dir(run_dir: str | Path, rep: Any, recs: list[dict[str, Any]]) -> Figures:
    """Everything the run dir says: `rep` and `recs` are its goodput report (None: none yet)
    and records (train.goodput's report and read; handed in, as that package writes its
    report through this one at the launcher's exit)."""
    fig = Figures(run=run_name(run_dir))
    if rep is not None:
        add_report(fig, rep)
    if (rec := last_step_record(run_dir)) is not None:
        add_step_record(fig, rec)
    add_records(fig, recs)
    if fig.finished and (summary := read_summary(run_dir, fig.run_id)) is not None:
        add_summary(fig, summary)
    return fig


def run_name(run_dir: str | Path) -> str:
    """The `run` label: the run dir's own name (runs/<name> by default)."""
    return Path(run_dir).resolve().name or "run"


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
