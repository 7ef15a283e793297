"""What `ddpkit render|submit slurm` makes of a project path sbatch must take whole, from a
user's project in a temp dir with fake SLURM commands on PATH (the real cluster runs such a
project in tests/engines/slurm/test_slurm_paths.py): the `#SBATCH --chdir` of a path with a
space is quoted as sbatch reads it; a path SLURM cannot take as a log file name (`%`, `\\`)
is refused in one line before the queue; the "is SLURM up?" hint only when sbatch says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeBin

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
JOB = 'name = "p"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'


def project(tmp_path: Path, dirname: str, sbatch: str = "echo 4242") -> tuple[Path, dict, Path]:
    proj = tmp_path / dirname
    proj.mkdir()
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "ddpkit.toml").write_text(JOB)
    calls = tmp_path / "sbatch-calls"
    fakes = FakeBin(tmp_path / "bin")
    fakes.add("sbatch", f'#!/bin/sh\necho "$*" >> "{calls}"\n{sbatch}\n')
    for name in ("sinfo", "squeue", "scontrol", "sacct"):
        fakes.add(name, "#!/bin/sh\nexit 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}
    env["PATH"] = f"{fakes.path}:{env['PATH']}"
    return proj, env, calls


def ddpkit(proj: Path, env: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("dirname", "line"),
    [
        ("plain", "#SBATCH --chdir={proj}"),  # as the goldens have it: no quotes
        ("my proj é", '#SBATCH --chdir="{proj}"'),
        ('a#b "q"', '#SBATCH --chdir="{parent}/a\\#b \\"q\\""'),
    ],
)
def test_the_chdir_directive_is_quoted_only_when_sbatch_needs_it(tmp_path, dirname, line):
    proj, env, _ = project(tmp_path, dirname)
    r = ddpkit(proj, env, "render", "slurm", "--nodes", "2")
    assert r.returncode == 0, r.stderr
    assert line.format(proj=proj, parent=proj.parent) in r.stdout.splitlines(), r.stdout


@pytest.mark.parametrize("dirname", ["100% proj", "back\\slash"])
def test_a_path_slurm_reads_as_a_file_name_pattern_is_refused_before_the_queue(
    tmp_path, one_line_error, dirname
):
    proj, env, calls = project(tmp_path, dirname)
    line = one_line_error(ddpkit(proj, env, "submit", "slurm", "--nodes", "2"))
    assert "file-name patterns" in line and "slurm.log_dir" in line, line
    assert not calls.exists(), calls.read_text()


@pytest.mark.parametrize(
    ("said", "hint"),
    [
        ("sbatch: error: Invalid directive found in batch script: proj", False),
        (
            "sbatch: error: Batch job submission failed: Invalid account or account/partition "
            "combination specified",
            False,
        ),  # fmt: skip
        (
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
            "(connect failure)",
            True,
        ),  # fmt: skip
    ],
)
def test_the_slurm_up_hint_comes_only_when_sbatch_cannot_reach_slurm(tmp_path, said, hint):
    proj, env, _ = project(tmp_path, "plain", sbatch=f"echo '{said}' >&2\nexit 1")
    r = ddpkit(proj, env, "submit", "slurm", "--nodes", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"sbatch failed ({said})" in r.stderr, r.stderr
    assert ("is SLURM up? (make slurm-up)" in r.stderr) is hint, r.stderr
