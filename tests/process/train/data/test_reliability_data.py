"""Damaged MNIST and imagefolder data is one line naming the file, exit 2,
and every rank leaves quietly (no gloo traceback from the ranks that did not see it)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.trainrun import train

pytestmark = pytest.mark.slow


def _idx(arr: np.ndarray) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def _mnist(root: Path, n: int = 128, size: int = 28, labels=None, n_labels=None) -> Path:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    x = np.random.default_rng(0).integers(0, 255, (n, size, size))
    y = np.arange(n_labels or n) % 10 if labels is None else labels
    (raw / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(x)))
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(y)))
    return raw


def _gz(path: Path, data: bytes) -> None:
    path.write_bytes(gzip.compress(data))


IMG = "train-images-idx3-ubyte.gz"
LBL = "train-labels-idx1-ubyte.gz"
CASES = {
    "truncated header": (
        lambda raw: _gz(raw / IMG, gzip.decompress((raw / IMG).read_bytes())[:10]),
        rf"{IMG}: truncated IDX header \(10 bytes\)",
    ),
    "short data": (
        lambda raw: _gz(raw / IMG, gzip.decompress((raw / IMG).read_bytes())[:5000]),
        rf"{IMG}: the header promises 128 x 28 x 28 = 100352 bytes of data, the file holds 4984",
    ),
    "bad gzip": (
        lambda raw: (raw / LBL).write_bytes(b"\x1f\x8b\x08garbage"),
        rf"{LBL}: not a readable gzip file",
    ),
}


def _run(root: Path, tmp_path: Path, nproc: int = 0):
    args = ("--dataset", "mnist", "--data-dir", str(root), "--no-download", "--steps", "2")
    return train(tmp_path / "run", *args, "--batch-size", "16", nproc=nproc, check=False)


def _one_error(run, pattern: str) -> None:
    import re

    assert run.rc != 0, run.out
    tracebacks = run.out.count("Traceback (most recent call last)") - run.out.count(
        'torchrun", line'
    )
    assert tracebacks == 0, run.out[-3000:]
    [line] = [x for x in run.out.splitlines() if x.startswith("error: ")]
    assert re.search(pattern, line), line


@pytest.mark.parametrize("case", list(CASES))
def test_damaged_mnist_files(case, tmp_path):
    raw = _mnist(tmp_path / "data")
    damage, pattern = CASES[case]
    damage(raw)
    run = _run(tmp_path / "data", tmp_path)
    assert run.rc == 2
    _one_error(run, pattern)


def test_mnist_images_of_another_size(tmp_path):
    _mnist(tmp_path / "data", size=32)
    _one_error(_run(tmp_path / "data", tmp_path), r"images of 32 x 32, MNIST's are 28 x 28")


def test_mnist_labels_out_of_range(tmp_path):
    _mnist(tmp_path / "data", labels=np.full(128, 12))
    _one_error(_run(tmp_path / "data", tmp_path), r"label 12 >= 10 classes")


def test_mnist_count_mismatch_leaves_every_rank_quietly(tmp_path):
    _mnist(tmp_path / "data", n_labels=100)
    run = _run(tmp_path / "data", tmp_path, nproc=2)
    _one_error(run, r"holds 128 images, \S+ 100 labels")
    assert "exitcode  : 2" in run.out


def _png(path: Path, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)


@pytest.mark.parametrize("bad", ["not an image", "truncated png"])
def test_imagefolder_with_a_broken_file(bad, tmp_path):
    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(4):
            _png(root / c / f"{i}.png", i)
    broken = root / "a" / "2.png"
    if bad == "not an image":
        broken.write_text("hello")
    else:
        broken.write_bytes(broken.read_bytes()[:200])
    args = ("--dataset", "imagefolder", "--data-dir", str(root), "--epochs", "1")
    run = train(tmp_path / "run", *args, "--batch-size", "4", "--no-eval", check=False)
    assert run.rc == 2
    _one_error(run, rf"{broken}: not a readable image")
