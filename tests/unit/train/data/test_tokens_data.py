"""Token files: windows read per batch (never a full int64 copy, never a start-up scan), a
directory of shards as one dataset, bad files and bad ids as one line.

Here the tests that run in this process; those that start processes in
tests/process/train/data/test_tokens_data.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ddpkit.train.config import ConfigError, TrainConfig
from ddpkit.train.data import (
    GlobalBatchSampler,
    TokenChunks,
    TokenFile,
    iterate_batches,
    token_file,
    tokens,
)


def _cfg(path, **kw) -> TrainConfig:
    return TrainConfig(model="gpt", dataset="tokens", data_dir=str(path), seq_len=8, **kw)


def test_windows_are_read_from_the_file_and_widened_per_batch(tmp_path):
    ids = np.random.default_rng(0).integers(0, 500, 10_001).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    ids[:1001].tofile(tmp_path / "val.bin")
    data = token_file(_cfg(tmp_path, vocab_size=512))
    assert isinstance(data.train.tokens, TokenFile) and data.train.tokens.dtype == np.uint16
    assert len(data.train) == 10_000 // 8 and len(data.val) == 1000 // 8
    x, y = data.train.batch([3, 0, 1249])
    assert x.dtype == y.dtype == torch.int64
    for row, i in enumerate([3, 0, 1249]):
        xi, yi = data.train[i]
        assert x[row].tolist() == xi.tolist() == ids[i * 8 : i * 8 + 8].tolist()
        assert y[row].tolist() == yi.tolist() == ids[i * 8 + 1 : i * 8 + 9].tolist()


def test_uint32_ids_above_a_uint16_vocabulary(tmp_path):
    ids = np.array([70_000, 1, 99_999, 5] * 10, dtype=np.uint32)
    ids.tofile(tmp_path / "train.bin")
    data = token_file(_cfg(tmp_path, vocab_size=100_000))
    assert data.train.tokens.dtype == np.uint32
    assert data.train.batch([0])[0][0, :4].tolist() == [70_000, 1, 99_999, 5]


def test_a_token_file_dataset_pickles_as_its_path(tmp_path):
    import pickle

    np.arange(1_000_001, dtype=np.uint16).astype(np.uint16).tofile(tmp_path / "train.bin")
    ds = token_file(_cfg(tmp_path, vocab_size=65_536)).train
    blob = pickle.dumps(ds)  # what a spawn/forkserver DataLoader worker receives
    assert len(blob) < 1000
    again = pickle.loads(blob)
    assert again[7][0].tolist() == ds[7][0].tolist()


def test_synthetic_tokens_keep_working_without_a_file():
    from ddpkit.train.data import synthetic_tokens

    data = synthetic_tokens(TrainConfig(model="gpt", synthetic_samples=64, seq_len=16))
    assert isinstance(data.train, TokenChunks) and data.train.batch([0, 1])[0].shape == (2, 16)


def test_start_up_reads_no_token_bytes(tmp_path):
    """A sparse 1 TB file opens in a stat: its size and width are checked, not its ids."""
    with open(tmp_path / "train.bin", "wb") as f:
        f.truncate(2**40)  # sparse: costs no disk
    data = token_file(_cfg(tmp_path, vocab_size=512))
    assert len(data.train) == (2**39 - 1) // 8
    assert data.train.batch([len(data.train) - 1])[0].shape == (1, 8)


def _bad_id_file(path, at: int, n: int = 1001) -> None:
    ids = np.arange(n, dtype=np.uint16) % 500
    ids[at] = 600
    ids.tofile(path)


def test_a_bad_id_is_named_with_its_file_and_offset_when_read(tmp_path):
    _bad_id_file(tmp_path / "train.bin", at=520)
    data = token_file(_cfg(tmp_path, vocab_size=512))  # no scan: start-up does not see it
    data.train.batch([0, 1, 63])  # windows that do not hold it read fine
    want = (
        f"training token file {tmp_path}/train.bin holds id 600 at token 520 (byte 1040) >= "
        "--vocab-size 512; raise --vocab-size, or rewrite the file with ids below it"
    )
    for idx in ([3, 64], [65]):  # 520: window 64's last target, window 65's first input
        with pytest.raises(ConfigError) as e:
            data.train.batch(idx)
        assert str(e.value) == want
    with pytest.raises(ConfigError, match="at token 520 "):
        data.train[65]  # the eval path reads single windows


def test_a_bad_id_through_dataloader_workers_is_the_same_line(tmp_path):
    _bad_id_file(tmp_path / "train.bin", at=517)
    ds = token_file(_cfg(tmp_path, vocab_size=512)).train
    sampler = GlobalBatchSampler(len(ds), len(ds), 1, 0, seed=0)  # one batch: every window
    with pytest.raises(ConfigError) as e:
        next(iterate_batches(ds, sampler, torch.device("cpu"), 2, 0))
    assert str(e.value).startswith(f"training token file {tmp_path}/train.bin holds id 600 at")
    assert "\n" not in str(e.value)


def test_workers_read_the_same_batches_as_the_main_process(tmp_path):
    ids = np.random.default_rng(1).integers(0, 500, 8 * 40 + 1).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    ds = token_file(_cfg(tmp_path, vocab_size=512)).train
    got = {}
    for workers in (0, 2):
        s = GlobalBatchSampler(len(ds), 4, 1, 0, seed=3)
        it = iterate_batches(ds, s, torch.device("cpu"), workers, 0)
        got[workers] = [next(it) for _ in range(10)]
    for (x0, y0), (x2, y2) in zip(got[0], got[2], strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def _shards(d, lengths: dict[str, int]) -> dict[str, np.ndarray]:
    d.mkdir(exist_ok=True)
    out = {}
    for k, (name, n) in enumerate(lengths.items()):
        out[name] = (np.arange(n, dtype=np.uint16) + 1000 * k) % 4000
        out[name].tofile(d / name)
    return out


def test_a_directory_of_shards_is_one_dataset(tmp_path):
    d = tmp_path / "fineweb"
    ids = _shards(
        d,
        {
            "fineweb_train_000002.bin": 8 * 3 + 1,  # 3 windows
            "fineweb_train_000001.bin": 8 * 5 + 4,  # 5 windows, 3 tokens of tail unused
            "fineweb_train_000003.bin": 5,  # a short last shard: no window
            "fineweb_val_000000.bin": 8 * 2 + 1,
        },
    )
    (d / "notes.txt").write_text("not a shard")
    data = token_file(_cfg(d, vocab_size=4096))
    names = [f.path.name for f in data.train.tokens]
    assert names == [f"fineweb_train_00000{i}.bin" for i in (1, 2, 3)]  # sorted by name
    assert len(data.train) == 5 + 3 and len(data.val) == 2
    x, y = data.train.batch(list(range(8)))
    first, second = ids["fineweb_train_000001.bin"], ids["fineweb_train_000002.bin"]
    for row in range(8):  # windows never cross a file: each is one shard's tokens
        src, k = (first, row) if row < 5 else (second, row - 5)
        assert x[row].tolist() == src[k * 8 : k * 8 + 8].tolist()
        assert y[row].tolist() == src[k * 8 + 1 : k * 8 + 9].tolist()
    assert data.val[1][0].tolist() == ids["fineweb_val_000000.bin"][8:16].tolist()


def test_a_bad_id_in_a_shard_names_the_shard(tmp_path):
    d = tmp_path / "shards"
    _shards(d, {"a.bin": 8 * 4 + 1, "b.bin": 8 * 4 + 1})
    _bad_id_file(d / "b.bin", at=19, n=8 * 4 + 1)
    ds = token_file(_cfg(d, vocab_size=512)).train
    ds.batch([0, 1, 2, 3])
    with pytest.raises(ConfigError, match=rf"file {d}/b.bin holds id 600 at token 19 \(byte 38\)"):
        ds.batch([1, 6])  # window 6 = b.bin's window 2: tokens 16..24


def test_shards_keep_few_descriptors_open(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "MAX_OPEN", 2)
    d = tmp_path / "many"
    _shards(d, {f"s{i:02d}.bin": 8 + 1 for i in range(6)})
    ds = token_file(_cfg(d, vocab_size=4096)).train
    for i in [0, 3, 5, 1, 4, 2, 0]:
        ds.batch([i])
        assert sum(f._fd is not None for f in ds.tokens) <= 2


def test_shards_none_long_enough(tmp_path):
    d = tmp_path / "short"
    _shards(d, {"a.bin": 5, "b.bin": 7})
    with pytest.raises(ConfigError) as e:
        token_file(_cfg(d, vocab_size=512))
    assert str(e.value) == (
        f"training token files: none of the 2 in {d} holds one sequence (the longest has 7 "
        "tokens, --seq-len 8 + 1 needed); use larger shards or a smaller --seq-len"
    )


def test_a_directory_without_token_files(tmp_path):
    with pytest.raises(ConfigError) as e:
        token_file(_cfg(tmp_path, vocab_size=512))
    assert str(e.value) == (
        f"--data-dir {tmp_path}: no token file (expected {tmp_path}/train.bin or *.bin shards)"
    )
