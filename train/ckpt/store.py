"""Where checkpoints live: a local directory, or an object store named by an fsspec URL
(`s3://bucket/prefix`; s3fs serves S3 and S3-compatible servers). The one place that knows
the difference; the manager asks it, the rest of the package sees local step dirs only.

A save streams each rank's data files into the store as DCP writes them (StreamingUpload:
multipart parts go up while the next bytes are serialized and hashed; in DCP's background
thread for an async save, so training does not wait for the upload); only `.metadata` goes
through the local staging dir (`local_dir`: node-local, one per URL). Rank 0 uploads
`.metadata` next and the marker last, once every rank's upload returned: an upload cut short
leaves no marker, and a step prefix without one is never loaded. A load by the one process
of a host reads the data files as they arrive (StreamingDownload: parts fetched ahead while
the earlier ones are deserialized and hashed; only `.metadata` and the marker are staged);
processes sharing a host download the step into the staging dir once and load that copy.
Either way every file is verified against the marker's CRC-32s as a local load does: a
damaged object fails its checksum and the next older checkpoint is tried. Keep-K deletes a
dropped step's marker first, then its objects; a rewind (--resume of an older step) moves
the later steps under `abandoned/`; the run's summary.json is kept beside the steps.

Credentials and the endpoint come from the environment the way every AWS client reads them
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_PROFILE, ...): the kit never
writes them anywhere and no message names them. Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from ddpkit.train.ckpt.files import METADATA
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import CKPT_STEP_PREFIX, is_remote
from ddpkit.train.errors import ConfigError

STAGE_ENV = "DDPKIT_CKPT_STAGE"  # where a remote checkpoint dir is staged (default: tmp)
# What S3 clients read from the environment: a container backend passes these by name from the
# submitting shell (never their values into a rendered command or manifest).
CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


def split_step(url: str) -> tuple[Remote, str] | None:
    """(the store dir, the step name) of a step URL (`s3://b/run/step-40`), else None."""
    parent, _, name = url.rstrip("/").rpartition("/")
    if step_number(name) is None or not is_remote(parent):
        return None
    return Remote(parent), name


def local_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The directory on this machine that holds the checkpoints: the dir itself, or a
    remote one's staging dir (STAGE_ENV, else under the temp dir, keyed by the URL)."""
    if not is_remote(ckpt_dir):
        return Path(ckpt_dir)
    key = hashlib.sha1(str(ckpt_dir).rstrip("/").encode()).hexdigest()[:12]
    base = os.environ.get(STAGE_ENV) or Path(tempfile.gettempdir()) / f"ddpkit-stage-{os.getuid()}"
    return Path(base) / key


def _describe(e: BaseException) -> str:
    """One phrase for a store error, from the server's own words (no credentials in them)."""
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class Remote:
    """A checkpoint dir in an object store: step prefixes under `url`."""

    def __init__(self, url: str):
        try:
            from fsspec.core import url_to_fs
        except ImportError:
            raise ConfigError(_missing_package(url)) from None
        self.url = url.rstrip("/")
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
        """The URL of a step (what messages name)."""
        return f"{self.url}/{name}"

    # --- before training --------------------------------------------------------------------

    def check(self) -> str | None:
        """None when the bucket is there and takes a write and a delete here, else one line
        naming the problem and the fix (wrong credentials, a missing bucket, no server)."""
        probe = self.key(f".ddpkit-probe-{os.getpid()}")
        try:
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except Exception as e:
            return self.problem(e, "--ckpt-dir ", "write to")
        return None

    def problem(self, e: BaseException, what: str = "", access: str = "read") -> str:
        """One line for a failed request: wrong credentials, a missing bucket, no server."""
        bucket = self.root.split("/", 1)[0]
        if isinstance(e, PermissionError):
            return (
                f"{what}{self.url}: the object store refused the credentials ({_describe(e)}); "
                "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) to a key that "
                f"may {access} the bucket"
            )
        if isinstance(e, FileNotFoundError):
            return (
                f"{what}{self.url}: no bucket {bucket!r} at the object store; create it or "
                "name an existing bucket"
            )
        return (  # no server, a bad endpoint, a bad bucket name
            f"{what}{self.url}: cannot {access} the object store ({_describe(e)}); check "
            "AWS_ENDPOINT_URL and that the server is up"
        )

    # --- what is there ------------------------------------------------------------------------

    def steps(self) -> list[str]:
        """The step prefixes, oldest first."""
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            self.known = set()
            return []
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]
        steps = [n for n in names if step_number(n) is not None]
        self.known = (self.known or set()) | set(steps)  # more is safe: one more clear
        return sorted(steps, key=lambda n: step_number(n) or -1)

    def marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the step's marker, None) or (None, why it is incomplete), as layout.marker."""
        from ddpkit.train.ckpt.layout import marker_of

        info, why = marker_of(lambda: self.fs.cat_file(self.key(name, MARKER)))
        if info is None:
            return None, why
        if not self.fs.exists(self.key(name, METADATA)):
            return None, f"no {METADATA}: an interrupted upload"
        return info, None

    def scan(self) -> tuple[list[str], dict[str, str]]:
        """(complete step names oldest first, {incomplete step name: why})."""
        complete, partial = [], {}
        for name in self.steps():
            info, why = self.marker(name)
            if info is None:
                partial[name] = why or "incomplete"
            else:
                complete.append(name)
        return complete, partial

    # --- moving files -------------------------------------------------------------------------

    def open_upload(self, step: str, name: str) -> Any:
        """A write stream straight into the store's object `step/name`: parts go up while
        the writer serializes the next bytes (StreamingUpload); a filesystem without S3's
        multipart calls gets fsspec's own buffered file."""
        key = self.key(step, name)
        if self.known is not None:
            self.known.add(step)
        if hasattr(self.fs, "_call_s3"):
            return StreamingUpload(self.fs, key)
        return self.fs.open(key, "wb")

    def upload(self, step_dir: Path, names: list[str]) -> None:
        """Put these files of a local step dir under the step's prefix (concurrently; large
        files in parts)."""
        if self.known is not None:
            self.known.add(step_dir.name)
        if names:
            self.fs.put(
                [str(step_dir / n) for n in names], [self.key(step_dir.name, n) for n in names]
            )

    def sizes(self, name: str) -> dict[str, int]:
        """{file name: bytes} of a step's objects, from one listing."""
        self.fs.invalidate_cache(self.key(name))
        entries = self.fs.ls(self.key(name), detail=True)
        return {e["name"].rstrip("/").rsplit("/", 1)[-1]: e["size"] for e in entries}

    def open_download(self, name: str, file: str, size: int) -> StreamingDownload:
        """A read stream of the object `name/file` (StreamingDownload; S3 filesystems)."""
        return StreamingDownload(self.fs, self.key(name, file), size)

    def put(self, name: str, data: bytes) -> None:
        """One small object beside the steps (the run's summary.json)."""
        self.fs.pipe_file(self.key(name), data)

    def download(self, name: str, dest: Path, files: list[str]) -> None:
        """Get a step's files (the marker's list) and its marker into `dest`, marker last."""
        dest.mkdir(parents=True, exist_ok=True)
        if files:
            self.fs.get([self.key(name, n) for n in files], [str(dest / n) for n in files])
        self.fs.get_file(self.key(name, MARKER), str(dest / MARKER))

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
        """Move a step to the prefix `aside` (a rewind's old timeline): its objects copied
        there (server-side), then the step removed marker first; cut short, nothing is lost."""
        keys = self.fs.find(self.key(name))
        self.fs.copy(keys, [self.key(aside, k[len(self.key(name)) + 1 :]) for k in keys])
        self.remove(name)

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` complete steps; drop incomplete ones older than the newest."""
        complete, partial = self.scan()
        newest = step_number(complete[-1]) if complete else -1
        for name in complete[:-keep]:
            self.remove(name)
        for name in partial:
            if (step_number(name) or 0) < (newest or 0):
                self.remove(name)


class StreamingUpload:
    """A write-only stream that is an S3 multipart upload: every PART_BYTES written go up as
    one part on s3fs's event loop while the writer goes on (at most MAX_INFLIGHT parts held
    in memory), so a save's serializing and hashing overlap its upload instead of coming
    before it (a staged file written, read back and put took ~1.7x a raw put of the same
    bytes). A file smaller than a part is one put_object. close() completes the upload; a
    stream closed after an error (abort()) leaves no object behind."""

    PART_BYTES = 32 << 20  # S3 takes 5 MiB..5 GiB per part, 10,000 parts
    MAX_INFLIGHT = 8

    def __init__(self, fs: Any, key: str):
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(key)
        self.buf = bytearray()
        self.nbytes = 0
        self.upload_id: str | None = None
        self.parts: list[Any] = []  # concurrent futures of upload_part, in part order
        self.closed = False

    def _call(self, method: str, **kw: Any) -> Any:
        """Start one S3 call on s3fs's loop; its concurrent future."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(
            self.fs._call_s3(method, Bucket=self.bucket, Key=self.key, **kw), self.fs.loop
        )

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self.buf += view
        self.nbytes += view.nbytes
        while len(self.buf) >= self.PART_BYTES:
            self._send(bytes(self.buf[: self.PART_BYTES]))
            del self.buf[: self.PART_BYTES]
        return view.nbytes

    def _send(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload").result()["UploadId"]
        inflight = [f for f in self.parts if not f.done()]
        if len(inflight) >= self.MAX_INFLIGHT:
            inflight[0].result()  # back-pressure: memory stays bounded
        n = len(self.parts) + 1
        self.parts.append(
            self._call("upload_part", PartNumber=n, UploadId=self.upload_id, Body=body)
        )

    def tell(self) -> int:
        return self.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.upload_id is None:
                self._call("put_object", Body=bytes(self.buf)).result()
            else:
                if self.buf:
                    self._send(bytes(self.buf))
                done = [
                    {"PartNumber": i + 1, "ETag": f.result()["ETag"]}
                    for i, f in enumerate(self.parts)
                ]
                self._call(
                    "complete_multipart_upload",
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": done},
                ).result()
        except BaseException:
            self.abort()
            raise
        finally:
            self.buf = bytearray()
        self.fs.invalidate_cache(f"{self.bucket}/{self.key}")

    def abort(self) -> None:
        """Drop a multipart upload: a stream that failed half way leaves no object."""
        self.closed = True
        if self.upload_id is not None:
            for f in self.parts:
                f.cancel()
            # a failed abort is harmless: the server drops stale uploads, no marker was written
            with contextlib.suppress(Exception):
                self._call("abort_multipart_upload", UploadId=self.upload_id).result()


class StreamingDownload(io.RawIOBase):
    """A read stream over one object of known size whose parts come ahead of the reader
    (the mirror of StreamingUpload): ranged GETs of PART_BYTES, AHEAD of them in flight on
    s3fs's loop, so a load deserializes and hashes one part while the next ones arrive,
    and nothing goes through the disk (a download to the staging dir, then a load of it,
    took the sum of both). A seek behind the parts held fetches again."""

    PART_BYTES = 16 << 20
    AHEAD = 8

    def __init__(self, fs: Any, key: str, size: int):
        super().__init__()
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(key)
        self.size = size
        self.pos = 0
        self.parts: dict[int, Any] = {}  # part index -> concurrent future of its bytes

    def _get(self, i: int) -> Any:
        import asyncio

        start = i * self.PART_BYTES
        end = min(self.size, start + self.PART_BYTES) - 1

        async def get() -> bytes:
            resp = await self.fs._call_s3(
                "get_object", Bucket=self.bucket, Key=self.key, Range=f"bytes={start}-{end}"
            )
            try:
                return await resp["Body"].read()
            finally:
                resp["Body"].close()

        return asyncio.run_coroutine_threadsafe(get(), self.fs.loop)

    def _part(self, i: int) -> bytes:
        last = (self.size - 1) // self.PART_BYTES
        for j in range(i, min(i + self.AHEAD, last + 1)):
            if j not in self.parts:
                self.parts[j] = self._get(j)
        for j in [j for j in self.parts if j < i]:  # behind the reader: dropped
            self.parts.pop(j).cancel()
        data = self.parts[i].result()
        want = min(self.size, (i + 1) * self.PART_BYTES) - i * self.PART_BYTES
        if len(data) != want:
            raise OSError(f"{self.key}: {len(data)} bytes of part {i}, {want} expected")
        return data

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        out = []
        while self.pos < end:
            i, off = divmod(self.pos, self.PART_BYTES)
            data = self._part(i)
            chunk = data[off : off + end - self.pos] if off or end - self.pos < len(data) else data
            out.append(chunk)
            self.pos += len(chunk)
        return out[0] if len(out) == 1 else b"".join(out)

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b)))
        memoryview(b).cast("B")[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        for f in self.parts.values():
            f.cancel()
        self.parts = {}
        super().close()


def step_number(name: str) -> int | None:
    rest = name[len(CKPT_STEP_PREFIX) :] if name.startswith(CKPT_STEP_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


def _missing_package(url: str, e: BaseException | None = None) -> str:
    scheme = url.split("://", 1)[0]
    why = f" ({_describe(e)})" if e is not None else ""
    return (
        f"--ckpt-dir {url}: no filesystem for {scheme}://{why}; install its fsspec package "
        "(s3fs for s3://: pip install 'ddpkit[s3]')"
    )


def check_ckpt_dir(ckpt_dir: str) -> None:
    """ConfigError (one line) unless a remote checkpoint dir can be written now."""
    if is_remote(ckpt_dir) and (problem := Remote(ckpt_dir).check()) is not None:
        raise ConfigError(problem)


def fetch(url: str, dest: Path) -> tuple[Path, str]:
    """(a local copy under `dest`, its step's URL) of a checkpoint in a store (`ddpkit ckpt`): the step
    URL given, else the newest complete step under the URL or under its checkpoints/. The
    copy's files are verified by whoever reads it (the marker comes along)."""
    remote = Remote(url)
    try:
        name = remote.root.rsplit("/", 1)[-1]
        if step_number(name) is not None:
            remote = Remote(remote.url.rsplit("/", 1)[0])
        else:
            complete, partial = remote.scan()
            if not complete and not partial:
                inner = Remote(f"{remote.url}/checkpoints")
                complete, partial = inner.scan()
                remote = inner if complete or partial else remote
            if not complete and not remote.fs.exists(remote.root.split("/", 1)[0]):
                raise FileNotFoundError(remote.root)  # no bucket: said as such below
            if not complete:
                got = ", ".join(sorted(partial)[-3:])
                raise ConfigError(
                    f"{url}: no complete checkpoint"
                    + (f" ({got} lack {MARKER}: an upload was cut short)" if got else "")
                    + "; pass a run's checkpoint URL or a step-N URL"
                )
            name = complete[-1]
        info, why = remote.marker(name)
        if info is None:
            raise ConfigError(f"{remote.where(name)}: not a complete checkpoint ({why})")
        remote.download(name, dest / name, sorted((info.get("files") or {}).keys()))
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(remote.problem(e)) from None
    return dest / name, remote.where(name)
