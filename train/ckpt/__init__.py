"""Distributed Checkpoint (DCP) for the trainer: save, async save, resume, keep-K, checksums.

One concern per module, imported downward only:
- files.py: the CRC-32s of a step dir's files and the disk's error messages (torch-free);
- layout.py: step dirs, markers, what a complete checkpoint is, verify (torch-free at import);
- store.py: where checkpoints live: the CheckpointStorage interface, the stores by URL
  scheme, a store that went away (torch-free); localstore.py: a local dir; objstore.py and
  streams.py: an object store (s3://) and its multipart streams;
- io.py: DCP storage that hashes while writing and verifies while reading;
- parts.py: the named stateful parts a checkpoint holds (model, optimizer, RNG, values);
- compat.py: whether a checkpoint fits this run, and what a failed load says;
- staging.py: an async save's staging copy, and its start;
- load.py: one step loaded into the parts, agreed by every rank;
- manager.py: Checkpointer, the save/resume/prune protocol over all of them.

The names below are the package's interface (the trainer, `ddpkit ckpt`, the benchmarks).
Each is imported from its module on first use (PEP 562): the torch-free tools that read a
submodule (the renders' `ckpt.store`, `ddpkit ckpt`) must not pay for torch, which manager.py
imports (about 1-2 CPU-seconds on every `ddpkit run`, render or status otherwise).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpkit.train.ckpt.layout import (
        ABANDONED_DIR,
        is_complete,
        list_checkpoints,
        read_marker,
        step_of,
        verify,
    )
    from ddpkit.train.ckpt.load import UnusableCheckpoint
    from ddpkit.train.ckpt.manager import CheckpointDirUnwritable, Checkpointer, DiskFull
    from ddpkit.train.ckpt.parts import (
        ModelState,
        OptimizerState,
        RngState,
        Stateful,
        Values,
        rng_state,
        set_rng_state,
    )
    from ddpkit.train.ckpt.resume_check import check_resume_path, first_problem

_HOME = {
    "layout": (
        "ABANDONED_DIR",
        "is_complete",
        "list_checkpoints",
        "read_marker",
        "step_of",
        "verify",
    ),
    "manager": ("CheckpointDirUnwritable", "Checkpointer", "DiskFull"),
    "load": ("UnusableCheckpoint",),
    "resume_check": ("check_resume_path", "first_problem"),
    "parts": (
        "ModelState",
        "OptimizerState",
        "RngState",
        "Stateful",
        "Values",
        "rng_state",
        "set_rng_state",
    ),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}
__all__ = [
    "ABANDONED_DIR",
    "CheckpointDirUnwritable",
    "Checkpointer",
    "DiskFull",
    "ModelState",
    "OptimizerState",
    "RngState",
    "Stateful",
    "UnusableCheckpoint",
    "Values",
    "check_resume_path",
    "first_problem",
    "is_complete",
    "list_checkpoints",
    "read_marker",
    "rng_state",
    "set_rng_state",
    "step_of",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
