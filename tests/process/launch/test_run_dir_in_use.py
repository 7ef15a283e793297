"""A run dir held by any live job of the workspace is refused by every backend in one line
(issue 54 item 7): a user's own script running locally, then a second `ddpkit run` or a
`ddpkit submit slurm` of the same job: refused before anything starts or is queued (a fake
`sbatch` on PATH records any call). Before, only a SLURM job's run dir was checked, and a
local job and a SLURM job wrote the same checkpoints and goodput records at once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FakeBin

DDPKIT = Path(sys.executable).with_name("ddpkit")
pytestmark = pytest.mark.slow

SCRIPT = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for _ in range(100000):
    t = torch.ones(1); dist.all_reduce(t); time.sleep(0.05)
"""
JOB = 'name = "held"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'
SLURM_BINS = ("sbatch", "sinfo", "squeue", "scontrol", "sacct", "scancel", "srun")


def test_a_local_job_holds_its_run_dir_against_every_backend(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ddpkit.toml").write_text(JOB)
    calls = tmp_path / "slurm-calls"
    fakes = FakeBin(tmp_path / "bin")
    for name in SLURM_BINS:
        fakes.add(name, f'#!/bin/sh\necho "{name} $*" >> {calls}\necho 4242\n')
    env = {**os.environ, "PATH": f"{fakes.path}:{os.environ['PATH']}"}
    first = subprocess.Popen([str(DDPKIT), "run"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        goodput = tmp_path / "runs" / "held" / "goodput"
        while not list(goodput.glob("*-attempt.json")) and time.monotonic() < deadline:
            assert first.poll() is None
            time.sleep(0.5)
        for argv in (["run"], ["submit", "slurm", "--nodes", "2"]):
            r = subprocess.run([str(DDPKIT), *argv], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            lines = (r.stdout + r.stderr).strip().splitlines()
            assert r.returncode == 2, lines
            assert len(lines) == 1 and "Traceback" not in r.stderr, lines
            assert lines[0].startswith("error: run dir runs/held is in use by job "), lines
            assert "the local job submitted from here" in lines[0]
            job = re.search(r"in use by job (\d+) \(running\)", lines[0])
            assert job and f"ddpkit cancel local {job[1]}" in lines[0], lines
        assert not calls.exists() or "sbatch" not in calls.read_text()  # nothing queued
        assert first.poll() is None  # the first job trains on, untouched
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
