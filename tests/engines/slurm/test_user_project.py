"""ddpkit as users run it: a project of their own in a temporary directory OUTSIDE the kit,
with its own train.py, a tools/ package, a utils.py its script imports and a model package,
driven by the installed `ddpkit` command from that directory.

Here the tests on a real SLURM cluster; the others, and the helpers both use, are in
tests/process/launch/test_user_project.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.process.launch.test_user_project import SCRIPT_JOB, TRAIN_PY, ddpkit, make_project
from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)


@pytest.mark.slurm
@pytest.mark.slow
def test_the_users_own_train_py_runs_on_two_slurm_nodes_from_its_project(
    slurm_cluster,  # noqa: F811
    tmp_path,
):
    """From the project's directory, on the real 2-node cluster: the unchanged script at
    world size 4, the nodes' Python found without slurm.venv (the one that submitted)."""
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").write_text(SCRIPT_JOB + 'time = "00:10:00"\n')
    r = ddpkit("submit", "slurm", "--nodes", "2", "--gpus", "2", "--wait", cwd=proj)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((proj / "runs/user/result.json").read_text()) == {"world_size": 4}
    assert (proj / ".ddpkit/jobs/slurm/last_job.json").is_file()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_syntax_error_is_refused_by_submit_slurm_and_nothing_is_queued(
    slurm_cluster,  # noqa: F811
    tmp_path,
    one_line_error,
):
    proj = make_project(tmp_path / "proj")
    (proj / "train.py").write_text(TRAIN_PY + "if True\n    pass\n")
    name = f"syntax-{os.getpid()}"
    line = one_line_error(ddpkit("submit", "slurm", "--set", f"name={name}", cwd=proj))
    assert line.startswith(f"error: train.py:{TRAIN_PY.count(chr(10)) + 1}: SyntaxError"), line
    queued = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True, timeout=60
    )  # this cluster keeps no accounting (sacct); no job record and no log dir either
    assert queued.returncode == 0 and queued.stdout.strip() == "", queued.stdout
    assert not (proj / ".ddpkit").exists() and not (proj / "runs").exists()
