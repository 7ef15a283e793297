"""The save budget of a job whose entry point is the user's own script: the kit knows only its
own checkpoint layout, so the line says what it can measure (the files the script left in
$DDPKIT_CKPT_DIR, and their size) and what it cannot (the script's own save time), instead of
"no checkpoint in runs/<name>/checkpoints yet" beside the snapshot the script saved there.
A user project in a temp dir, driven by the installed `ddpkit` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.trainrun import clean_env

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
SCRIPT = """\
import os

import torch

# The PyTorch fault-tolerance tutorial's snapshot, kept where the job's checkpoints go.
ckpt_dir = os.environ["DDPKIT_CKPT_DIR"]
os.makedirs(ckpt_dir, exist_ok=True)
model = torch.nn.Linear(64, 64)
torch.save({"model": model.state_dict(), "epoch": 1}, os.path.join(ckpt_dir, "snapshot.pt"))
"""
JOB = """\
name = "mine"
script = "train.py"
nproc_per_node = 1
accelerator = "cpu"
"""


def _plan(project: Path) -> str:
    """`ddpkit run --plan`: the save budget's lines (before the run), then the run."""
    got = subprocess.run(
        [str(DDPKIT), "run", "--plan"], cwd=project, env=clean_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    return got.stdout + got.stderr


def test_the_save_budget_of_a_script_names_its_files_and_what_it_cannot_time(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT)
    (project / "ddpkit.toml").write_text(JOB)

    [before] = [x for x in _plan(project).splitlines() if x.startswith("ddpkit: save budget")]
    assert before == (
        "ddpkit: save budget: checkpoint size unknown (your script saves its own checkpoints: "
        "none in runs/mine/checkpoints yet); the kit reads their size there once they are "
        "written, but cannot time your script's own save (set ckpt_write_gbps)"
    )

    snapshot = project / "runs" / "mine" / "checkpoints" / "snapshot.pt"
    assert snapshot.is_file()  # the first run's own save
    out = _plan(project)
    [after] = [x for x in out.splitlines() if x.startswith("ddpkit: save budget")]
    mb = f"{snapshot.stat().st_size / 1e6:.3g} MB"
    assert after.startswith(
        f"ddpkit: save budget: a {mb} checkpoint (your script's own snapshot.pt in "
        "runs/mine/checkpoints) at 1 GB/s (assumed: the kit cannot time your script's own "
        "save; set ckpt_write_gbps) takes ~"
    ), after
    assert "no checkpoint" not in out
    assert any(x.startswith("ddpkit: checkpoint interval: Young/Daly") for x in out.splitlines())
