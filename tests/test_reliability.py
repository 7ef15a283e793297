"""Issue 11: never keep a bad state. Real `python -m train` processes (torchrun + gloo where
the item needs ranks; a single process where it does not, which is much cheaper)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from tests.trainrun import full_params, train
from train.contract import EXIT_DIVERGED

pytestmark = pytest.mark.slow

SMALL = ("--batch-size", "16", "--synthetic-samples", "1024", "--no-eval", "--log-interval", "1")


def test_reshard_with_less_than_one_global_batch_left_goes_to_the_next_epoch(tmp_path):
    # 1 process stops 16 samples before the end of epoch 0 (64 batches of 16); 2 ranks need
    # 32 per step: the rest of epoch 0 is their dropped tail, so they start epoch 1.
    rd = tmp_path / "run"
    train(rd, *SMALL, "--steps", "63")
    run = train(rd, *SMALL, "--steps", "65", nproc=2, timeout=120)
    assert "global batch 16 -> 32" in run.out
    assert [m["epoch"] for m in run.metrics()][-2:] == [1, 1]
    assert run.summary["steps"] == 65


# --- item 1: divergence ----------------------------------------------------------------------


def _error_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("error: ")]


def _worker_tracebacks(out: str) -> int:
    """Tracebacks other than torchrun's own report of a failed worker."""
    return out.count("Traceback (most recent call last)") - out.count('bin/torchrun", line')


def test_divergence_stops_and_keeps_the_finite_checkpoints(tmp_path):
    # The case: loss nan from about step 15; keep-3 used to prune every finite one.
    rd = tmp_path / "run"
    args = ("--lr", "50", "--optimizer", "sgd", "--ckpt-interval", "10", "--ckpt-keep", "3")
    run = train(rd, *SMALL, *args, "--steps", "60", check=False)
    assert run.rc == EXIT_DIVERGED, run.out
    [line] = _error_lines(run.out)
    m = re.search(r"non-finite loss or gradient norm at step (\d+);", line)
    assert m, line
    bad = int(m.group(1))
    good = [p for p in (rd / "checkpoints").iterdir()]
    assert good and all(int(p.name[5:]) < bad for p in good)
    newest = max(good, key=lambda p: int(p.name[5:]))
    assert f"the last finite checkpoint is {newest}" in line and f"--resume {newest}" in line
    params = full_params(newest)
    assert all(torch.isfinite(t).all() for t in params.values() if isinstance(t, torch.Tensor))
    assert not (rd / "summary.json").exists()


def test_a_nan_on_one_rank_stops_every_rank_with_one_line(tmp_path):
    rd = tmp_path / "run"
    env = {"DDPKIT_FAULT": "nan@5:1"}
    run = train(rd, *SMALL, "--steps", "8", "--ckpt-interval", "3", nproc=2, env=env, check=False)
    assert run.rc != 0 and "exitcode  : 3" in run.out  # torchrun's report of the workers
    assert _worker_tracebacks(run.out) == 0
    [line] = _error_lines(run.out)  # rank 0 only
    assert "at step 5;" in line and f"--resume {rd / 'checkpoints' / 'step-3'}" in line
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == ["step-3"]


def test_max_bad_steps_skips_the_step_on_every_rank(tmp_path):
    rd = tmp_path / "run"
    env = {"DDPKIT_FAULT": "nan@5:1"}
    run = train(rd, *SMALL, "--steps", "8", "--max-bad-steps", "1", nproc=2, env=env)
    assert "warning: step 5: non-finite loss or gradient norm, skipped (1 of" in run.out
    assert run.summary["steps"] == 8
    assert all(math.isfinite(m["loss"]) for m in run.metrics() if m["step"] != 5)
    params = full_params(rd / "checkpoints" / "step-8")
    assert all(torch.isfinite(t).all() for t in params.values() if isinstance(t, torch.Tensor))
