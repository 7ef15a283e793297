"""The memory planner: ZeRO accounting, exact FSDP2 shard sizes, the CLI, and (slow) the
planner's state bytes against what real training measures with 1, 2 and 4 ranks.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_memory.py."""

from __future__ import annotations

import subprocess

import pytest
from ddpkit.tools.planner.memory import make_plan, parse_count
from ddpkit.tools.planner.model import shard_rows

from tests.trainrun import run_module


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("ddpkit.tools.planner", *args)


def by_name(plan):
    return {s.strategy: s for s in plan.strategies}


def test_article_zero_table_7b_on_8_gpus():
    # The article: 7B on 8 GPUs is ~112 GB per GPU under DDP and ~14 GB under FULL_SHARD.
    s = by_name(make_plan(7_000_000_000, gpus=8))
    assert s["DDP"].state_bytes == 112_000_000_000
    assert s["FULL_SHARD"].state_bytes == 14_000_000_000
    assert s["DDP"].per_rank[0].as_dict() == {
        "params": 28_000_000_000,
        "grads": 28_000_000_000,
        "optim": 56_000_000_000,
        "total": 112_000_000_000,
    }
    # SHARD_GRAD_OP keeps the unsharded compute-dtype params from forward to backward.
    assert s["SHARD_GRAD_OP"].held_bytes == 28_000_000_000
    bf16 = by_name(make_plan(7_000_000_000, gpus=8, dtype="bf16"))
    assert bf16["SHARD_GRAD_OP"].held_bytes == 14_000_000_000
    assert bf16["FULL_SHARD"].state_bytes == 14_000_000_000  # fp32 shards under bf16


def test_hybrid_shards_within_the_group_only():
    s = by_name(make_plan(7_000_000_000, gpus=16, nodes=2))
    assert s["HYBRID_SHARD"].shard_size == 8
    assert s["HYBRID_SHARD"].state_bytes == 14_000_000_000
    assert s["FULL_SHARD"].state_bytes == 7_000_000_000
    s = by_name(make_plan(1_000_000, gpus=4, replicate_degree=2))
    assert s["HYBRID_SHARD"].shard_size == 2


def test_optimizer_bytes():
    sgd = by_name(make_plan(1000, gpus=1, optimizer="sgd"))["DDP"].per_rank[0]
    assert (sgd.params, sgd.grads, sgd.optim) == (4000, 4000, 4000)


def test_fsdp2_dim0_chunks():
    assert [shard_rows(10, 4, i) for i in range(4)] == [3, 3, 3, 1]
    assert [shard_rows(2, 4, i) for i in range(4)] == [1, 1, 0, 0]
    shapes = [(10, 7), (10,), (256, 3)]
    plan = by_name(make_plan(0, gpus=4, shapes=shapes))
    ranks = plan["FULL_SHARD"].per_rank
    assert sum(r.params for r in ranks) == 4 * (70 + 10 + 768)  # shards add up to the model
    assert ranks[0].params > ranks[3].params  # the last rank gets the short chunk
    # Adam's step counter: one 4-byte scalar per parameter tensor.
    assert ranks[0].optim == 2 * ranks[0].params + 4 * len(shapes)


def test_parse_count():
    assert parse_count("7e9") == 7_000_000_000
    assert parse_count("1.3B") == 1_300_000_000
    assert parse_count("125m") == 125_000_000
    with pytest.raises(ValueError):
        parse_count("seven")
