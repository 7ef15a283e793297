"""The SLURM engine's options: the job file's [slurm] table, its defaults and its rules.

SlurmBackend.Options names it, so the job spec types `[slurm]` and `--set slurm.key=value` by
it, as it does a plugin's table; the field checks run for SLURM jobs only (check_options).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from ddpkit.train.dataclass_fields import at_least, checks, plain_path, port

SBATCH_SIGNALS = ("USR1", "USR2", "TERM")


@dataclass
class SlurmOptions:
    """The job file's [slurm] table."""

    __backend_options__ = True  # its field checks run for SLURM jobs only (check_options)
    partition: str | None = None  # -p; unset = the cluster's default partition
    account: str | None = None  # -A
    qos: str | None = None
    constraint: str | None = None  # -C, node features, e.g. "a100|h100"
    exclusive: bool = False  # whole nodes (recommended for multi-GPU training)
    container: Literal["none", "pyxis", "apptainer"] = "none"  # run torchrun inside `image`
    container_mounts: list[str] = field(default_factory=list)  # "host:ctr[:ro]"; cwd is added
    signal: Literal["USR1", "USR2", "TERM"] = "USR1"  # preemption/time-limit warning signal
    # Send `signal` this long before the time limit; the save must fit. Unset: the shutdown
    # budget (train.shutdown_timeout_s, rounded up) + GRACE_MARGIN_S.
    grace_s: int | None = None
    # requeues after "saved, please requeue"; 0 = never requeue
    requeue_limit: int = field(default=3, metadata=checks(at_least(0)))
    # A requeued job starts this long after its requeue instead of after SLURM's own hold
    # (about 2 minutes of BeginTime on every requeue); unset: SLURM's hold.
    requeue_delay_s: int | None = field(default=15, metadata=checks(at_least(0)))
    # default <run_dir>/slurm: batch and per-node logs
    log_dir: str | None = field(default=None, metadata=checks(plain_path("runs/mine/slurm")))
    # The Python on the nodes (container "none"): default the interpreter that ran `ddpkit
    # submit` (its venv included), found at the same path on the shared filesystem.
    python: str | None = None
    venv: str | None = None  # a virtualenv to activate first on the nodes; unset = none
    setup: list[str] = field(default_factory=list)  # shell lines run first, e.g. "module load cuda"
    extra_sbatch: list[str] = field(default_factory=list)  # extra "#SBATCH" option lines
    # fixed rendezvous port; unset = 20000 + job id % 20000
    rdzv_port: int | None = field(default=None, metadata=checks(port(fix="use 1-65535, or unset")))
    # Names of environment variables passed from the submitting shell (sbatch exports it)
    # and never written into the script, e.g. ["WANDB_API_KEY"]; submit checks they are set.
    secret_env: list[str] = field(default_factory=list)
    # Shared directory where the image is converted once (pyxis: enroot squashfs, apptainer:
    # SIF) and reused by every node and later job; unset = convert on every run.
    image_cache: str | None = None

    def __post_init__(self) -> None:
        if self.python is None and not self.venv:
            # The nodes' Python defaults to this one (the shared filesystem has it at this path).
            self.python = sys.executable
