"""An async save copies the state in the background (ddpkit.train.ckpt.staging) while the
loop goes on, and the loop fences that copy before its optimizer step
(Checkpointer.wait_staging): the checkpoint holds the state as it was at save(), though the
loop's next forward/backward ran beside the copy and its optimizer step came right after the
fence. The copy is held back here by a gate, so that save() is seen returning before it.

Here the tests that start processes; the in-process ones in
tests/unit/train/ckpt/test_ckpt_async.py. Helpers both use are in
tests/unit/train/ckpt/test_ckpt_async.py."""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

from tests.unit.train.ckpt.test_ckpt_async import (
    _check,
    _fenced_save,
)


@pytest.mark.slow
def test_two_ranks_hold_the_weights_at_save_though_the_step_went_on(tmp_path):
    mp.spawn(_fenced_save, args=(2, str(tmp_path)), nprocs=2)
    _check(tmp_path, 2)


def test_an_async_save_returns_before_its_copy_and_holds_the_weights_at_save(tmp_path):
    _fenced_save(0, 1, str(tmp_path))
    _check(tmp_path, 1)
