"""The save/restart budget, checked before the queue: does a checkpoint save fit the window the
scheduler leaves between its stop signal and the kill, and how often should the job save.

Two lines on stderr from `ddpkit submit` (backends with a scheduler's stop window: SLURM's
`--signal` lead time, Kubernetes' terminationGracePeriodSeconds) and from `--plan` (every
backend; without a scheduler the window is the shutdown budget):

    ddpkit: save budget: a 1.2 GB checkpoint (measured, step-40) at 0.8 GB/s (measured,
        step-40) takes ~1.5 s:
        fits the 120 s stop window (SLURM --signal lead time) and the 60 s shutdown budget
    ddpkit: checkpoint interval: Young/Daly sqrt(2 x 1.5 s x 4096 h MTBF) = 1.9 h ...

The checkpoint's size comes from `--plan`'s dry run (the job's model and optimizer, measured
on the meta device), else from the newest complete checkpoint of the job (its marker's file
sizes); the write speed from `ckpt_write_gbps`, else that checkpoint's own save (bytes over
`save_s`), else ASSUMED_WRITE_GBPS. The failure rate is `mtbf_h`, else DEFAULT_RANK_MTBF_H
spread over the job's ranks.

A job whose entry point is the user's own script or module saves in its own layout: the kit
can read what is in its checkpoint dir (the newest file, or folder, and its size) but cannot
time the script's save, so the speed is `ckpt_write_gbps` or assumed, and the lines say so
instead of "no checkpoint yet" beside a snapshot the script did write.

Young/Daly: the interval that minimises the expected time lost to saves plus recomputed work is
sqrt(2 C M) for a save cost C and a mean time between failures M (Young 1974; Daly 2006 adds
higher-order terms that matter only when C is near M). Arithmetic over the spec and a marker
file: no model is built and nothing is measured on submit (the marker is read through
ddpkit.train.ckpt.layout, whose package the launcher has imported already).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GB = 1e9
# Published failure studies put a 1,024-GPU job's mean time to failure near 8 h: one GPU's
# (with its share of host, network and software) is then 1,024 x 8 h. A job of N ranks fails
# N times as often.
DEFAULT_RANK_MTBF_H = 1024 * 8.0
ASSUMED_WRITE_GBPS = 1.0  # a shared filesystem's write speed per job, when nothing says better


@dataclass
class SaveCost:
    nbytes: int | None  # the whole checkpoint (every rank's files); None: not known here
    size_from: str  # "the --plan dry run" | "measured, step-N" | why unknown
    gbps: float
    speed_from: str  # "ckpt_write_gbps" | "measured, step-N" | "assumed"

    @property
    def seconds(self) -> float | None:
        return None if self.nbytes is None else self.nbytes / (self.gbps * GB)


def young_daly_s(save_s: float, mtbf_s: float) -> float:
    """The checkpoint interval sqrt(2 C M) (Young's first-order optimum)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


def job_mtbf_h(mtbf_h: float | None, ranks: int) -> tuple[float, str]:
    """(the job's mean time between failures in hours, where it comes from)."""
    if mtbf_h is not None:
        return mtbf_h, "mtbf_h"
    return DEFAULT_RANK_MTBF_H / max(
        1, ranks
    ), f"mtbf_h unset: {DEFAULT_RANK_MTBF_H:.0f} h / {ranks} ranks"


def last_save(ckpt_dir: str) -> tuple[int, float, str] | None:
    """(bytes, save seconds, step dir name) of the newest complete checkpoint on this
    machine whose marker records its save time, else None (none yet, or in an object store)."""
    from ddpkit.train.ckpt.layout import list_checkpoints, read_marker

    if "://" in ckpt_dir:
        return None
    try:
        complete, _ = list_checkpoints(Path(ckpt_dir))
    except OSError:
        return None
    for step_dir in reversed(complete):
        info = read_marker(step_dir) or {}
        files, save_s = info.get("files") or {}, info.get("save_s")
        if files and save_s:
            return sum(int(f["bytes"]) for f in files.values()), float(save_s), step_dir.name
    return None


def own_save(ckpt_dir: Path) -> tuple[str, int, int] | None:
    """What a user's script left in its checkpoint dir: (the newest entry's name, its bytes,
    a folder's files summed, the number of entries), None when there is none (or no dir).
    Dot files (a lock, a half-written tmp) are not a checkpoint."""
    try:
        entries = [p for p in ckpt_dir.iterdir() if not p.name.startswith(".")]
        if not entries:
            return None
        newest = max(entries, key=lambda p: p.stat().st_mtime)
        files = [newest] if newest.is_file() else [f for f in newest.rglob("*") if f.is_file()]
        return newest.name, sum(f.stat().st_size for f in files), len(entries)
    except OSError:
        return None


def save_cost(spec: Any, planned_bytes: int | None) -> SaveCost:
    """The save's size and speed as far as this machine knows them (module docstring)."""
    where = spec.checkpoint_dir
    here = Path(spec.workspace or ".") / where  # relative paths are the workspace's
    measured = last_save(str(here)) if "://" not in where else None
    # A script's own files count only where none of the kit's checkpoints is there.
    own = None if spec.default_entry or measured or "://" in where else own_save(here)
    if planned_bytes is not None:
        nbytes, size_from = planned_bytes, "the --plan dry run"
    elif measured is not None:
        nbytes, size_from = measured[0], f"measured, {measured[2]}"
    elif own is not None:
        name, nbytes, entries = own
        newest = f", the newest of {entries} entries" if entries > 1 else ""
        size_from = f"your script's own {name} in {where}{newest}"
    elif spec.default_entry:
        nbytes, size_from = None, f"no checkpoint in {where} yet"
    else:
        nbytes, size_from = None, f"your script saves its own checkpoints: none in {where} yet"
    if spec.ckpt_write_gbps is not None:
        gbps, speed_from = spec.ckpt_write_gbps, "ckpt_write_gbps"
    elif measured is not None and measured[1] > 0.01:
        gbps, speed_from = measured[0] / measured[1] / GB, f"measured, {measured[2]}"
    elif own is not None:
        gbps, speed_from = ASSUMED_WRITE_GBPS, f"assumed: {_UNTIMED}"
    else:
        gbps, speed_from = ASSUMED_WRITE_GBPS, "assumed"
    return SaveCost(nbytes, size_from, gbps, speed_from)


# What the kit cannot know about a user's script's save: said beside an assumed speed.
_UNTIMED = "the kit cannot time your script's own save; set ckpt_write_gbps"


def budget_lines(
    spec: Any, window: tuple[int, str] | None, planned_bytes: int | None = None
) -> list[str]:
    """The two lines: the save against the stop window, and the Young/Daly interval.
    window: (seconds, what sets them) of the scheduler, None where none stops the job."""
    cost = save_cost(spec, planned_bytes)
    budget = spec.shutdown_budget_s
    if cost.seconds is None:
        then = (
            "`--plan` measures the model, a first save measures the storage"
            if spec.default_entry
            else "the kit reads their size there once they are written, but cannot time your "
            "script's own save (set ckpt_write_gbps)"
        )
        return [f"ddpkit: save budget: checkpoint size unknown ({cost.size_from}); {then}"]
    took = (
        f"a {_size(cost.nbytes)} checkpoint ({cost.size_from}) at {cost.gbps:.3g} GB/s "
        f"({cost.speed_from}) "
        f"takes ~{_secs(cost.seconds)}"
    )
    limits = [(budget, "shutdown budget (train.shutdown_timeout_s)")]
    if window is not None:
        limits.insert(0, (window[0], f"stop window ({window[1]})"))
    short = [(s, what) for s, what in limits if cost.seconds > s]
    if short:
        s, what = min(short)
        fit = (
            f"does NOT fit the {s} s {what}: a stop would lose the work since the last save; "
            "raise train.shutdown_timeout_s (the window follows) or write faster"
        )
    else:
        fit = "fits the " + " and the ".join(f"{s} s {what}" for s, what in limits)
    mtbf_h, mtbf_from = job_mtbf_h(spec.mtbf_h, spec.world_size)
    interval = young_daly_s(cost.seconds, mtbf_h * 3600)
    return [
        f"ddpkit: save budget: {took}: {fit}",
        f"ddpkit: checkpoint interval: Young/Daly sqrt(2 x {_secs(cost.seconds)} x "
        f"{mtbf_h:,.4g} h MTBF ({mtbf_from})) = {_duration(interval)} between saves "
        f"(a failure then loses about {_duration(interval / 2)} of work)",
    ]


def _size(nbytes: int) -> str:
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB else f"{nbytes / 1e6:.3g} MB"


def _secs(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
