"""Issue 11: never keep a bad state. Real `python -m train` processes (torchrun + gloo where
the item needs ranks; a single process where it does not, which is much cheaper)."""

from __future__ import annotations

import pytest

from tests.trainrun import train

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
