"""The planner's dry run: the real model parallelized at the job's world size over torch's fake
process group, its measured state per rank against the ZeRO table, and what it refuses."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from ddpkit.tools.planner.dryrun import dry_run, last_shard_numel, zero_state_bytes
from ddpkit.tools.planner.memory import make_plan
from ddpkit.tools.planner.model import describe_model, load_cfg
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


def within(measured: float, expected: float, tol: float = 0.02) -> bool:
    return abs(measured - expected) <= tol * expected


@pytest.mark.parametrize(
    "config, world",
    [("configs/gpt.toml", 8), ("configs/gpt.toml", 64), ("configs/gpt_350m.toml", 1024)],
)
def test_measured_state_agrees_with_the_zero_table(config, world):
    cfg = gpt_cfg(config)
    nodes = world // 8
    for strategy in ("DDP", "FULL_SHARD", "HYBRID_SHARD", "NO_SHARD"):
        run = dry_run(cfg, world, nodes, strategy)
        psi = run.params
        shard = {"FULL_SHARD": world, "HYBRID_SHARD": 8}.get(strategy, 1)
        assert run.mesh.get("shard", 1) == shard, (strategy, run.mesh)
        zero = zero_state_bytes(strategy, psi, world, shard, "adamw")
        assert zero == pytest.approx(16 * psi / shard)
        assert within(run.largest.total, zero), (strategy, world, run.largest.total, zero)
        assert run.smallest.total <= run.largest.total


@pytest.mark.parametrize("world", [8, 64, 1024])
def test_measured_state_is_the_planners_exact_split(world):
    # The ZeRO table is an even split. At 1,024 ranks the built-in gpt (d_model 128) has
    # fewer rows than ranks: torch.chunk gives ranks 0..127 one row and the rest none, so
    # rank 0 holds ~4x the even share. The measured shards and the planner's dim-0
    # arithmetic agree at every size, even where the table does not.
    cfg = gpt_cfg()
    desc = describe_model(Namespace(config="configs/gpt.toml", model=None))
    plan = make_plan(0, gpus=world, shapes=desc.shapes, strategies=("FULL_SHARD",))
    run = dry_run(cfg, world, 1, "FULL_SHARD")
    assert run.largest.total == plan.strategies[0].state_bytes
    assert run.smallest.total == min(r.total for r in plan.strategies[0].per_rank)


@pytest.mark.parametrize("world", [8, 64, 1024])
def test_shard_grad_op_shards_the_state_at_rest(world):
    # FSDP2's SHARD_GRAD_OP reshards after backward: between steps it holds FULL_SHARD's
    # 16 Psi / N; the unsharded params it keeps from forward to backward are a step's peak
    # (the planner's held_bytes), so the ZeRO-2 row 2 Psi + 14 Psi / N is a peak, not state.
    cfg = gpt_cfg()
    sgo = dry_run(cfg, world, 1, "SHARD_GRAD_OP")
    full = dry_run(cfg, world, 1, "FULL_SHARD")
    assert sgo.largest == full.largest
    assert zero_state_bytes("SHARD_GRAD_OP", 100, 10, 10, "adamw") == 2 * 100 + 14 * 100 / 10


def test_uneven_shards_rank_zero_is_the_largest():
    from torch.distributed.tensor import Replicate, Shard

    # torch.chunk: 10 rows over 4 ranks are 3, 3, 3, 1; 2 rows over 4 are 1, 1, 0, 0
    assert last_shard_numel((10, 5), (4,), (Shard(0),), Shard) == 5
    assert last_shard_numel((2, 5), (4,), (Shard(0),), Shard) == 0
    assert last_shard_numel((10, 5), (2, 4), (Replicate(), Shard(0)), Shard) == 5
    run = dry_run(gpt_cfg(), 1024, 1, "FULL_SHARD")
    assert run.smallest.total < run.largest.total  # 128-row tensors: empty last shards


def test_dry_run_leaves_the_process_clean():
    import torch.distributed as dist

    hook = sys.excepthook
    dry_run(gpt_cfg(), 8, 1, "FULL_SHARD")
    assert not dist.is_initialized()
    assert sys.excepthook is hook


def test_a_layer_fsdp_cannot_shard_is_refused():
    from ddpkit.tools.planner.model import PlanError

    cfg = load_cfg(Namespace(config=None, model="tests.tools.test_memory_dryrun:scalar_model"))
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


@pytest.mark.parametrize("how", [["--dry-run"], [], ["--step-time", "--mfu", "0.4"]])
def test_a_plan_warns_of_less_data_than_a_global_batch_and_plans(how, capsys):
    """The memory of a step does not depend on the dataset's length: a plan at a world the
    example's data cannot fill is made, with one warning line (the real run refuses it)."""
    proc = memory_here(
        capsys, "--config", "configs/gpt.toml", "--gpus", "1024", "--nodes", "128",
        "--strategy", "FULL_SHARD", "--peak-tflops", "989", "--json", *how,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "fewer than one global batch" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("warning: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)  # the plan itself
    enough = memory_here(
        capsys, "--config", "configs/gpt.toml", "--gpus", "8", "--json", *how,
        "--peak-tflops", "989",
    )  # fmt: skip
    assert enough.returncode == 0 and "global batch" not in enough.stderr, enough.stderr


def test_cli_refuses_a_scalar_parameter(one_line_error, capsys):
    model = "tests.tools.test_memory_dryrun:scalar_model"
    proc = memory_here(capsys, "--model", model, "--gpus", "8", "--dry-run")
    assert "FULL_SHARD cannot shard" not in proc.stderr  # its own strategy: DDP (the default)
    assert proc.returncode == 0, proc.stderr
    proc = memory_here(
        capsys, "--model", model, "--gpus", "8", "--strategy", "FULL_SHARD", "--dry-run"
    )
    assert "FULL_SHARD cannot shard this model on 8 ranks" in one_line_error(proc)


def test_cli_json_holds_params_and_measured_state_per_rank(capsys):
    proc = memory_here(
        capsys, "--config", "configs/gpt.toml", "--gpus", "64", "--nodes", "8",
        "--strategy", "FULL_SHARD", "--strategy", "HYBRID_SHARD", "--dry-run", "--json",
        "--gpu-mem", "80",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    psi = out["params"]
    assert psi == 940_800
    full, hybrid = out["strategies"]
    assert full["mesh"] == {"shard": 64} and hybrid["mesh"] == {"replicate": 8, "shard": 8}
    assert within(full["per_rank"]["measured_state_bytes"], 16 * psi / 64)
    assert within(hybrid["per_rank"]["measured_state_bytes"], 16 * psi / 8)
    r = full["per_rank"]
    assert r["measured_state_bytes"] == r["params"] + r["grads"] + r["optim"]
    assert r["total_bytes"] >= r["measured_state_bytes"] + r["activation_bytes"]
    assert r["fits"] is True


def test_cli_dry_run_needs_a_model(one_line_error):
    """Through the planner's own process: exit 2, one line, no traceback (the tests above run
    its main() in this process)."""
    proc = run_module("ddpkit.tools.planner", "--params", "7B", "--gpus", "8", "--dry-run")
    assert "--dry-run builds the model" in one_line_error(proc)


def test_350m_gpt_on_1024_ranks_is_quick():
    cfg = gpt_cfg("configs/gpt_350m.toml")
    start = time.perf_counter()
    run = dry_run(cfg, 1024, 128, "FULL_SHARD")
    took = time.perf_counter() - start
    assert within(run.largest.total, 16 * run.params / 1024)
    assert took < 60, took


def test_cli_table_reads_as_a_plan(capsys):
    proc = memory_here(capsys, "--config", "configs/gpt.toml", "--gpus", "8", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "state (measured)" in proc.stdout and "ZeRO table" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("FULL_SHARD"))
    assert "shard 8" in row  # the job's own strategy, from its config


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


def test_submit_plan_refuses_before_anything_runs_and_passes_a_job_that_plans(tmp_path):
    """`ddpkit submit --plan`: the dry run at the job's world size first; a job the ranks
    would refuse at start-up (here: less data than one global batch) is one line, exit 2,
    and nothing runs or is written; a job that plans is rendered as usual."""
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))
    bad = ["--gpus", "4", "--set", "train.synthetic_samples=100", "--set", "train.batch_size=32"]
    r = subprocess.run([ddpkit, "submit", "local", "--plan", *bad], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert "--plan: job 'default' at 4 ranks: the dataset has 100 samples" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no run dir, no job record
    ok = ["--nodes", "2", "--gpus", "4", "--set", "train.parallel=fsdp", "--quiet"]
    r = subprocess.run([ddpkit, "render", "slurm", "--plan", *ok], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0 and "--plan: job 'default' plans at 8 ranks" in r.stderr, r.stderr
