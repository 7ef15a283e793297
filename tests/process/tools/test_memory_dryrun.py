"""The planner's dry run: the real model parallelized at the job's world size over torch's fake
process group, its measured state per rank against the ZeRO table, and what it refuses.

Here the tests that start processes; the in-process ones in
tests/unit/tools/test_memory_dryrun.py. Helpers both use are in
tests/unit/tools/test_memory_dryrun.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest
from ddpkit.tools.planner.dryrun import dry_run, last_shard_numel, zero_state_bytes
from ddpkit.tools.planner.memory import make_plan
from ddpkit.tools.planner.model import describe_model

from tests.trainrun import memory_here
from tests.unit.tools.test_memory_dryrun import gpt_cfg


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


def test_350m_gpt_on_1024_ranks_is_quick():
    cfg = gpt_cfg("configs/gpt_350m.toml")
    start = time.perf_counter()
    run = dry_run(cfg, 1024, 128, "FULL_SHARD")
    took = time.perf_counter() - start
    assert within(run.largest.total, 16 * run.params / 1024)
    assert took < 60, took


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


def test_dry_run_leaves_the_process_clean():
    import torch.distributed as dist

    hook = sys.excepthook
    dry_run(gpt_cfg(), 8, 1, "FULL_SHARD")
    assert not dist.is_initialized()
    assert sys.excepthook is hook


def test_cli_table_reads_as_a_plan(capsys):
    proc = memory_here(capsys, "--config", "configs/gpt.toml", "--gpus", "8", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "state (measured)" in proc.stdout and "ZeRO table" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("FULL_SHARD"))
    assert "shard 8" in row  # the job's own strategy, from its config
