"""What a checkpoint dir holds, and what makes a step dir a complete checkpoint.

<ckpt_dir>/step-<N>/ holds DCP's files; its marker (contract.CKPT_MARKER, JSON, written last
by rank 0 with the size and CRC-32 of every file) and DCP's `.metadata` make it complete. A
marker that is missing, not JSON or JSON of another shape (MARKER_SHAPE: a list, records that
are numbers, a step that is a string) makes the step dir incomplete: skipped with a warning
saying why (`why_incomplete`), never loaded. `is_complete` is the one definition; the
trainer's resume, keep-K and `ddpkit ckpt` all use it. Torch-free at import (verify imports
DCP late).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpkit.train.ckpt.files import ALGORITHM, METADATA, share, verify_files
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import CKPT_STEP_PREFIX
from ddpkit.train.jsonshape import MapOf, Opt, ShapeError, loads

ABANDONED_DIR = "abandoned"  # under the checkpoint dir: later steps a rewind set aside
_STEP_DIR = re.compile(rf"^{CKPT_STEP_PREFIX}(\d+)$")


# What the manager writes into a marker (the trainer's checkpoint info, the save's time, the
# file records): a marker written before a key existed lacks it, none has another type.
MARKER_SHAPE = {
    "files": Opt(MapOf({"bytes": int, ALGORITHM: str})),
    **dict.fromkeys(
        ("step", "world_size", "global_batch", "epoch", "consumed", "seed", "samples"), Opt(int)
    ),
    **dict.fromkeys(("parallel", "model", "optimizer"), Opt(str)),
    "sharding": Opt((str, None)),
    "save_s": Opt(float),
    "time": Opt(float),
}


def marker(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the step dir's marker, None), or (None, why there is none, in one phrase): missing
    (a save cut short), unreadable, or not of MARKER_SHAPE."""
    return marker_of((path / MARKER).read_bytes)


def marker_of(read: Callable[[], bytes]) -> tuple[dict[str, Any] | None, str | None]:
    """marker() from the marker's bytes as `read` returns them (a file's, an object's)."""
    try:
        return loads(read().decode("utf-8"), MARKER_SHAPE), None
    except FileNotFoundError:
        return None, f"no {MARKER} marker: an interrupted save"
    except OSError as e:
        return None, f"unreadable {MARKER} marker ({e.strerror or type(e).__name__})"
    except UnicodeDecodeError:
        return None, f"bad {MARKER} marker: not UTF-8 text"
    except ShapeError as e:
        return None, f"bad {MARKER} marker: {e}"


def read_marker(path: Path) -> dict[str, Any] | None:
    """The step dir's marker, or None when it is missing, unreadable or of another shape:
    such a step dir is incomplete, and resume falls back past it."""
    return marker(path)[0]


def why_incomplete(path: Path) -> str | None:
    """None for a complete checkpoint, else why it is not (one phrase)."""
    if not path.is_dir():
        return "no such directory"
    why = marker(path)[1]
    if why is None and not (path / METADATA).is_file():
        why = f"no {METADATA}: an interrupted save"
    return why


def list_checkpoints(ckpt_dir: Path) -> tuple[list[Path], list[Path]]:
    """(complete step dirs oldest first, incomplete step dirs)."""
    complete, partial = [], []
    if not ckpt_dir.is_dir():
        return complete, partial
    for p in sorted(ckpt_dir.iterdir(), key=lambda q: step_of(q) or -1):
        if step_of(p) is None or not p.is_dir():
            continue
        ok = is_complete(p)
        (complete if ok else partial).append(p)
    return complete, partial


def step_of(p: Path | str) -> int | None:
    """The step of a checkpoint dir, local (a Path) or in a store (its URL, a str)."""
    m = _STEP_DIR.match(p.name if isinstance(p, Path) else str(p).rstrip("/").rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    """A finished save: a marker of the right shape and DCP's .metadata (checksums are
    verify's business: a complete checkpoint can still be a damaged one)."""
    return why_incomplete(path) is None


def verify(
    path: Path, rank: int = 0, world: int = 1, read: bool = True, data: bool = True
) -> str | None:
    """What is wrong with this rank's share of a step dir's files, or None; with the
    defaults, all of them. `read` False: sizes only (the load hashes the data as it reads
    it), but rank 0 always hashes and unpickles .metadata, which every rank loads first.
    `data` False: .metadata only (the data files are read from a store)."""
    import torch.distributed.checkpoint as dcp

    info, why = marker(path)
    if info is None:
        return why
    mine = share(info, rank, world).keys() if world > 1 else None
    if not data:
        mine = {METADATA}
    problem = verify_files(path, info, only=mine, read=read or {METADATA})
    if problem is None and rank == 0:
        try:
            dcp.FileSystemReader(str(path)).read_metadata()
        except Exception as e:
            problem = f"unreadable .metadata ({type(e).__name__}: {first_line(e)})"
    return problem


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__
