"""Steps or epochs: the command line can switch a job file's step count to epochs.

The tests of this file that start processes or take longer:
tests/process/train/loop/test_steps_epochs.py."""

from __future__ import annotations

from ddpkit.tools.jobspec import load_spec
from ddpkit.train.config import parse_config


def test_epochs_on_the_command_line_switch_a_files_steps_off(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[train]\nsteps = 300\n")
    cfg, _ = parse_config(["--config", str(job), "--epochs", "2"], installed=False)
    assert (cfg.steps, cfg.epochs) == (None, 2)
    cfg, _ = parse_config(["--config", str(job), "--steps", "0", "--epochs", "2"], installed=False)
    assert (cfg.steps, cfg.epochs) == (None, 2)  # --steps 0: no step count
    cfg, _ = parse_config(["--config", str(job)], installed=False)
    assert cfg.steps == 300


def test_the_launcher_passes_epochs_after_dashes_over_the_job_files_steps(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('name = "e"\n[train]\nsteps = 300\n')
    argv = load_spec(job, None, train_args=["--epochs", "1"]).train_argv()
    assert "--steps" not in argv and argv[-2:] == ["--epochs", "1"]
    assert "--steps" in load_spec(job, None).train_argv()
