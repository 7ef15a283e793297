"""Checksums of a checkpoint's files (torch-free: the trainer and tools/ckpt.py share it).

Rank 0 records every file of a step dir in the `.complete` marker after the save,
{name: {"bytes": size, "crc32": "08x"}}, and the resume verifies them before loading. zlib's
CRC-32 was picked by measured speed: ~2.1 GB/s vs blake2b ~0.9 GB/s and sha256 ~1.0 GB/s on
the dev machine (256 MiB in memory, idle), and it catches flipped, zeroed and truncated bytes; it is
not a defence against someone forging a checkpoint (DCP's metadata is pickled anyway:
load only from storage you trust).
"""

from __future__ import annotations

import errno
import shutil
import zlib
from pathlib import Path
from typing import Any

from ddpkit.train.contract import CKPT_MARKER

ALGORITHM = "crc32"
_CHUNK = 8 << 20


def file_crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def checksum_files(step_dir: Path) -> dict[str, dict[str, Any]]:
    """Every file of a step dir but the marker, with its size and CRC-32."""
    out = {}
    for p in sorted(step_dir.iterdir()):
        if p.is_file() and not p.name.startswith(CKPT_MARKER):
            out[p.name] = {"bytes": p.stat().st_size, ALGORITHM: file_crc32(p)}
    return out


def verify_files(step_dir: Path, marker: dict[str, Any]) -> str | None:
    """None when every recorded file is there with its size and checksum, else what is wrong
    (one phrase). A marker without a file list (written before checksums) passes."""
    files = marker.get("files")
    if files is None:
        return None
    if not isinstance(files, dict):
        return f"its {CKPT_MARKER} marker has a malformed file list"
    for name, rec in sorted(files.items()):
        p = step_dir / name
        if not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != rec.get("bytes"):
            return f"{name} has {size} bytes, {rec.get('bytes')} were written (truncated?)"
        got = file_crc32(p)
        if got != rec.get(ALGORITHM):
            return f"{name} fails its checksum ({ALGORITHM} {got}, {rec.get(ALGORITHM)} written)"
    return None


# --- a full disk ------------------------------------------------------------------------------


def is_no_space(e: BaseException) -> bool:
    """ENOSPC anywhere in an error: itself, its cause/context chain, or any rank's failure
    that DCP gathered into a CheckpointException (`failures`: rank -> (exception, trace))."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno == errno.ENOSPC:
            return True
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return False


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
