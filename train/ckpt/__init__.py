"""Distributed Checkpoint (DCP) for the trainer: save, async save, resume, keep-K, checksums.

One concern per module, imported downward only:
- files.py: the CRC-32s of a step dir's files and the disk's error messages (torch-free);
- layout.py: step dirs, markers, what a complete checkpoint is, verify (torch-free at import);
- io.py: DCP storage that hashes while writing and verifies while reading;
- parts.py: the named stateful parts a checkpoint holds (model, optimizer, RNG, values);
- compat.py: whether a checkpoint fits this run, and what a failed load says;
- manager.py: Checkpointer, the save/resume/prune protocol over all of them.

The names below are the package's interface (the trainer, `ddpkit ckpt`, the benchmarks).
"""

from ddpkit.train.ckpt.layout import (
    ABANDONED_DIR,
    is_complete,
    list_checkpoints,
    read_marker,
    step_of,
    verify,
)
from ddpkit.train.ckpt.manager import (
    CheckpointDirUnwritable,
    Checkpointer,
    DiskFull,
    UnusableCheckpoint,
    check_resume_path,
    first_problem,
)
from ddpkit.train.ckpt.parts import (
    ModelState,
    OptimizerState,
    RngState,
    Stateful,
    Values,
    rng_state,
    set_rng_state,
)

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
