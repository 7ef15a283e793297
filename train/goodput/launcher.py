"""The node launcher's side of the goodput records (train/launch/): an attempt starts, a worker
ends, the launch ends (a stop, a cancel, a finish, the report); and the trainer's last step."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ddpkit.train.contract import RUN_DIR_ENV, RUN_ID_ENV
from ddpkit.train.goodput.records import read, record
from ddpkit.train.goodput.report import Report, report, write_report
from ddpkit.train.observe import write_final


def launcher_attempt(attempt: int, local_rank: int, env: dict[str, str] | None = None) -> None:
    """A torchrun attempt starts its workers on this node (noted once, by local rank 0),
    with the node's number and its ranks (from local rank 0's environment), so the report
    places a rank that never said anything itself."""
    if local_rank != 0:
        return
    from ddpkit.train import places

    where: dict[str, Any] = {}
    with contextlib.suppress(KeyError, ValueError, TypeError):
        first = int((env or {})["RANK"])
        where = {
            "node_number": places.node_number(int((env or {})["GROUP_RANK"])),
            "ranks": [first, first + int((env or {})["LOCAL_WORLD_SIZE"])],
        }
    record(os.environ.get(RUN_DIR_ENV), "attempt", attempt=attempt, **where)


_LEFT_NOTED: set[int] = set()  # the attempts whose first worker to leave is noted


def launcher_end(
    rank: int,
    code: int | None,
    when: float,
    attempt: int,
    error_file: str,
    returned: float | None = None,
    stopped: bool = False,
) -> None:
    """A worker of this node ended; nonzero ends are noted with what its error file says
    (the kit's diagnosis of a failed collective: the ranks it waited for, or stuck). Of the
    workers that left of their own accord (exit 0), only the node's first per attempt: the
    one that may have left its peers waiting, at one record per node, not per rank.
    stopped: its end was torchrun's stop of the attempt (its SIGTERM, or the SIGKILL past
    the shutdown budget), not a failure of its own."""
    if code is None and returned is None:
        return  # torchrun reaped it first: its code is torchrun's to tell
    if code in (0, None):  # its code returned: it left of its own accord
        code = 0
        if attempt in _LEFT_NOTED:
            return
        _LEFT_NOTED.add(attempt)
    facts: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        data = json.loads(Path(error_file).read_text()).get("ddpkit") or {}
        facts = {k: data[k] for k in ("missing", "stuck", "phase", "cause", "error") if k in data}
    if returned is not None:
        facts["returned"] = returned
    if stopped:
        facts["stopped"] = True
    record(
        os.environ.get(RUN_DIR_ENV),
        "end",
        time=when,
        rank=rank,
        code=code,
        attempt=attempt,
        **facts,
    )


def launcher_exit(
    run_dir: str | Path,
    requeue: bool,
    node_rank: int,
    attempt: int | None = None,
    finished: bool = False,
    cancel: str | None = None,
) -> str | None:
    """At the launcher's exit: note the stop of a requeue; node 0 notes a job that finished
    (exit 0: a user's script notes no `done` of its own, and an attached drill waits for one
    of the two), writes the report and returns its one line when a failure was recovered or
    a requeue follows: after restarts the line says what they cost. None elsewhere, without
    records, and for a launch of one attempt: its end is said by the trainer's done line, or
    by the one error line a failure or bad input gets (which must stay the only line: no
    goodput beside it). cancel: the stop signal of a cancel (a plain scancel's SIGTERM, a
    `ddpkit cancel`, Ctrl-C), noted so that the report says "cancelled", not a failure."""
    where = {} if attempt is None else {"attempt": attempt}  # the launcher's own env has none
    if requeue:  # in the attempt the workers last ran in
        record(run_dir, "stop", **where)
    elif cancel:
        record(run_dir, "stop", cancel=cancel, **where)
    if node_rank != 0:
        return None
    if finished:
        record(run_dir, "finished", **where)
    rep = write_report(run_dir)
    if rep is not None:  # the same figures in Prometheus' text format (<run dir>/metrics.prom)
        write_final(run_dir, rep, read(run_dir, os.environ.get(RUN_ID_ENV)))
    if rep is None or (rep.attempts < 2 and not requeue):
        return None
    return f"ddpkit: {rep.line()}"


def note_done(run_dir: str | Path, step: int) -> Report | None:
    """The trainer's rank 0 at the end of its last step: note it, and the report so far."""
    record(run_dir, "done", step=step)
    return report(run_dir)
