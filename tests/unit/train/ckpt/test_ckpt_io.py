"""Checksums taken while writing and verified while reading (ddpkit.train.ckpt.io): the sums
equal a read-back's, each rank verifies only its share, and damage is caught wherever it is.

Here the tests that run in this process; those that start processes in
tests/process/train/ckpt/test_ckpt_io.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ddpkit.train.ckpt.files import checksum_files, owner, share, verify_files


def _xor(path: Path, offset: int, n: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset : offset + n] = bytes(x ^ 0xFF for x in b[offset : offset + n])
    path.write_bytes(bytes(b))


@pytest.mark.parametrize(
    ("name", "world", "rank"),
    [
        ("__0_0.distcp", 1, 0),
        ("__3_0.distcp", 4, 3),  # same world: the rank that wrote it
        ("__3_1.distcp", 4, 3),
        ("__5_0.distcp", 4, 1),  # the world shrank: round-robin
        ("__1023_0.distcp", 1024, 1023),
        (".metadata", 8, 0),
        ("notes.txt", 8, 0),
    ],
)
def test_each_file_has_one_owner(name, world, rank):
    assert owner(name, world) == rank


def test_each_rank_verifies_about_one_world_th_of_the_files():
    files = {f"__{r}_0.distcp": {"bytes": 1, "crc32": "0"} for r in range(64)}
    marker = {"files": {**files, ".metadata": {"bytes": 1, "crc32": "0"}}}
    shares = [share(marker, r, 8) for r in range(8)]
    assert sorted(n for s in shares for n in s) == sorted(marker["files"])  # each once
    assert [len(s) for s in shares] == [9] + [8] * 7  # rank 0 also has .metadata


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"w{i}": torch.randn(64 + i, 128, generator=g) for i in range(6)}


def test_sums_taken_while_writing_equal_a_read_back(one_rank, tmp_path, monkeypatch):
    from ddpkit.train.ckpt import io as ckpt_io
    from ddpkit.train.ckpt.io import HashingWriter

    monkeypatch.setattr(ckpt_io, "WRITEBACK_AHEAD", 1 << 14)  # fdatasyncs during the write
    for threads in (1, 2):  # two writer threads: two files
        path = tmp_path / f"t{threads}"
        writer = HashingWriter(path, thread_count=threads)
        dcp.save({"m": _state(), "n": 3}, storage_writer=writer)
        assert writer.file_sums == checksum_files(path)
        assert len(writer.file_sums) == threads + 1  # + .metadata


def _load(path: Path, marker: dict, keys: dict) -> None:
    from ddpkit.train.ckpt.io import VerifyingReader

    dcp.load(keys, storage_reader=VerifyingReader(path, share(marker, 0, 1)))


@pytest.fixture
def saved(one_rank, tmp_path) -> tuple[Path, dict]:
    from ddpkit.train.ckpt.io import HashingWriter

    path = tmp_path / "ck"
    writer = HashingWriter(path, thread_count=2)
    dcp.save({"m": _state()}, storage_writer=writer)
    return path, {"files": writer.file_sums}


def test_a_clean_checkpoint_loads_and_verifies(saved):
    path, marker = saved
    got = {"m": {k: torch.zeros_like(v) for k, v in _state().items()}}
    _load(path, marker, got)
    assert all(torch.equal(got["m"][k], v) for k, v in _state().items())
    assert verify_files(path, marker) is None


@pytest.mark.parametrize("offset", [0, 100, -5000, -30])  # zip header, data, zip directory
def test_damage_anywhere_in_a_read_file_is_a_checksum_error(saved, offset):
    from ddpkit.train.ckpt.io import ChecksumError

    path, marker = saved
    f = path / "__0_0.distcp"
    _xor(f, offset % f.stat().st_size, 16)
    with pytest.raises(BaseException) as e:  # DCP gathers it into a CheckpointException
        _load(path, marker, {"m": {k: torch.zeros_like(v) for k, v in _state().items()}})
    [(exc, _)] = e.value.failures.values()
    assert isinstance(exc, ChecksumError) and "__0_0.distcp fails its checksum" in str(exc)


def test_a_file_of_the_share_that_nothing_is_read_from_is_still_verified(saved):
    path, marker = saved
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    where = {k.fqn: v.relative_path for k, v in meta.storage_data.items()}
    other = where["m.w0"]
    unread = next(f for f in marker["files"] if f not in (other, ".metadata"))
    _xor(path / unread, 200, 8)
    with pytest.raises(BaseException) as e:  # loads one tensor, from the other file
        _load(path, marker, {"m": {"w0": torch.zeros(64, 128)}})
    assert f"{unread} fails its checksum" in str(e.value)


def test_the_checksum_is_zlibs_crc32_whichever_implementation_runs() -> None:
    """ISA-L's CRC-32 (when installed) gives zlib's values, chained over pieces as the
    hashing stream feeds it, so checkpoints verify on machines with and without it."""
    import os
    import zlib

    from ddpkit.train.ckpt.files import crc32

    data = os.urandom(3 << 20)
    pieces = [memoryview(data)[i : i + 65_537] for i in range(0, len(data), 65_537)]
    crc = 0
    for piece in pieces:
        crc = crc32(piece, crc)
    assert crc == zlib.crc32(data)


def test_torch_saves_own_crc_is_off_only_while_checkpoints_write() -> None:
    """Overlapping saves (an async one still writing when the next starts) leave torch.save's
    process-wide CRC option as it was once the last one ends."""
    import torch.serialization as ser
    from ddpkit.train.ckpt.io import _zip_crc32_off

    assert ser.get_crc32_options()
    first, second = _zip_crc32_off(), _zip_crc32_off()
    first.__enter__()
    second.__enter__()
    assert not ser.get_crc32_options()
    first.__exit__(None, None, None)  # the first to start ends first
    assert not ser.get_crc32_options()  # the other is still writing
    second.__exit__(None, None, None)
    assert ser.get_crc32_options()


def test_a_checkpoints_step_is_read_from_a_local_dir_and_from_a_store_url(tmp_path):
    """Resume notes the step it is ready from for goodput: a store's checkpoint comes back as
    its URL (a str), a local one as a Path (CI caught the str case)."""
    from ddpkit.train.ckpt.layout import step_of

    assert step_of(tmp_path / "step-00000012") == 12
    assert step_of("s3://bucket/run/step-00000012") == 12
    assert step_of("s3://bucket/run/step-00000012/") == 12
    assert step_of("s3://bucket/run/latest") is None
