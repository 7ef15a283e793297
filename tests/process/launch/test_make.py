"""Make variables reach the launcher as data, never as shell, through real `make`.

`-o .venv/.installed`: never let a test reinstall the shared virtualenv.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.trainrun import ROOT, clean_env


def make(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "-o", str(ROOT / ".venv/.installed"), *args],
        cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def job(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(
        f'name = "make-test"\nimage = "nvcr.io/org/mine:2"\n{body}\n'
        f'[train]\nsteps = 3\nrun_dir = "{tmp_path / "run"}"\n'
        '[slurm]\ncontainer = "pyxis"\n'
    )
    return path


@pytest.mark.parametrize(
    "var",
    # ($$ is make's escape for one $: the recipe would see "$(touch ...)")
    ["PARTITION=gpu;touch {p};echo", "NODES=1;touch {p}", "ARGS=--lr 0.1 $$(touch {p})",
     "ARGS=--lr 0.1;touch {p}", "CONFIG=x.toml;touch {p}", "JOB=1;touch {p}"],
)  # fmt: skip
def test_hostile_make_variables_stay_values(tmp_path: Path, var: str) -> None:
    pwned = tmp_path / "PWNED"
    target = "slurm-status" if var.startswith("JOB") else "slurm-render"
    config = [] if var.startswith("CONFIG") else [f"CONFIG={job(tmp_path)}"]
    p = make(target, var.format(p=pwned), *config)
    assert not pwned.exists()
    assert p.returncode != 0  # each one is refused with one line...
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1, p.stderr  # ...by the launcher (make adds its own "Error 2" line)


def test_job_file_image_is_kept_and_args_reach_the_trainer(tmp_path: Path) -> None:
    p = make("slurm-render", f"CONFIG={job(tmp_path)}", "ARGS=--lr 0.5 --seed 7")
    assert p.returncode == 0, p.stderr
    assert "DDPKIT_IMAGE='nvcr.io#org/mine:2'" in p.stdout  # not overridden by a Make default
    assert "--lr 0.5 --seed 7" in p.stdout
    bad = make("slurm-render", f"CONFIG={job(tmp_path)}", "ARGS=--lr -1")
    assert bad.returncode == 2 and "error: --lr must be > 0, got -1.0" in bad.stderr
    image = make("slurm-render", f"CONFIG={job(tmp_path)}", "IMAGE=reg.io/x:1")
    assert "DDPKIT_IMAGE='reg.io#x:1'" in image.stdout


@pytest.mark.slow
def test_make_train_runs_through_the_node_launcher_named_by_the_job(tmp_path: Path) -> None:
    cfg = tmp_path / "other-file-name.toml"
    cfg.write_text(
        'name = "make-train"\n[train]\nsteps = 4\nlog_interval = 2\nckpt_interval = 0\n'
        f'run_dir = "{tmp_path / "runs" / "make-train"}"\n'
    )
    p = make("train", f"CONFIG={cfg}", "NPROC=2", "ARGS=--batch-size 16", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "runs" / "make-train" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 4
    assert f"outputs: {tmp_path / 'runs' / 'make-train'}" in p.stdout


@pytest.mark.slow
def test_a_run_dir_in_args_takes_every_output_with_it(tmp_path: Path) -> None:
    """make train ARGS='--run-dir runs/t2 ...': the node log, the outputs line and the plots
    follow the trainer into runs/t2 (of the workspace, the job file's directory)."""
    cfg = tmp_path / "job.toml"
    cfg.write_text('name = "split"\n[train]\nsteps = 4\nlog_interval = 2\nckpt_interval = 0\n')
    # one process: where the outputs go does not depend on the count (NPROC=2 is the test above)
    p = make("train", f"CONFIG={cfg}", "NPROC=1", "ARGS=--run-dir runs/t2 --steps 3", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    t2 = tmp_path / "runs" / "t2"
    assert json.loads((t2 / "summary.json").read_text())["steps"] == 3
    assert (t2 / "local" / "node-0.log").is_file() and not (tmp_path / "runs" / "split").exists()
    assert f"outputs: {t2}" in p.stdout


@pytest.mark.parametrize("target", ["slurm-up", "k8s-up"])
def test_cluster_targets_run_their_script_without_installing_the_venv(target: str) -> None:
    """`make -C <kit> slurm-up` runs a shell script: it must not first install every dev extra.
    `-n -W pyproject.toml`: print what make would run were the venv's stamp out of date."""
    p = subprocess.run(
        ["make", "-n", "--no-print-directory", "-W", str(ROOT / "pyproject.toml"), target],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "pip install" not in p.stdout and "-m venv" not in p.stdout, p.stdout
    assert "/local/up.sh" in p.stdout  # the script itself still runs
    ctl = subprocess.run(
        ["make", "-n", "--no-print-directory", "-W", str(ROOT / "pyproject.toml"), "slurm-render"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "pip install" in ctl.stdout  # the check can see an install where one is due
