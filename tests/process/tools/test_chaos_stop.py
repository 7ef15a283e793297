"""A drill stopped by hand takes its job with it (issue 54 item 4): SIGTERM to `ddpkit chaos`
(a scheduler's, a `kill`) ends the job it started and every process under it; none is left
training into the run dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddpkit.tools.chaos import workers

DDPKIT = Path(sys.executable).with_name("ddpkit")
pytestmark = pytest.mark.slow

SCRIPT = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for _ in range(100000):
    t = torch.ones(1); dist.all_reduce(t); time.sleep(0.05)
"""
JOB = 'name = "mine"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'


def test_sigterm_to_the_drill_ends_its_job_and_every_process_under_it(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ddpkit.toml").write_text(JOB)
    run = tmp_path / "runs" / "mine"
    drill = subprocess.Popen(
        [str(DDPKIT), "chaos", "--inject", "kill-rank@time=3000:rank=1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(workers(run)) < 2 and time.monotonic() < deadline:
            assert drill.poll() is None, drill.communicate()[0]
            time.sleep(0.5)
        assert len(workers(run)) == 2
        drill.send_signal(signal.SIGTERM)
        out, _ = drill.communicate(timeout=150)
    finally:
        if drill.poll() is None:
            drill.kill()
    assert "chaos: stopped; ending the drill's job" in out, out
    deadline = time.monotonic() + 30
    while workers(run) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert workers(run) == [], out
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ours(p, tmp_path)]
    assert left == [], left  # no node launcher, no `ddpkit submit` left in the project


def _ours(proc: Path, project: Path) -> bool:
    """A ddpkit process (the node launcher, `ddpkit submit`) working in `project`."""
    try:
        return (
            os.readlink(proc / "cwd") == str(project)
            and b"ddpkit" in (proc / "cmdline").read_bytes()
        )
    except OSError:
        return False
