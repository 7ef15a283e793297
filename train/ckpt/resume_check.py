"""--resume PATH checked before anything is written, and the first problem of any rank agreed
by every rank (both collective on the default group, or the group given): a PATH that is not
a complete checkpoint whose files verify, local or a step in a store, is one ConfigError on
every rank. The Checkpointer (manager.py) agrees its save and load problems the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train.ckpt.layout import verify, why_incomplete
from ddpkit.train.ckpt.store import is_remote, split_step
from ddpkit.train.errors import ConfigError


def check_resume_path(resume: str) -> None:
    """--resume PATH: ConfigError on every rank unless PATH is a complete checkpoint whose
    files verify (each rank reads its share of them, the first problem is agreed). Called
    before the run dir is written, so a bad PATH leaves nothing behind. (Collective on the
    default group.)"""
    if resume in ("auto", "never"):
        return
    msg = None
    path = Path(resume)
    if is_remote(resume):  # a step in a store: its marker here, its files once fetched
        msg = _remote_step_problem(resume) if dist.get_rank() == 0 else None
    elif (why := why_incomplete(path)) is not None:
        msg = not_complete(resume, why)
    elif problem := verify(path, dist.get_rank(), dist.get_world_size()):
        msg = (
            f"--resume {resume}: unusable checkpoint ({problem}); pass another step-N "
            "directory, or --resume auto to take the newest one that loads"
        )
    if (msg := first_problem(msg)) is not None:
        raise ConfigError(msg)


def _remote_step_problem(resume: str) -> str | None:
    """Why --resume URL names no complete checkpoint in a store (None when it does)."""
    if (got := split_step(resume)) is None:
        return (
            f"--resume {resume}: not a step URL; pass a store's step-N "
            "(e.g. s3://bucket/run/checkpoints/step-40), or --resume auto"
        )
    remote, name = got
    try:
        _, why = remote.marker(name)
    except Exception as e:
        return f"--resume {resume}: {remote.problem(e)}"
    return None if why is None else not_complete(resume, why)


def not_complete(resume: str, why: str) -> str:
    return (
        f"--resume {resume}: not a complete ddpkit checkpoint ({why}); pass a step-N "
        "directory written by a finished save"
    )


def first_problem(problem: str | None, group: Any = None) -> str | None:
    """The problem of the lowest rank that has one, on every rank (one int all-reduce when
    none has; the messages are gathered only when one has)."""
    flag = torch.tensor([int(problem is not None)])
    dist.all_reduce(flag, group=group)
    if not int(flag):
        return None
    msgs: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(msgs, problem, group=group)
    return next(m for m in msgs if m is not None)
