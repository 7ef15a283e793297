"""ddpkit as users run it: a project of their own in a temporary directory OUTSIDE the kit,
with its own train.py, a tools/ package, a utils.py its script imports and a model package,
driven by the installed `ddpkit` command from that directory.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_user_project.py, those on a real SLURM cluster in
tests/engines/slurm/test_user_project.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install

TRAIN_PY = '''\
"""The user's own plain DDP script: it knows nothing of ddpkit."""
import argparse, json, os
import torch, torch.distributed as dist
from utils import seed_everything   # the project's own module, next to this script
from tools.helpers import out_path  # the project's own tools/ package

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()
dist.init_process_group("gloo")
seed_everything(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
if dist.get_rank() == 0:
    os.makedirs(os.path.dirname(out_path()), exist_ok=True)
    json.dump({"world_size": dist.get_world_size()}, open(out_path(), "w"))
dist.destroy_process_group()
'''
UTILS_PY = "import torch\n\ndef seed_everything(s):\n    torch.manual_seed(s)\n"
HELPERS_PY = 'def out_path():\n    return "runs/user/result.json"\n'
NET_PY = """\
import torch

def build(cfg, width=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 2))

def data(cfg):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = (x.sum(1) > 0).long()
    pairs = list(zip(x, y))
    return pairs[:448], pairs[448:]
"""
SCRIPT_JOB = 'name = "user"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\nargs = ["--steps", "5"]\n'
KIT_JOB = """\
name = "kit"
nproc_per_node = 2
accelerator = "cpu"
max_restarts = 1
[train]
model = "mymodels.net:build"
dataset = "mymodels.net:data"
parallel = "fsdp"
sharding = "FULL_SHARD"
batch_size = 16
steps = 12
ckpt_interval = 3
log_interval = 3
eval = false
"""


def make_project(root: Path) -> Path:
    (root / "tools").mkdir(parents=True)
    (root / "mymodels").mkdir()
    (root / "train.py").write_text(TRAIN_PY)
    (root / "utils.py").write_text(UTILS_PY)
    (root / "tools" / "__init__.py").write_text("")
    (root / "tools" / "helpers.py").write_text(HELPERS_PY)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "net.py").write_text(NET_PY)
    (root / "ddpkit.toml").write_text(SCRIPT_JOB)
    (root / "kit.toml").write_text(KIT_JOB)
    return root


def ddpkit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600):
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing set by hand
    return subprocess.run(
        [str(DDPKIT), *args], cwd=cwd, env={**base, **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_init_writes_a_job_file_that_runs_the_detected_script(tmp_path):
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").unlink()
    r = ddpkit("init", cwd=proj)
    assert r.returncode == 0, r.stderr
    text = (proj / "ddpkit.toml").read_text()
    assert 'script = "train.py"' in text and 'name = "proj"' in text
    spec = ddpkit("render", "local", "--print-spec", cwd=proj)
    assert spec.returncode == 0 and f'workspace = "{proj}"' in spec.stdout, spec.stderr
    again = ddpkit("init", cwd=proj)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert (proj / "ddpkit.toml").read_text() == text  # nothing overwritten


@pytest.mark.parametrize(
    ("argv", "fix"),
    [
        (["run", "--epochs", "2"], "ddpkit run -- --epochs 2"),
        (["run", "train.py", "--steps=3", "--nodes", "1"], "ddpkit run train.py --nodes 1 -- --steps=3"),
        (["submit", "slurm", "train.py", "--nodes", "2", "--steps", "3"], "ddpkit submit slurm train.py --nodes 2 -- --steps 3"),
    ],
)  # fmt: skip
def test_flags_for_the_script_before_dashdash_get_the_fix_in_one_line(
    tmp_path, one_line_error, argv, fix
):
    proj = make_project(tmp_path / "proj")
    line = one_line_error(ddpkit(*argv, cwd=proj))
    assert "unrecognized arguments" in line and line.endswith(f"after `--`: {fix}"), line
    assert not (proj / "runs").exists() and not (proj / ".ddpkit").exists()


def test_run_help_shows_the_script_and_its_flags_after_dashdash(tmp_path):
    r = ddpkit("run", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "[script] [-- ARGS ...]" in " ".join(r.stdout.split())
    assert "ddpkit run train.py -- --epochs 2" in " ".join(r.stdout.split())
    s = ddpkit("submit", "--help", cwd=tmp_path)
    assert s.returncode == 0 and "[-- ARGS ...]" in s.stdout, s.stdout


@pytest.mark.parametrize(
    ("value", "argv"),
    [
        ("--steps 3 --tag 'a b'", ["--steps", "3", "--tag", "a b"]),
        ('["--steps", "3 4"]', ["--steps", "3 4"]),
    ],
)
def test_set_args_is_split_as_a_shell_would(tmp_path, value, argv):
    proj = make_project(tmp_path / "proj")
    r = ddpkit("render", "local", "--set", f"args={value}", cwd=proj)
    assert r.returncode == 0, r.stderr
    words = shlex.split(r.stdout.strip().splitlines()[-1])
    assert words[words.index("train.py") + 1 :] == argv


def test_set_args_with_an_open_quote_is_one_line(tmp_path, one_line_error):
    line = one_line_error(ddpkit("render", "local", "--set", "args=--x 'a", cwd=tmp_path))
    assert "does not split into arguments" in line and "fix the quotes" in line, line


def test_a_positional_that_is_no_script_is_refused(tmp_path, one_line_error):
    line = one_line_error(ddpkit("run", "epochs", cwd=tmp_path))
    assert "'epochs' is not a Python script" in line and "ddpkit run train.py --" in line


@pytest.mark.parametrize("backend", ["slurm", "k8s", "docker"])
def test_render_a_script_without_a_job_file(tmp_path, backend):
    proj = make_project(tmp_path / "proj")
    (proj / "ddpkit.toml").unlink()
    (proj / "my_train.py").write_text(TRAIN_PY)
    nodes = "1" if backend == "docker" else "2"
    r = ddpkit("render", backend, "my_train.py", "--nodes", nodes, "--", "--steps", "3", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "my_train.py" in r.stdout and "runs/my-train" in r.stdout and "--steps" in r.stdout
    assert "ddpkit.train " not in r.stdout  # not the kit's demo trainer


@pytest.mark.parametrize("backend", ["local", "slurm", "k8s", "docker"])
def test_every_backend_gives_the_entry_point_the_ckpt_dir(tmp_path, backend):
    proj = make_project(tmp_path / "proj")
    r = ddpkit("render", backend, "--set", "ckpt_dir=runs/user/ckpt", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert "DDPKIT_CKPT_DIR" in r.stdout and "runs/user/ckpt" in r.stdout
