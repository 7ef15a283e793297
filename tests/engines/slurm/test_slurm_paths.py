"""A project whose path has a space and a non-ASCII letter, on the real 2-node SLURM cluster
(the `slurm_cluster` fixture): `ddpkit submit slurm --wait` from `/tmp/.../my proj é/` runs
and finishes as it does locally (sbatch read `#SBATCH --chdir=/tmp/.../my proj é` as a
directive `proj` and refused the job). And sbatch's own refusal of a job, when SLURM is up,
is said in its words without the "is SLURM up?" hint, which named the wrong cause."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DDPKIT = str(Path(sys.executable).with_name("ddpkit"))

TRAIN_PY = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():g} in {os.getcwd()}")
dist.destroy_process_group()
"""


def project(tmp_path: Path) -> Path:
    proj = tmp_path / "my proj é"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN_PY)
    (proj / "ddpkit.toml").write_text(
        'name = "spaced"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'
        'time = "00:10:00"\n'
    )
    return proj


def ddpkit(proj: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_project_path_with_a_space_and_an_accent_runs_on_two_slurm_nodes(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
):
    proj = project(tmp_path)
    r = ddpkit(proj, "submit", "slurm", "--nodes", "2", "--wait")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Invalid directive" not in out and "is SLURM up" not in out, out
    for rank in (0, 1):  # both nodes ran in the project directory, and talked
        assert f"rank {rank} of 2 sum 3 in {proj}" in out, out


def test_sbatch_refusing_a_job_is_said_in_its_words_without_the_slurm_up_hint(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
):
    proj = project(tmp_path)
    r = ddpkit(
        proj,
        "submit",
        "slurm",
        "--nodes",
        "2",
        "--set",
        'slurm.extra_sbatch=["--begin=never-ever"]',
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sbatch failed (sbatch: error: " in r.stderr, r.stderr
    assert "is SLURM up" not in r.stderr, r.stderr
