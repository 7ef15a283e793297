"""Token files: windows read per batch (never a full int64 copy, never a start-up scan), a
directory of shards as one dataset, bad files and bad ids as one line.

Here the tests that start processes; the in-process ones in
tests/unit/train/data/test_tokens_data.py. Helpers both use are in
tests/unit/train/data/test_tokens_data.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from ddpkit.train.config import ConfigError
from ddpkit.train.data import (
    token_file,
)

from tests.trainrun import ROOT, clean_env
from tests.unit.train.data.test_tokens_data import _bad_id_file, _cfg


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


def test_a_bad_id_met_in_training_is_one_line_and_exit_2(tmp_path):
    _bad_id_file(tmp_path / "train.bin", at=40, n=8 * 10 + 1)  # window 4's last target, 5's first
    p = subprocess.run(  # one batch of all 10 windows: the step reads the bad id
        [sys.executable, "-m", "ddpkit.train", "--model", "gpt", "--dataset", "tokens"]
        + ["--data-dir", str(tmp_path), "--seq-len", "8", "--vocab-size", "512"]
        + ["--batch-size", "10", "--steps", "1", "--no-eval", "--run-dir", str(tmp_path / "r")],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"error: training token file {tmp_path}/train.bin holds id 600 at token 40 (byte 80) "
        ">= --vocab-size 512; raise --vocab-size, or rewrite the file with ids below it"
    ]


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
