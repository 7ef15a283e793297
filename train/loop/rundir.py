"""The run dir and the checkpoint dir a run claims before it writes anything.

One job per checkpoint dir, and per run dir when that is another directory: two runs in one
run dir would interleave metrics.jsonl and overwrite each other's summary. Rank 0 takes the
locks (runlock.py); a refusal, a full disk or a read-only dir reaches every rank as the same
one line (ConfigError on all of them, nothing written). Only then does rank 0 create the run
dir, drop a stale requeue marker and write config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist
from ddpkit.train.ckpt.files import is_no_space, no_space_message
from ddpkit.train.ckpt.store import local_dir
from ddpkit.train.config import dump
from ddpkit.train.contract import CONFIG_FILE, REQUEUE_MARKER
from ddpkit.train.errors import ConfigError
from ddpkit.train.loop.runlock import RunLock

if TYPE_CHECKING:
    from ddpkit.train.config import TrainConfig
    from ddpkit.train.distributed import World


def lock_dirs(cfg: TrainConfig) -> list[str]:
    """The dirs a run locks: the checkpoint dir (a store's: its staging dir here), and the
    run dir when that is another directory."""
    dirs = [str(local_dir(cfg.ckpt_dir))]
    if Path(cfg.run_dir).resolve() != Path(dirs[0]).resolve():
        dirs.append(cfg.run_dir)
    return dirs


def claim_run_dirs(cfg: TrainConfig, world: World) -> list[RunLock]:
    """The locks this run holds (checkpoint dir first), taken on rank 0; collective."""
    dirs = lock_dirs(cfg)
    locks = [RunLock(d) for d in dirs]
    box: list[str | None] = [None]
    if world.is_main:  # another live job on either: one line, exit 2
        for lock, where in zip(locks, dirs, strict=True):
            try:
                lock.acquire()
            except ConfigError as e:
                box[0] = str(e)
            except OSError as e:  # a full disk, a read-only one: every rank leaves with it
                box[0] = (
                    no_space_message(lock.path)
                    if is_no_space(e)
                    else f"{where}: cannot write the lock file ({e.strerror})"
                )
            if box[0] is not None:
                for taken in reversed(locks):
                    taken.release()
                break
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise ConfigError(box[0])
    if world.is_main:  # only now: bad input above must leave nothing behind
        run_dir = Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / REQUEUE_MARKER).unlink(missing_ok=True)
        (run_dir / CONFIG_FILE).write_text(dump(cfg) + "\n")
    return locks
