"""Steps or epochs: the command line can switch a job file's step count to epochs.

Here the tests that start processes or take longer; the in-process ones in
tests/unit/train/loop/test_steps_epochs.py."""

from __future__ import annotations


def test_mnist_without_download_and_without_its_data_is_refused_at_render(tmp_path):
    """render slurm (the nodes share this machine's files) refuses it in one line, before the
    queue and before six lines of torchvision download errors on every node."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "ddpkit", "render", "slurm", "--set", "train.dataset=mnist",
         "--set", "train.download=false", "--set", "train.data_dir=nodata"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--data-dir nodata does not exist and --no-download is set" in r.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "ddpkit", "render", "k8s", "--set", "train.dataset=mnist",
         "--set", "train.download=false", "--set", "train.data_dir=nodata"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr  # in a pod the data lives in the image or a volume
