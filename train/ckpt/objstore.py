"""Checkpoints in an object store named by an fsspec URL (`s3://bucket/prefix`; s3fs serves
S3 and S3-compatible servers): step prefixes under the URL, written through a node-local
staging dir (`store.local_dir`, one per URL).

A save streams each rank's data files into the store as DCP writes them (streams.StreamingUpload:
multipart parts go up while the next bytes are serialized and hashed; in DCP's background
thread for an async save, so training does not wait for the upload); only `.metadata` goes
through the staging dir. Rank 0 uploads `.metadata` next and the marker last, once every
rank's upload returned: an upload cut short leaves no marker, and a step prefix without one
is never loaded. A load by the one process of a host reads the data files as they arrive
(streams.StreamingDownload: parts fetched ahead while the earlier ones are deserialized and hashed;
only `.metadata` and the marker are staged); processes sharing a host download the step into
the staging dir once and load that copy. Either way every file is verified against the
marker's CRC-32s as a local load does: a damaged object fails its checksum and the next older
checkpoint is tried. Keep-K deletes a dropped step's marker first, then its objects; a rewind
moves the later steps under `abandoned/`; the run's summary.json is kept beside the steps.
Torch-free at import.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from ddpkit.train.ckpt.files import METADATA
from ddpkit.train.ckpt.layout import marker_of
from ddpkit.train.ckpt.localstore import fresh_dir, write_marker
from ddpkit.train.ckpt.store import StepRead, describe, local_dir, step_number
from ddpkit.train.ckpt.streams import StreamingDownload, StreamingUpload
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.errors import ConfigError


def _missing_package(url: str, e: BaseException | None = None) -> str:
    scheme = url.split("://", 1)[0]
    why = f" ({describe(e)})" if e is not None else ""
    return (
        f"--ckpt-dir {url}: no filesystem for {scheme}://{why}; install its fsspec package "
        "(s3fs for s3://: pip install 'ddpkit[s3]')"
    )


class ObjectStore:
    """A checkpoint dir in an object store: step prefixes under `url`."""

    drop_hint = "delete them"

    def __init__(self, url: str):
        try:
            from fsspec.core import url_to_fs
        except ImportError:
            raise ConfigError(_missing_package(url)) from None
        self.url = url.rstrip("/")
        self.dir = local_dir(self.url)
        try:
            self.fs, self.root = url_to_fs(self.url)
        except (ImportError, ValueError) as e:
            raise ConfigError(_missing_package(url, e)) from None
        self.root = self.root.rstrip("/")
        # The step prefixes in the store as this process last listed them, plus those it
        # wrote since: a save clears its step's leftovers only when one may be there, so a
        # save to a new step costs the loop no request (None: not listed yet).
        self.known: set[str] | None = None

    def key(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def holds(self, where: str | os.PathLike[str]) -> bool:
        return str(where).startswith(f"{self.url}/")

    # --- before training --------------------------------------------------------------------

    def check(self, wait_s: float = 0.0) -> str | None:
        """None when the bucket is there and takes a write and a delete here, else one line
        naming the problem and the fix (wrong credentials, a missing bucket, no server).
        Only a store that does not answer is asked again, every 2 s for `wait_s`."""
        probe = self.key(f".ddpkit-probe-{os.getpid()}")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.fs.pipe_file(probe, b"")
                self.fs.rm_file(probe)
                return None
            except (PermissionError, FileNotFoundError) as e:  # a setting: no wait cures it
                return self.problem(e, "--ckpt-dir ", "write to")
            except Exception as e:
                if time.monotonic() >= deadline:
                    return self.problem(e, "--ckpt-dir ", "write to")
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))

    def problem(self, e: BaseException, what: str = "", access: str = "read") -> str:
        """One line for a failed request: wrong credentials, a missing bucket, no server."""
        bucket = self.root.split("/", 1)[0]
        if isinstance(e, PermissionError):
            return (
                f"{what}{self.url}: the object store refused the credentials ({describe(e)}); "
                "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key that "
                f"may {access} the bucket"
            )
        if isinstance(e, FileNotFoundError):
            return (
                f"{what}{self.url}: no bucket {bucket!r} at the object store; create it or "
                "name an existing bucket"
            )
        return (  # no server, a bad endpoint, a bad bucket name
            f"{what}{self.url}: cannot {access} the object store ({describe(e)}); check "
            "AWS_ENDPOINT_URL and that the server is up"
        )

    # --- what is there ------------------------------------------------------------------------

    def steps(self) -> list[str]:
        """The step prefixes, oldest first (FileNotFoundError: no such bucket)."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            if not self.fs.exists(self.root.split("/", 1)[0]):
                raise  # no bucket: said as such by problem(), not as an empty store
            self.known = set()
            return []
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]
        steps = [n for n in names if step_number(n) is not None]
        self.known = (self.known or set()) | set(steps)  # more is safe: one more clear
        return sorted(steps, key=lambda n: step_number(n) or -1)

    def marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        info, why = marker_of(lambda: self.fs.cat_file(self.key(name, MARKER)))
        if info is None:
            return None, why
        if not self.fs.exists(self.key(name, METADATA)):
            return None, f"no {METADATA}: an interrupted upload"
        return info, None

    def scan(self) -> tuple[list[str], dict[str, str]]:
        complete, partial = [], {}
        for name in self.steps():
            info, why = self.marker(name)
            if info is None:
                partial[name] = why or "incomplete"
            else:
                complete.append(name)
        return complete, partial

    # --- a save -------------------------------------------------------------------------------

    def prepare(self, name: str) -> None:
        fresh_dir(self.dir / name)
        self.clear(name)  # an interrupted upload of the same step

    def writer(self, path: Path) -> Any:
        from ddpkit.train.ckpt.io import UploadingWriter

        return UploadingWriter(path, self)

    def commit(self, path: Path, info: dict[str, Any], sums: dict[str, Any]) -> str:
        # The files are uploaded and gone from the staging dir: the sums every rank took
        # while writing are the list. The marker last: every rank's files are up.
        info["files"] = dict(sorted(sums.items()))
        write_marker(path, info)
        self.upload(path, [MARKER])
        shutil.rmtree(path, ignore_errors=True)
        return self.where(path.name)

    def open_upload(self, step: str, name: str) -> Any:
        """A write stream straight into the store's object `step/name`: parts go up while
        the writer serializes the next bytes (StreamingUpload); a filesystem without S3's
        multipart calls gets fsspec's own buffered file."""
        key = self.key(step, name)
        if self.known is not None:
            self.known.add(step)
        if self._s3:
            return StreamingUpload(self.fs, key)
        return self.fs.open(key, "wb")

    @property
    def _s3(self) -> bool:
        """s3fs's client (the multipart and ranged calls the streams make)."""
        return hasattr(self.fs, "_call_s3")

    def upload(self, step_dir: Path, names: list[str]) -> None:
        """Put these files of a local step dir under the step's prefix (concurrently; large
        files in parts)."""
        if self.known is not None:
            self.known.add(step_dir.name)
        if names:
            self.fs.put(
                [str(step_dir / n) for n in names], [self.key(step_dir.name, n) for n in names]
            )

    def put(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(self.key(name), data)

    # --- a load -------------------------------------------------------------------------------

    def read(self, name: str, dest: Path, here: bool, whole: bool = False) -> StepRead:
        """The one process of a host reads the data files as they arrive, not downloaded
        first (several share one download: each would fetch what it reads); the host's copy
        (`here`) then holds only .metadata and the marker, the data files' sizes checked in
        the store (the load hashes their bytes)."""
        stream = not whole and self._s3 and os.environ.get("LOCAL_WORLD_SIZE", "1") == "1"

        def arriving(file: str, size: int) -> StreamingDownload:
            return StreamingDownload(self.fs, self.key(name, file), size)

        opener = arriving if stream else None
        if not here:
            return StepRead(dest, opener)
        shutil.rmtree(dest, ignore_errors=True)
        info, why = self.marker(name)
        if info is None:
            return StepRead(dest, opener, why)
        files = info.get("files") or {}
        if stream:
            sizes = self.sizes(name)
            for file, rec in sorted(files.items()):
                if file not in sizes:
                    return StepRead(dest, opener, f"{file} is missing")
                if sizes[file] != rec.get("bytes"):
                    why = f"{file} has {sizes[file]} bytes, {rec.get('bytes')} were written"
                    return StepRead(dest, opener, why)
        self.download(name, dest, [METADATA] if stream and files else sorted(files))
        return StepRead(dest, opener)

    def sizes(self, name: str) -> dict[str, int]:
        """{file name: bytes} of a step's objects, from one listing."""
        self.fs.invalidate_cache(self.key(name))
        entries = self.fs.ls(self.key(name), detail=True)
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: e["size"] for e in entries}

    def download(self, name: str, dest: Path, files: list[str]) -> None:
        """Get a step's files (the marker's list) and its marker into `dest`, marker last."""
        dest.mkdir(parents=True, exist_ok=True)
        if files:
            self.fs.get([self.key(name, n) for n in files], [str(dest / n) for n in files])
        self.fs.get_file(self.key(name, MARKER), str(dest / MARKER))

    # --- dropping steps -----------------------------------------------------------------------

    def clear(self, name: str) -> None:
        """No object of step `name` before it is written anew (an interrupted upload's, or
        an older timeline's): one listing the first time, then only steps known to be there."""
        if self.known is None:
            self.steps()
        if self.known is None or name in self.known:
            self.remove(name)

    def remove(self, name: str) -> None:
        """Delete a step: its marker first (a deletion cut short leaves an incomplete step,
        never a complete-looking one with objects missing)."""
        if self.fs.exists(self.key(name, MARKER)):
            self.fs.rm_file(self.key(name, MARKER))
        if self.fs.exists(self.key(name)):
            self.fs.rm(self.key(name), recursive=True)
        if self.known is not None:
            self.known.discard(name)

    def set_aside(self, name: str, aside: str) -> None:
        """Its objects copied to `aside` (server-side), then the step removed marker first."""
        keys = self.fs.find(self.key(name))
        self.fs.copy(keys, [self.key(aside, k[len(self.key(name)) + 1 :]) for k in keys])
        self.remove(name)

    def prune(self, keep: int) -> None:
        complete, partial = self.scan()
        newest = step_number(complete[-1]) if complete else -1
        for name in complete[:-keep]:
            self.remove(name)
        for name in partial:
            if (step_number(name) or 0) < (newest or 0):
                self.remove(name)
