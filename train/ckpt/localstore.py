"""Checkpoints in a local directory (a disk, or a shared filesystem every node mounts): the
step dirs are written in place, and read in place. Torch-free at import (the writer imports
DCP's storage when a save asks for it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ddpkit.train.ckpt.files import marker_files
from ddpkit.train.ckpt.layout import list_checkpoints, marker, why_incomplete
from ddpkit.train.ckpt.store import StepRead, describe, step_number
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import is_remote


def fresh_dir(path: Path) -> None:
    """`path` an empty dir: a leftover of an interrupted save (or an older run) goes first."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    path.mkdir(parents=True)


def write_marker(path: Path, info: dict[str, Any]) -> None:
    """The step dir's marker, whole or not at all (a crash mid-write leaves only the tmp)."""
    tmp = path / (MARKER + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, path / MARKER)


class LocalStore:
    """A checkpoint dir on a filesystem: step-N dirs under `dir`."""

    drop_hint = "move them aside"

    def __init__(self, ckpt_dir: str | os.PathLike[str]):
        self.dir = Path(ckpt_dir)
        self.url = str(self.dir)

    def where(self, name: str) -> Path:
        return self.dir / name

    def holds(self, where: str | os.PathLike[str]) -> bool:
        return not is_remote(where) and Path(where).parent.resolve() == self.dir.resolve()

    def check(self, wait_s: float = 0.0) -> str | None:
        return None  # the run's preflight checks a local dir (train/preflight.py)

    def problem(self, e: BaseException, what: str = "", access: str = "read") -> str:
        return f"{what}{self.url}: cannot {access} it ({describe(e)})"

    def scan(self) -> tuple[list[str], dict[str, str]]:
        complete, partial = list_checkpoints(self.dir)
        return [p.name for p in complete], {p.name: why_incomplete(p) or "" for p in partial}

    def marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        path = self.dir / name
        why = why_incomplete(path)
        return (None, why) if why is not None else marker(path)

    def prepare(self, name: str) -> None:
        fresh_dir(self.dir / name)

    def writer(self, path: Path) -> Any:
        from ddpkit.train.ckpt.io import HashingWriter

        return HashingWriter(path)

    def commit(self, path: Path, info: dict[str, Any], sums: dict[str, Any]) -> Path:
        # A stat per file, no data read back: the ranks hashed their files while writing.
        info["files"] = marker_files(path, sums)
        write_marker(path, info)
        return path

    def read(self, name: str, dest: Path, here: bool, whole: bool = False) -> StepRead:
        return StepRead(self.dir / name)  # in place: the verify and the load read it there

    def prune(self, keep: int) -> None:
        complete, partial = list_checkpoints(self.dir)
        newest = step_number(complete[-1].name) if complete else -1
        for p in complete[:-keep]:
            # The marker first: a deletion cut short leaves an incomplete dir, never a
            # complete-looking one with files missing.
            with contextlib.suppress(OSError):
                (p / MARKER).unlink()
            shutil.rmtree(p, ignore_errors=True)
        for p in partial:  # interrupted saves older than a complete one are garbage
            if (step_number(p.name) or 0) < (newest or 0):
                shutil.rmtree(p, ignore_errors=True)

    def set_aside(self, name: str, aside: str) -> None:
        target = self.dir / aside
        target.parent.mkdir(parents=True, exist_ok=True)
        (self.dir / name).rename(target)

    def put(self, name: str, data: bytes) -> None:
        pass  # the run dir, beside a local checkpoint dir, keeps it
