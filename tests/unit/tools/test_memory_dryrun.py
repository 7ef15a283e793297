"""The planner's dry run: the real model parallelized at the job's world size over torch's fake
process group, its measured state per rank against the ZeRO table, and what it refuses.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_memory_dryrun.py."""

from __future__ import annotations

import dataclasses
from argparse import Namespace

import pytest
import torch
from ddpkit.tools.planner.dryrun import dry_run
from ddpkit.tools.planner.model import load_cfg
from torch import nn

from tests.trainrun import memory_here, run_module


def gpt_cfg(path: str = "configs/gpt.toml"):
    cfg = load_cfg(Namespace(config=path, model=None))
    return dataclasses.replace(cfg, synthetic_samples=1 << 20)  # data for a 4096-rank batch


class _Scaled(nn.Module):
    """A linear classifier scaled by a learned 0-dim temperature (used in forward, as DDP
    needs every trainable parameter to be)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))  # synthetic 1x28x28
        self.temperature = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.temperature


def scalar_model(cfg) -> nn.Module:
    """A user model with a 0-dim parameter: fully_shard refuses it."""
    return _Scaled()


def test_a_layer_fsdp_cannot_shard_is_refused():
    from ddpkit.tools.planner.model import PlanError

    cfg = load_cfg(Namespace(config=None, model="tests.unit.tools.test_memory_dryrun:scalar_model"))
    with pytest.raises(PlanError, match="scalar parameters"):
        dry_run(cfg, 8, 1, "FULL_SHARD")
    assert dry_run(cfg, 8, 1, "DDP").params == 28 * 28 * 10 + 10 + 1  # DDP replicates it as it is


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpus", "8", "--strategy", "HYBRID_SHARD", "--replicate-degree", "3"], "8 % 3 = 2"),
        (["--gpus", "12", "--nodes", "5"], "not a multiple of --nodes 5"),
    ],
)
def test_cli_refuses_what_fails_on_the_cluster(args, needle, one_line_error, capsys):
    proc = memory_here(capsys, "--config", "configs/gpt.toml", "--dry-run", *args)
    assert needle in one_line_error(proc)


def test_cli_refuses_a_scalar_parameter(one_line_error, capsys):
    model = "tests.unit.tools.test_memory_dryrun:scalar_model"
    proc = memory_here(capsys, "--model", model, "--gpus", "8", "--dry-run")
    assert "FULL_SHARD cannot shard" not in proc.stderr  # its own strategy: DDP (the default)
    assert proc.returncode == 0, proc.stderr
    proc = memory_here(
        capsys, "--model", model, "--gpus", "8", "--strategy", "FULL_SHARD", "--dry-run"
    )
    assert "FULL_SHARD cannot shard this model on 8 ranks" in one_line_error(proc)


def test_cli_dry_run_needs_a_model(one_line_error):
    """Through the planner's own process: exit 2, one line, no traceback (the tests above run
    its main() in this process)."""
    proc = run_module("ddpkit.tools.planner", "--params", "7B", "--gpus", "8", "--dry-run")
    assert "--dry-run builds the model" in one_line_error(proc)


def test_plan_for_spec_refuses_in_one_line_what_the_cluster_would_refuse():
    """What `submit --plan` asks: None for a job that plans (and for a user's own script, whose
    model the planner cannot see), one line for one the nodes would refuse after the queue."""
    from ddpkit.tools.jobspec import JobSpec
    from ddpkit.tools.planner.dryrun import plan_for_spec

    assert plan_for_spec(JobSpec(nodes=2, nproc_per_node=4, train={"model": "mlp"})) is None
    assert plan_for_spec(JobSpec(nodes=1, nproc_per_node=4, script="x.py")) is None
    hsdp = {"model": "gpt", "parallel": "fsdp", "sharding": "HYBRID_SHARD", "replicate_degree": 3}
    line = plan_for_spec(JobSpec(nodes=2, nproc_per_node=4, train=hsdp))
    assert line and "replicate degree 3 does not divide world size 8" in line
    small = {"model": "mlp", "synthetic_samples": 100, "batch_size": 32}
    line = plan_for_spec(JobSpec(nodes=2, nproc_per_node=4, train=small))
    assert line and "fewer than one global batch" in line and "\n" not in line
