"""Goodput: how much of a run's wall time was training that was kept, and where the rest went.

Every party to a run appends small records to <run dir>/goodput/ (one JSON file each, written
to a temporary name and renamed into place, so a reader never sees half a record and a
restart, a requeue or another node never overwrites one):

    attempt  the node launcher, when a torchrun attempt starts its workers (per node)
    end      the node launcher, when one of its workers ends with a nonzero status
    ready    the trainer's rank 0 (or a user's script), once resumed: `load_s` the load took;
             `fresh` on the first start of a run that starts over (`--resume never`)
    save     the same, after a checkpoint save: `blocking_s` the training waited for it
    stop     the node launcher, when the attempt saved on a stop signal (a requeue)
    done     the trainer's rank 0, when the run finished its last step
    inject   `ddpkit chaos`, when it injected a failure (its true start, for detection times)

`report(run_dir)` reads them all, whoever wrote them and on whichever attempt (from the last
fresh start on: a run dir reused with `--resume never` is a new run), and splits the
wall time: productive (from `ready` to the last save an attempt kept, less the time saves
blocked), checkpoint time that blocked training, start-up, and per failure: detection (the
failure to the moment its group was down), restart (down to the next attempt's `ready`, a
requeue's time in the queue included, less its load), checkpoint load, and the work
recomputed (the last kept save to the failure). A finished run's wall time ends at its last
`done`: what its processes took to exit after it is `teardown_s`, beside it. A user's script that notes no `ready`/`save`
gets the failures and the wall time, and no goodput figure.

torch-free, and never fails a run: a record that cannot be written is skipped.
"""

from ddpkit.train.goodput.launcher import (
    launcher_attempt,
    launcher_end,
    launcher_exit,
    note_done,
)
from ddpkit.train.goodput.records import (
    GOODPUT_DIR,
    KINDS,
    NODE_FAILURES_TO_EXCLUDE,
    REPORT_FILE,
    attempt_number,
    current_run,
    first_start,
    node_name,
    note,
    of_run,
    read,
    read_all,
    record,
    runs,
)
from ddpkit.train.goodput.report import Loss, Report, report, status_lines, write_report

__all__ = [
    "GOODPUT_DIR",
    "KINDS",
    "NODE_FAILURES_TO_EXCLUDE",
    "REPORT_FILE",
    "Loss",
    "Report",
    "attempt_number",
    "current_run",
    "first_start",
    "launcher_attempt",
    "launcher_end",
    "launcher_exit",
    "node_name",
    "note",
    "note_done",
    "of_run",
    "read",
    "read_all",
    "record",
    "report",
    "runs",
    "status_lines",
    "write_report",
]
