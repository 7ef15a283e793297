"""Token files: windows read per batch (never a full int64 copy), bad files as one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from ddpkit.train.config import ConfigError, TrainConfig
from ddpkit.train.data import TokenChunks, TokenFile, token_file

from tests.trainrun import ROOT, clean_env


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


@pytest.mark.parametrize(
    "case,message",
    [
        ("empty", "training token file {d}/train.bin is empty; write token ids into it"),
        (
            "odd",
            "training token file {d}/train.bin has 2001 bytes, not a multiple of 2 (uint16 ids "
            "for --vocab-size 512): truncated, or written with another id width",
        ),
        (
            "empty-val",
            "held-out token file {d}/val.bin is empty; write token ids into it or remove it "
            "(no held-out eval)",
        ),
    ],
)
def test_bad_token_files_are_one_line_and_exit_2(tmp_path, case, message):
    d = tmp_path / "data"
    d.mkdir()
    good = np.arange(1000, dtype=np.uint16) % 512
    if case == "empty":
        (d / "train.bin").write_bytes(b"")
    elif case == "odd":
        (d / "train.bin").write_bytes(good.tobytes() + b"\x01")
    else:
        good.tofile(d / "train.bin")
        (d / "val.bin").write_bytes(b"")
    with pytest.raises(ConfigError) as e:  # the same check, in process
        token_file(_cfg(d, vocab_size=512))
    assert str(e.value) == message.format(d=d)
    p = subprocess.run(  # and what the user sees
        [sys.executable, "-m", "ddpkit.train", "--model", "gpt", "--dataset", "tokens"]
        + ["--data-dir", str(d), "--seq-len", "8", "--run-dir", str(tmp_path / "r")],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == ["error: " + message.format(d=d)]
    assert "Traceback" not in p.stderr


def _trace(d) -> list[tuple[int, list[int]]]:
    out = []
    for f in sorted(d.glob("rank*.txt")):
        for line in f.read_text().splitlines():
            ep, *idx = map(int, line.split())
            out.append((int(f.stem[4:]), ep, idx))
    return out


@pytest.mark.slow
def test_worker_processes_resume_exactly_once(tmp_path):
    """--num-workers 2 prefetches ahead; a stop and resume still trains every sample once,
    in the order (and to the bits) of an uninterrupted run without workers."""
    from tests.trainrun import train

    data = tmp_path / "data"
    data.mkdir()
    (np.random.default_rng(0).integers(0, 64, 16 * 400 + 1).astype(np.uint16)).tofile(
        data / "train.bin"
    )
    args = ["--model", "gpt", "--dataset", "tokens", "--data-dir", str(data), "--seq-len", "16"]
    args += ["--vocab-size", "64", "--n-layer", "1", "--n-head", "2", "--d-model", "32"]
    args += ["--batch-size", "4", "--no-eval", "--log-interval", "4"]
    ta, tb = tmp_path / "ta", tmp_path / "tb"
    ta.mkdir()
    tb.mkdir()
    env_a = {"DDPKIT_TRACE_SAMPLES": str(ta)}
    train(tmp_path / "w", *args, "--num-workers", "2", "--steps", "5", nproc=2, env=env_a)
    w = train(tmp_path / "w", *args, "--num-workers", "2", "--steps", "12", nproc=2, env=env_a)
    assert "resumed from" in w.out and "at step 5" in w.out
    ref = train(
        tmp_path / "ref", *args, "--steps", "12", nproc=2, env={"DDPKIT_TRACE_SAMPLES": str(tb)}
    )
    resumed, straight = _trace(ta), _trace(tb)
    seen = [i for _, ep, idx in resumed for i in idx]
    assert len(seen) == len(set(seen)) == 12 * 2 * 4  # nothing twice, nothing skipped
    assert sorted(resumed) == sorted(straight)  # the same samples on the same ranks
    assert w.summary["param_digest"] == ref.summary["param_digest"]
