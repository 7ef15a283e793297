"""S3 multipart streams: a save's data file goes up while it is written, a load's comes down
ahead of the reader (s3fs's client and event loop; ckpt.objstore uses them where its
filesystem is S3's). Torch-free."""

from __future__ import annotations

import contextlib
import io
from typing import Any


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
