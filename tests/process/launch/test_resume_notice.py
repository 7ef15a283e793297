"""A job queued after a local smoke test of the same name says at submit what it will resume
from (issue 54 item 8): the kit's trainer's newest checkpoint (and that nothing is left to
train when it is at the last step), or what a user's script left in $DDPKIT_CKPT_DIR, with the
way to start fresh. Before, the SLURM job silently resumed and trained nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeBin

DDPKIT = Path(sys.executable).with_name("ddpkit")
pytestmark = pytest.mark.slow
SLURM_BINS = ("sbatch", "sinfo", "squeue", "scontrol", "sacct", "scancel", "srun")

KIT_JOB = """\
name = "smoke"
nproc_per_node = 1
accelerator = "cpu"
[train]
steps = 6
ckpt_interval = 3
eval = false
"""
SCRIPT = """\
import os, torch
path = os.path.join(os.environ["DDPKIT_CKPT_DIR"], "snapshot.pt")
os.makedirs(os.path.dirname(path), exist_ok=True)
torch.save({"epoch": 40}, path)
"""
SCRIPT_JOB = 'name = "mine"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'


def slurm_env(tmp_path: Path) -> tuple[dict, Path]:
    calls = tmp_path / "slurm-calls"
    fakes = FakeBin(tmp_path / "bin")
    for name in SLURM_BINS:
        fakes.add(name, f'#!/bin/sh\necho "{name} $*" >> {calls}\necho 4242\n')
    return {**os.environ, "PATH": f"{fakes.path}:{os.environ['PATH']}"}, calls


def ddpkit(proj: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(DDPKIT), *args], cwd=proj, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def test_the_kit_trainers_resume_is_said_at_submit(tmp_path):
    (tmp_path / "ddpkit.toml").write_text(KIT_JOB)
    env, calls = slurm_env(tmp_path)
    first = ddpkit(tmp_path, env, "submit", "slurm", "--nodes", "1")
    assert first.returncode == 0 and "resumes" not in first.stdout, first.stdout + first.stderr
    assert ddpkit(tmp_path, env, "run").returncode == 0  # the local smoke test
    r = ddpkit(tmp_path, env, "submit", "slurm", "--nodes", "1")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "resumes" in x)
    assert line.startswith("ddpkit: this job resumes at step 6 from runs/smoke/checkpoints/step-6,")
    assert "by run " in line and "nothing is left to train" in line
    assert "--set train.resume=never starts over" in line
    fresh = ddpkit(tmp_path, env, "submit", "slurm", "--nodes", "1", "--set", "train.resume=never")
    assert fresh.returncode == 0 and "resumes" not in fresh.stdout, fresh.stdout
    assert calls.read_text().count("sbatch") == 3  # said, and queued as asked


def test_a_scripts_own_snapshot_is_said_at_submit(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ddpkit.toml").write_text(SCRIPT_JOB)
    env, _ = slurm_env(tmp_path)
    assert ddpkit(tmp_path, env, "run").returncode == 0
    r = ddpkit(tmp_path, env, "submit", "slurm", "--nodes", "1")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "already holds" in x)
    assert line.startswith(
        "ddpkit: runs/mine/checkpoints ($DDPKIT_CKPT_DIR) already holds snapshot.pt, written "
    )
    assert "your script resumes from it if it loads it there" in line
