"""`ddpkit memory` in a user's own project whose job runs its own script: the planner says it
cannot see the script's model instead of planning the kit's MLP, plans the user's factory when
--model names it (a factory of its own keywords, given with --model-args), and times a step of
a 4-class model with targets from the model's output. The installed `ddpkit`, run from the
project directory, as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DDPKIT = str(Path(sys.executable).with_name("ddpkit"))

MODELS = """\
import torch.nn as nn


def build(hidden=64, classes=4):
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def with_cfg(cfg, classes=4):  # the trainer's contract: factory(cfg, **model_args)
    return build(classes=classes)
"""

TRAIN = """\
import torch
import torch.distributed as dist

from models import build


def main():
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(build())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def ddpkit(proj: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [DDPKIT, *args], cwd=proj, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def proj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project with a model package of its own and a plain DDP script, `ddpkit init`ed."""
    root = tmp_path_factory.mktemp("proj")
    (root / "models.py").write_text(MODELS)
    (root / "train.py").write_text(TRAIN)
    init = ddpkit(root, "init")
    assert init.returncode == 0, init.stderr
    assert 'script = "train.py"' in (root / "ddpkit.toml").read_text()
    return root


def params_of(proj: Path, **kwargs: int) -> int:
    """The user's model's parameter count, from the model itself."""
    spec = importlib.util.spec_from_file_location("user_models", proj / "models.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return sum(p.numel() for p in mod.build(**kwargs).parameters())


def test_a_script_job_is_not_planned_as_the_kits_mlp(proj, one_line_error):
    r = ddpkit(proj, "memory", "--config", "ddpkit.toml", "--dry-run")
    line = one_line_error(r)
    assert r.stdout == ""  # no plan of another model
    assert "script train.py" in line and "cannot see the model" in line
    assert "--model pkg.module:factory" in line and "--model-args" in line


def test_the_users_factory_is_planned_with_its_own_keywords(proj, one_line_error):
    dry = ddpkit(proj, "memory", "--config", "ddpkit.toml", "--model", "models:build",
                 "--dry-run", "--json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["params"] == params_of(proj)
    small = ddpkit(proj, "memory", "--config", "ddpkit.toml", "--model", "models:build",
                   "--model-args", '{"hidden": 16}', "--gpus", "4", "--json")  # fmt: skip
    assert small.returncode == 0, small.stderr
    assert json.loads(small.stdout)["num_params"] == params_of(proj, hidden=16)
    bad = one_line_error(
        ddpkit(proj, "memory", "--model", "models:build", "--model-args", '{"width": 3}')
    )
    assert "models:build(hidden=64, classes=4)" in bad and "'width'" in bad


@pytest.mark.parametrize(
    "model",
    [["--config", "ddpkit.toml", "--model", "models:build"], ["--model", "models:with_cfg"]],
    ids=["script-job", "kit-contract"],
)
def test_step_time_of_a_4_class_model(proj, model):
    """The step is timed with targets below the model's 4 outputs, not the synthetic data's
    10 classes (which failed the loss: `Target 4 is out of bounds`)."""
    r = ddpkit(proj, "memory", *model, "--gpus", "8", "--nodes", "2", "--step-time", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["params"] == params_of(proj)
    assert {s["strategy"] for s in out["strategies"]} == {
        "DDP", "SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD",
    }  # fmt: skip
    assert "measured here" in out["compute"]["source"]
