"""Bad numbers and paths are one line, exit 2, nothing written;
under torchrun a config error is printed once (rank 0), not once per rank.

Here the tests that run in this process; those that start processes in
tests/process/train/test_reliability_input.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.trainrun import PY, ROOT, clean_env


def _one_line(p: subprocess.CompletedProcess, pattern: str) -> None:
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert re.search(pattern, lines[0]), lines[0]


def _train(*args: str, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "ddpkit.train", *args],
        cwd=cwd,
        env=env or clean_env(PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_empty_run_dir_would_write_into_the_current_directory(tmp_path):
    _one_line(_train("--run-dir", "", cwd=tmp_path), r"--run-dir is empty")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "flag,sub,pattern",
    [
        ("--ckpt-dir", "FILE", r"--ckpt-dir \S+/FILE is a file; pass a directory path"),
        ("--run-dir", "FILE", r"--run-dir \S+/FILE is a file; pass a directory path"),
        ("--run-dir", "FILE/sub", r"--run-dir \S+/FILE/sub is under \S+/FILE, a file"),
    ],
)
def test_paths_that_cannot_be_directories(flag, sub, pattern, tmp_path):
    (tmp_path / "FILE").write_text("x")
    args = ["--run-dir", str(tmp_path / "r")] if flag != "--run-dir" else []
    _one_line(_train(flag, str(tmp_path / sub), *args), pattern)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_a_run_dir_where_nothing_can_be_created(tmp_path):
    _one_line(
        _train("--run-dir", "/proc/x"), r"--run-dir /proc/x: cannot create directories in /proc"
    )
