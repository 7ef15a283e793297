"""A user model that breaks the model contract under real ranks is one line naming the
contract, the model and what was found, exit 2, no traceback: a model built differently on
rank 1 (DDP: a 50-line traceback; FSDP2: a gloo abort), and a parameter that forward never
uses under DDP (DDP's 77-line error at the second step). FSDP2 trains the latter as it is.
A hook that returns the wrong type is that one line too, without the warnings its code
raised on the way (a loss returning float(tensor): torch's 3-line UserWarning per rank)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainrun import clean_env

pytestmark = pytest.mark.slow

PKG = """
import os

import torch
from torch import nn


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def wider_on_rank_1(cfg):
    width = 48 if rank() == 1 else 32
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 10))


def extra_on_rank_1(cfg):
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    if rank() == 1:
        model.register_parameter("bias2", nn.Parameter(torch.zeros(10)))
    return model


class Unused(nn.Module):
    def __init__(self, frozen: bool):
        super().__init__()
        self.body = nn.Linear(784, 10)
        self.head = nn.Linear(10, 10)  # never called in forward
        self.head.requires_grad_(not frozen)

    def forward(self, x):
        return self.body(x.flatten(1))


def unused(cfg):
    return Unused(frozen=False)


def unused_but_frozen(cfg):
    return Unused(frozen=True)


def warns_and_returns_a_dict(cfg):
    import warnings

    warnings.warn("building a dict of tensors")
    return {"weight": torch.zeros(10, 784)}
"""

CONTRACT = "expected a factory (cfg, **model_args) -> torch.nn.Module"


def _node(
    tmp_path: Path, model: str, parallel: str, *more: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "contracts.py").write_text(PKG)
    cmd = [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
           "--", "-m", "ddpkit.train", "--model", model, "--parallel", parallel,
           "--steps", "3", "--eval-steps", "1", "--timeout-s", "30", "--progress", "plain",
           "--run-dir", str(tmp_path / "r"), *more]  # fmt: skip
    env = clean_env(PYTHONPATH=str(tmp_path))
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


SHAPES = [
    ("wider_on_rank_1", "parameter 1.weight is [32, 784] float32 on rank 0, [48, 784] float32 on rank 1"),
    ("extra_on_rank_1", "rank 1 has a parameter bias2 [10] that rank 0 lacks"),
]  # fmt: skip


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("model,found", SHAPES, ids=[m for m, _ in SHAPES])
def test_a_model_built_differently_on_rank_1_is_one_line(
    model, found, parallel, tmp_path, one_line_error
):
    line = one_line_error(_node(tmp_path, f"contracts:{model}", parallel))
    assert line == (
        f"error: --model contracts:{model} built another model on rank 1 than on rank 0: "
        f"{found}; {CONTRACT} that builds the same parameter names, shapes and dtypes on "
        "every rank (from cfg and its model_args, not from the rank)"
    )
    assert not list((tmp_path / "r").glob("checkpoints/step-*"))


def test_a_parameter_forward_never_uses_is_one_line_under_ddp(tmp_path, one_line_error):
    line = one_line_error(_node(tmp_path, "contracts:unused", "ddp"))
    assert line == (
        "error: --model contracts:unused: 2 parameters (head.weight, head.bias) took no part "
        "in the first forward; under --parallel ddp every parameter that requires grad must "
        "get a gradient every step: use it in forward, freeze it (requires_grad_(False)) or "
        "drop it, or train with --parallel fsdp"
    )
    assert not list((tmp_path / "r").glob("checkpoints/step-*"))


@pytest.mark.parametrize(
    "model,parallel", [("unused", "fsdp"), ("unused_but_frozen", "ddp")], ids=["fsdp", "frozen"]
)
def test_an_unused_parameter_trains_where_it_breaks_nothing(model, parallel, tmp_path):
    p = _node(tmp_path, f"contracts:{model}", parallel)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "r" / "summary.json").is_file()


# A loss returning a float is the campaign's own case: test_a_float_loss_through_ddpkit_run_is
# _the_one_line runs it as the campaign did (its exit 2, the line, no warning, no checkpoint).
WRONG_RETURNS = {
    "model": (
        ("contracts:warns_and_returns_a_dict",),
        "error: --model contracts:warns_and_returns_a_dict returned a dict; expected a factory "
        "(cfg, **model_args) -> torch.nn.Module",
    ),
}


@pytest.mark.parametrize("hook", list(WRONG_RETURNS))
def test_a_hook_returning_the_wrong_type_is_one_line_without_its_warnings(
    hook, tmp_path, one_line_error
):
    """A model factory that warns before returning a dict: the one line, not the warning
    (the campaign's loss returning a Python float printed torch's warning on each rank around
    the one line: test_a_float_loss_through_ddpkit_run_is_the_one_line)."""
    (model, *more), expected = WRONG_RETURNS[hook]
    assert one_line_error(_node(tmp_path, model, "ddp", *more)) == expected
    assert not list((tmp_path / "r").glob("checkpoints/step-*"))


DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
LOSS_JOB = """\
name = "lossy"
nproc_per_node = 2
accelerator = "cpu"
[train]
loss = "losses:float_loss"
steps = 3
eval = false
"""
LOSSES_PY = """\
import torch.nn.functional as F


def float_loss(output, target):
    return float(F.cross_entropy(output, target))
"""


def test_a_float_loss_through_ddpkit_run_is_the_one_line(tmp_path):
    """As the campaign ran it: a project of its own with a losses.py beside its job file,
    `ddpkit run` at 2 ranks. Exit 2, the contract's line once, no warning, no traceback."""
    (tmp_path / "ddpkit.toml").write_text(LOSS_JOB)
    (tmp_path / "losses.py").write_text(LOSSES_PY)
    p = subprocess.run(
        [str(DDPKIT), "run"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    lines = (p.stdout + p.stderr).splitlines()
    assert p.returncode == 2, lines
    assert [line for line in lines if not line.startswith("world: ")] == [
        "error: --loss losses:float_loss returned a float; expected a function (output, "
        "target) -> scalar tensor"
    ]
    assert "Traceback" not in p.stdout + p.stderr
    assert (tmp_path / "runs/lossy").is_dir()  # the run dir the glob below looks in
    assert not list((tmp_path / "runs/lossy").glob("checkpoints/step-*"))
