"""Bad numbers and paths are one line, exit 2, nothing written;
under torchrun a config error is printed once (rank 0), not once per rank.

Here the tests that run in this process; those that start processes in
tests/process/train/test_reliability_input.py."""

from __future__ import annotations

import re
import subprocess

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
