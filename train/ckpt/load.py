"""One checkpoint step loaded into the run's named parts: the step's files checked (each rank
its share, rank 0 .metadata), the checkpoint checked against this run (ckpt.compat), every
part loaded by DCP with each rank verifying its share of the files while reading them, and a
part an older checkpoint lacks kept fresh with one warning. A problem on any rank is
UnusableCheckpoint on every rank: the resume then tries the next older checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from ddpkit.train.ckpt.compat import (
    MOVED_PARTS,
    check_compatible,
    check_optimizer,
    checksum_problem,
    describe,
    moved_parts,
    plain_values_as_saved,
)
from ddpkit.train.ckpt.files import share
from ddpkit.train.ckpt.layout import read_marker, verify
from ddpkit.train.ckpt.parts import RngState, Stateful
from ddpkit.train.ckpt.resume_check import first_problem


class UnusableCheckpoint(Exception):
    """A complete-looking checkpoint that fails verification or loading (message: why)."""


def dcp_errors() -> tuple[type[BaseException], ...]:
    """What a save or load can raise: DCP gathers every rank's errors into a
    CheckpointException, a BaseException (imported here: DCP loads on first use)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def agree(problem: str | None, pg: Any) -> None:
    """Raise UnusableCheckpoint on every rank when any rank has a problem."""
    if (first := first_problem(problem, pg)) is not None:
        raise UnusableCheckpoint(first)


def load_step(
    path: Path,
    states: dict[str, Stateful],
    pg: Any,
    log: Callable[[str], Any],
    open_data: Callable[[str, int], Any] | None = None,
) -> dict[str, Any]:
    """Check, then load every part in place, verifying checksums while reading; returns
    the checkpoint's marker info. UnusableCheckpoint (on every rank) when the files or
    the load fail. Before the load each rank checks that its share of the files is there
    with its size (a stat) and rank 0 hashes .metadata; during it each rank hashes its
    share: about 1/world of the bytes per rank, whatever the world. `open_data(file,
    size)`: a read stream of a data file in a store (its size checked by the store's read).
    `pg`: the checkpoint's process group; `log`: where the warning goes."""
    import torch.distributed.checkpoint as dcp
    from ddpkit.train.ckpt.io import VerifyingReader

    rank, world = dist.get_rank(), dist.get_world_size(pg)
    agree(verify(path, rank, world, read=False, data=open_data is None), pg)
    info = read_marker(path) or {}
    meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    present = {k.split(".", 1)[0] for k in meta}
    state = {n: p.state_dict() for n, p in states.items() if n in present}
    old_keys = plain_values_as_saved(states, state, meta)
    moved = moved_parts(states, state, meta, present)
    if "model" in state:
        check_compatible(path, state["model"], meta, info)
    if "optim" in state:
        check_optimizer(path, state["optim"], meta, info)
    rng = next((n for n, p in states.items() if isinstance(p, RngState)), None)
    if rng in state and f"{rng}.{states[rng].key}" not in meta:  # type: ignore[attr-defined]
        del state[rng]  # the world grew: this rank has no saved RNG state
    missing = [n for n, p in states.items() if n not in present | moved and p.state_dict()]
    missing += old_keys
    if missing and rank == 0:
        log(
            f"warning: checkpoint {path} has no {', '.join(missing)} (written before "
            f"{'it was' if len(missing) == 1 else 'they were'} checkpointed): fresh values kept"
        )
    problem = None
    sizes = {n: rec.get("bytes", 0) for n, rec in (info.get("files") or {}).items()}
    opener = (lambda f: open_data(f, sizes[f])) if open_data is not None else None
    reader = VerifyingReader(path, share(info, rank, world), opener)
    try:
        dcp.load(state, storage_reader=reader, process_group=pg)
    # DCP gathers every rank's read errors into a CheckpointException (a BaseException)
    # raised on all ranks; the all-reduce in agree() covers a rank that failed alone.
    # A checksum failure can leave damaged bytes in the parts: the older checkpoint
    # tried next overwrites them, as after any failed load.
    except dcp_errors() as e:
        problem = checksum_problem(e) or f"load failed ({describe(e)})"
    agree(problem, pg)
    for name in moved:  # read from where an older version kept it
        src, keys = MOVED_PARTS[name]
        states[name].load_state_dict({k: state[src].pop(k) for k in keys})
    for name, sd in state.items():
        states[name].load_state_dict(sd)
    return info
