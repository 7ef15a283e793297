"""fault_tolerance = "torchft" on the local backend, driven from a user's project through the
installed `ddpkit` command: the lighthouse and two replica groups of real torchrun processes
(gloo, CPU); one group's torchrun is SIGKILLed mid-run while the other trains on.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_torchft.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.torchft_goodput import NET_PY

DDPKIT = Path(sys.executable).with_name("ddpkit")
QUORUM_TIMEOUT_S = 20  # the survivors' bound (torchft's TORCHFT_QUORUM_TIMEOUT_SEC)

# A user's model whose forward takes at least 50 ms (a stand-in for real compute): the run
# then lasts long enough, whatever the machine's speed, for the killed group to come back.
# The same as bench.torchft_goodput's.
JOB = f"""\
name = "ft"
nproc_per_node = 1  # 2 x 1: the shared 2-core machine (load ~20) starts 2 x 2 too slowly to rejoin in 30 s
accelerator = "cpu"
fault_tolerance = "torchft"
replica_groups = 2
[env]
TORCHFT_QUORUM_TIMEOUT_SEC = "{QUORUM_TIMEOUT_S}"
[train]
model = "mymodels.net:build"
dataset = "mymodels.net:data"
batch_size = 8
steps = 600
log_interval = 1
ckpt_interval = 100
eval = false
"""


def project(root: Path) -> Path:
    (root / "mymodels").mkdir(parents=True)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "net.py").write_text(NET_PY)
    (root / "ddpkit.toml").write_text(JOB)
    return root


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.parametrize(
    "sets, says",
    [
        (["replica_groups=1"], "needs 2 or more"),
        (["replica_groups=3", "fault_tolerance=none"], 'is for fault_tolerance = "torchft"'),
    ],
)
def test_a_combination_torchft_cannot_run_is_one_line_at_render(tmp_path, sets, says):
    project(tmp_path)
    args = [a for s in sets for a in ("--set", s)]
    r = subprocess.run(
        [str(DDPKIT), "render", "local", *args], cwd=tmp_path, env=env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr


def test_docker_renders_the_lighthouse_and_groups_inside_the_container(tmp_path):
    project(tmp_path)
    r = subprocess.run(
        [str(DDPKIT), "render", "docker"], cwd=tmp_path, env=env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    after_image = r.stdout.split("ddpkit:latest ", 1)[1]
    assert after_image.startswith("python -m ddpkit.train.replica_groups --groups 2 ")
    assert "-- python -m ddpkit.train.node " in after_image
    assert "--standalone --nproc-per-node=1" in after_image


@pytest.mark.parametrize(
    "backend, sets, says",
    [
        ("k8s", ["k8s.api=trainjob"], "not a TrainJob"),
        ("k8s", ["--nodes", "4", "replica_groups=2"], "2 groups on 4 pods"),
        ("slurm", ["--nodes", "4", "replica_groups=2"], "2 groups on 4 nodes"),
    ],
)
def test_a_backend_refuses_what_it_cannot_run_in_one_line(tmp_path, backend, sets, says):
    project(tmp_path)
    args = [a for s in sets for a in ((s,) if s.startswith("-") or s.isdigit() else ("--set", s))]
    r = subprocess.run(
        [str(DDPKIT), "render", backend, *args], cwd=tmp_path, env=env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
