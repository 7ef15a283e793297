"""Checksums of a checkpoint's files (torch-free: the trainer and tools/ckpt.py share it).

The `.complete` marker records every file of a step dir, {name: {"bytes": size, "crc32":
"08x"}}. Each rank hashes the files it writes while writing them (ddpkit.train.ckpt.io), and
a load verifies each file on one rank, its `owner`, while reading it; `verify_files` reads
files from disk (tools/ckpt.py, and a --resume PATH checked before the run starts). zlib's
CRC-32 was picked by measured speed: ~2.1 GB/s vs blake2b ~0.9 GB/s and sha256 ~1.0 GB/s on
the dev machine (256 MiB in memory, idle), and it catches flipped, zeroed and truncated bytes; it is
not a defence against someone forging a checkpoint (DCP's metadata is pickled anyway:
load only from storage you trust).

The CRC-32 is ISA-L's (the `isal` package) where it is installed: the same values as zlib's
(so every checkpoint verifies either way), 3.7 GB/s against zlib's 1.0 GB/s on this machine
(256 MiB in memory, median of 5), and it too releases the GIL while it runs. Without it,
zlib's.
"""

from __future__ import annotations

import errno
import re
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ddpkit.train.contract import CKPT_MARKER

try:
    from isal.isal_zlib import crc32
except ImportError:  # an install without isal: zlib's, the same values, slower
    from zlib import crc32

ALGORITHM = "crc32"
METADATA = ".metadata"  # DCP's: every rank unpickles it, so it is checked before any load
_CHUNK = 8 << 20
_DATA_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")  # DCP's name: __<writer rank>_<n>.distcp


def file_crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = crc32(chunk, crc)
    return f"{crc:08x}"


def checksum_files(step_dir: Path) -> dict[str, dict[str, Any]]:
    """Every file of a step dir but the marker, with its size and CRC-32."""
    out = {}
    for p in sorted(step_dir.iterdir()):
        if p.is_file() and not p.name.startswith(CKPT_MARKER):
            out[p.name] = {"bytes": p.stat().st_size, ALGORITHM: file_crc32(p)}
    return out


def owner(name: str, world: int) -> int:
    """The rank that verifies a file on load: its writer while the world keeps its size (the
    rank that reads it, under FSDP), spread round-robin when it shrank; rank 0 for the rest
    (.metadata). Each rank's share is about 1/world of the bytes, whatever the world."""
    m = _DATA_FILE.match(name)
    return int(m.group(1)) % world if m else 0


def recorded_files(marker: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The marker's {name: record}, None when it has none (written before checksums) or a
    malformed one (verify_files says so)."""
    files = marker.get("files")
    return files if isinstance(files, dict) else None


def share(marker: dict[str, Any], rank: int, world: int) -> dict[str, dict[str, Any]]:
    """The recorded files this rank verifies on load."""
    files = recorded_files(marker) or {}
    return {n: rec for n, rec in files.items() if owner(n, world) == rank}


def checksum_mismatch(name: str, got: str, written: Any) -> str:
    return f"{name} fails its checksum ({ALGORITHM} {got}, {written} written)"


def verify_files(
    step_dir: Path,
    marker: dict[str, Any],
    only: Collection[str] | None = None,
    read: bool | Collection[str] = True,
) -> str | None:
    """None when every recorded file is there with its size and checksum, else what is wrong
    (one phrase). A marker without a file list (written before checksums) passes. `only`:
    the names to check (default: all recorded); `read`: which of them to read and hash (True:
    all; the others get a stat, no data read)."""
    files = marker.get("files")
    if files is None:
        return None
    if not isinstance(files, dict):
        return f"its {CKPT_MARKER} marker has a malformed file list"
    for name, rec in sorted(files.items()):
        if only is not None and name not in only:
            continue
        p = step_dir / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != rec.get("bytes"):
            return f"{name} has {size} bytes, {rec.get('bytes')} were written (truncated?)"
        if read is True or (read is not False and name in read):
            got = file_crc32(p)
            if got != rec.get(ALGORITHM):
                return checksum_mismatch(name, got, rec.get(ALGORITHM))
    return None


def marker_files(step_dir: Path, written: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The marker's file list from the sums the ranks took while writing: every file of the
    step dir but the marker. A file with no sum, or another size on disk than was hashed
    (neither is expected: a safety net), is read and hashed here."""
    out = {}
    for p in sorted(step_dir.iterdir()):
        if not p.is_file() or p.name.startswith(CKPT_MARKER):
            continue
        rec = written.get(p.name)
        size = p.stat().st_size
        if rec is None or rec.get("bytes") != size:
            rec = {"bytes": size, ALGORITHM: file_crc32(p)}
        out[p.name] = rec
    return out


# --- a full disk ------------------------------------------------------------------------------


def _errno_in(e: BaseException, codes: tuple[int, ...]) -> OSError | None:
    """The first OSError with one of `codes` anywhere in an error: itself, its cause/context
    chain, or any rank's failure that DCP gathered into a CheckpointException (`failures`:
    rank -> (exception, trace))."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in codes:
            return x
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None


def is_no_space(e: BaseException) -> bool:
    """ENOSPC anywhere in an error (see _errno_in)."""
    return _errno_in(e, (errno.ENOSPC,)) is not None


# A checkpoint dir that was writable at start and is not now: a filesystem remounted
# read-only (an NFS server's choice, a failing disk), permissions taken away.
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def unwritable_message(e: BaseException, path: Path) -> str | None:
    """One line for a checkpoint write refused by the filesystem (read-only, permission), or
    None when `e` is something else."""
    found = _errno_in(e, _UNWRITABLE)
    if found is None:
        return None
    where = f": {found.filename}" if found.filename not in (None, str(path)) else ""
    return (
        f"cannot write the checkpoint {path} ({found.strerror}{where}); the checkpoint dir "
        f"is not writable now: make {path.parent} writable again (or pass another --ckpt-dir) "
        "and resume from its last complete checkpoint"
    )


def no_space_message(path: Path, needed: int | None = None) -> str:
    """One line: where, how many bytes are free there, how many were needed."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free} bytes free"
    except OSError:
        free = "free space unknown"
    need = f", about {needed} needed" if needed else ""
    return (
        f"no space left on device writing {path} ({free}{need}); free space, lower "
        "--ckpt-keep, or point --run-dir / --ckpt-dir at a larger disk"
    )
