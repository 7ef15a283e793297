"""What a job about to be queued will resume from, said at submit (issue 54 item 8).

A run dir is per job name, so a local smoke test's checkpoints are where the cluster job of the
same name looks: its trainer resumes from them, and a user's 40-epoch job trained nothing on
SLURM because the smoke test had saved at its last step. Before the queue, one line names the
checkpoint the job will start from (or, for a user's script, what its checkpoint dir already
holds), when and by which run it was written, and how to start fresh.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ddpkit.train import goodput
from ddpkit.train.contract import is_remote


def _when(path: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(path.stat().st_mtime))


def _by(run_dir: Path) -> str:
    """`, by run R` of the newest run that left goodput records in the run dir, if any."""
    runs = goodput.runs(goodput.read_all(run_dir))
    return f" by run {runs[-1]}" if runs else ""


def resume_line(spec: Any) -> str | None:
    """The line for `spec` (a JobSpec) when its local checkpoint dir already holds a
    checkpoint it will start from; None when there is none (or it is in an object store, or
    the job starts over by itself: train.resume = never, or a path of its own)."""
    if is_remote(spec.checkpoint_dir):
        return None
    base = Path(str(spec.workspace or "."))
    here, run_dir = base / spec.checkpoint_dir, base / spec.run_dir
    try:
        if spec.default_entry:
            return _kit_line(spec, here, run_dir)
        return _script_line(spec, here, run_dir)
    except OSError:
        return None


def _kit_line(spec: Any, here: Path, run_dir: Path) -> str | None:
    from ddpkit.train.ckpt.layout import list_checkpoints, step_of

    if str(spec.train.get("resume", "auto")) != "auto":
        return None
    complete, _ = list_checkpoints(here)
    if not complete:
        return None
    newest = complete[-1]
    step = step_of(newest)
    line = (
        f"ddpkit: this job resumes at step {step} from {spec.checkpoint_dir}/{newest.name}, "
        f"written {_when(newest)}{_by(run_dir)}"
    )
    steps = spec.train.get("steps")
    if isinstance(steps, int) and step is not None and step >= steps:
        line += f" (train.steps is {steps}: nothing is left to train)"
    return line + "; --set train.resume=never starts over, keeping nothing of it"


def _script_line(spec: Any, here: Path, run_dir: Path) -> str | None:
    from ddpkit.tools.savebudget import own_save

    found = own_save(here)
    if found is None:
        return None
    name, _, count = found
    more = f" and {count - 1} more" if count > 1 else ""
    return (
        f"ddpkit: {spec.checkpoint_dir} ($DDPKIT_CKPT_DIR) already holds {name}{more}, written "
        f"{_when(here / name)}{_by(run_dir)}: your script resumes from it if it loads it there; "
        "move it away (or set ckpt_dir) to start fresh"
    )
