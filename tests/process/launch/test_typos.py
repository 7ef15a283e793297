"""A typo on the command line or in a job file, as a user makes it in a project of their own:
the installed `ddpkit`, run from a temp dir. A flag is never taken by its prefix (argparse's
default took `--gpu` for `--gpus` and queued a real job): one line naming the flag and the
real one, exit 2, nothing queued (a fake `sbatch` on PATH records any call) or started. An
unknown key names the closest valid one first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FakeBin

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))
SCRIPT = "import torch.distributed as dist\nprint('ran', flush=True)\n"
KIT_JOB = 'name = "kit"\nnproc_per_node = 1\naccelerator = "cpu"\n[train]\nsteps = 2\n'
SLURM_BINS = ("sbatch", "sinfo", "squeue", "scontrol", "sacct", "scancel", "srun")


def project(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """(a project with train.py and its job file, the environment with fake SLURM commands
    first on PATH, the file those commands append their calls to)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "ddpkit.toml").write_text(
        'name = "proj"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'
    )
    (proj / "kit.toml").write_text(KIT_JOB)
    calls = tmp_path / "slurm-calls"
    fakes = FakeBin(tmp_path / "bin")
    for name in SLURM_BINS:  # sbatch "queues" job 4242; the others answer nothing
        fakes.add(name, f'#!/bin/sh\necho "{name} $*" >> {calls}\necho 4242\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPKIT_")}
    env["PATH"] = f"{fakes.path}:{env['PATH']}"
    return proj, env, calls


def ddpkit(proj: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=120
    )


ABBREVIATED = [
    # (argv, the flag as typed, the flag it abbreviates)
    (["submit", "slurm", "--nodes", "2", "--gpu", "2"], "--gpu", "--gpus"),
    (["submit", "slurm", "--node", "2", "--gpus", "2"], "--node", "--nodes"),
    (["submit", "slurm", "--nodes=2", "--wai"], "--wai", "--wait"),
    (["submit", "slurm", "--poll", "1"], "--poll", "--poll-s"),  # a backend's own flag
    (["render", "slurm", "--print"], "--print", "--print-spec"),
    (["logs", "slurm", "4242", "--follo"], "--follo", "--follow"),
    (["run", "--gpu", "1"], "--gpu", "--gpus"),
    (["run", "train.py", "--node=1"], "--node", "--nodes"),
    # the kit trainer's flags, after `--` and as `ddpkit train`
    (["submit", "slurm", "--config", "kit.toml", "--", "--step", "3"], "--step", "--steps"),
    (["run", "--config", "kit.toml", "--", "--epoch", "1"], "--epoch", "--epochs"),
    (["train", "--epoch", "1"], "--epoch", "--epochs"),
    # the node launcher: its own flags and torchrun's (`--nnode 2` waited for a second node)
    (["node", "--run", "runs/x", "--standalone", "--", "train.py"], "--run", "--run-dir"),
    (["node", "--nnode", "2", "--", "train.py"], "--nnode", "--nnodes"),
    (["node", "--standalone", "--nproc", "1", "--", "train.py"], "--nproc", "--nproc-per-node"),
    # the tools
    (["init", "--forc"], "--forc", "--force"),
    (["memory", "--dry"], "--dry", "--dry-run"),
    (["doctor", "--rdzv"], "--rdzv", "--rdzv-endpoint"),
    (["chaos", "--inject", "kill-rank@step=3", "--attac", "runs/x"], "--attac", "--attach"),
    (["commbench", "--op", "all_reduce"], "--op", "--ops"),
    (["plot", "runs", "--ou", "x.png"], "--ou", "--out"),
]


@pytest.mark.parametrize(
    ("argv", "given", "meant"), ABBREVIATED, ids=[" ".join(a[0]) for a in ABBREVIATED]
)
def test_an_abbreviated_flag_is_refused_naming_the_real_one_and_nothing_runs(
    tmp_path, one_line_error, argv, given, meant
):
    proj, env, calls = project(tmp_path)
    before = sorted(p.name for p in proj.iterdir())
    line = one_line_error(ddpkit(proj, env, *argv))
    assert f"unknown flag {given} " in line and f"did you mean {meant}?" in line, line
    assert not calls.exists(), f"SLURM was called: {calls.read_text()}"
    assert sorted(p.name for p in proj.iterdir()) == before  # no run dir, no record, no file


def test_an_unknown_flag_is_named_with_the_closest_real_one(tmp_path, one_line_error):
    proj, env, _ = project(tmp_path)
    line = one_line_error(ddpkit(proj, env, "train", "--lrr", "0.1"))
    assert "--lrr" in line and "did you mean --lr?" in line, line


def test_the_full_flags_still_submit(tmp_path):
    proj, env, calls = project(tmp_path)
    r = ddpkit(proj, env, "submit", "slurm", "--nodes", "2", "--gpus", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sbatch" in calls.read_text()


UNKNOWN_KEYS = [
    # (job file text or --set, the key as typed, the one meant, where)
    ("nproc_per_nod = 2\n", "nproc_per_nod", "nproc_per_node", "the top level"),
    ("--set nproc_per_nod=2", "nproc_per_nod", "nproc_per_node", "the top level"),
    ("[train]\nepoch = 2\n", "train.epoch", "epochs", "[train]"),
    ("--set train.lerning_rate=0.1", "lerning_rate", None, "[train]"),
    ("--set train.warmup_step=3", "warmup_step", "warmup_steps", "[train]"),
    ("[slurm]\npartitoin = 'gpu'\n", "slurm.partitoin", "partition", "[slurm]"),
    ("--set slurm.partitoin=gpu", "partitoin", "partition", "[slurm]"),
    ("[k8s]\nnamespase = 'x'\n", "k8s.namespase", "namespace", "[k8s]"),
]


@pytest.mark.parametrize(
    ("text", "key", "meant", "where"), UNKNOWN_KEYS, ids=[k[0].strip() for k in UNKNOWN_KEYS]
)
def test_an_unknown_key_names_the_closest_valid_key_first(
    tmp_path, one_line_error, text, key, meant, where
):
    proj, env, calls = project(tmp_path)
    if text.startswith("--set"):
        argv = ["render", "slurm", "--set", text.removeprefix("--set ")]
    else:
        (proj / "job.toml").write_text('name = "proj"\nscript = "train.py"\n' + text)
        argv = ["render", "slurm", "--config", "job.toml"]
    line = one_line_error(ddpkit(proj, env, *argv))
    assert f"unknown key '{key}'" in line, line
    hint = f"did you mean {meant}? valid keys in {where}: " if meant else f"valid keys in {where}: "
    assert f"'; {hint}" in line, line  # the closest first, then every valid key
    assert not calls.exists()


def test_the_trainers_own_config_file_names_the_closest_key(tmp_path, one_line_error):
    proj, env, _ = project(tmp_path)
    (proj / "train.toml").write_text("stpes = 3\n")
    line = one_line_error(ddpkit(proj, env, "train", "--config", "train.toml", "--print-config"))
    assert "unknown key 'stpes'; did you mean steps? valid keys: " in line, line
