"""Property tests of the resumable sampler and its stateless permutation.

The permutation (train/data/permutation.py): for every n, seed and epoch it is a bijection on
[0, n); an epoch's shards over the ranks are disjoint and, with the dropped tail, complete.

Across a world-size change: random (dataset size, per-rank batch, world size before/after,
resume point); the ranks' batches come from the real data iterator (`iterate_batches`), the
state goes through state_dict/load_state_dict as in a checkpoint. Nothing is seen twice in an
epoch, ranks' batches are disjoint, only less than one global batch per epoch is dropped, and
the iterator never stalls (an alarm turns a spin into a failure instead of a hung suite).

Here the tests that start processes; the in-process ones in
tests/unit/train/data/test_sampler_property.py. Helpers both use are in
tests/unit/train/data/test_sampler_property.py."""

from __future__ import annotations

import signal
from collections import defaultdict

import numpy as np
import torch
from ddpkit.train.data import GlobalBatchSampler, iterate_batches
from ddpkit.train.data.permutation import epoch_key, permute
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import TensorDataset

from tests.unit.train.data.test_sampler_property import SEEDS


def _ranks(n: int, batch: int, world: int, state: dict | None):
    ds = TensorDataset(torch.arange(n))
    samplers = [GlobalBatchSampler(n, batch, world, r, seed=5) for r in range(world)]
    for s in samplers:
        if state is not None:
            s.load_state_dict(state)
    its = [iterate_batches(ds, s, torch.device("cpu"), 0, r) for r, s in enumerate(samplers)]
    return samplers, its


def _steps(samplers, its, count: int, seen: dict[int, list[int]]) -> None:
    for _ in range(count):
        epoch = samplers[0].epoch
        step = [next(it)[0].tolist() for it in its]
        flat = [i for b in step for i in b]
        assert len(flat) == len(set(flat)), "ranks' batches overlap"
        seen[epoch] += flat
        for s in samplers:
            s.advance()
        assert len({(s.epoch, s.consumed) for s in samplers}) == 1  # ranks in lockstep


def _alarm(signum, frame):
    raise TimeoutError("the data iterator stalled (no batch within 10 s)")


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 16),
    before=st.integers(1, 8),
    after=st.integers(1, 8),
    resume_at=st.integers(0, 60),
    more=st.integers(1, 40),
)
def test_exactly_once_across_a_world_size_change(n, batch, before, after, resume_at, more):
    if n < batch * max(before, after):  # the trainer refuses this (one line, exit 2)
        return
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(10)
    try:
        seen: dict[int, list[int]] = defaultdict(list)
        samplers, its = _ranks(n, batch, before, None)
        _steps(samplers, its, resume_at, seen)
        state = samplers[0].state_dict()  # what the checkpoint carries
        samplers, its = _ranks(n, batch, after, state)
        _steps(samplers, its, more, seen)
        last = samplers[0].epoch
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    for epoch, got in seen.items():
        assert len(got) == len(set(got)), f"epoch {epoch}: a sample seen twice"
        if epoch < last:  # a finished epoch: only a partial global batch may be missing
            assert n - len(got) < batch * max(before, after), (epoch, n - len(got))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 20000),
    batch=st.integers(1, 5000),
    world=st.integers(1, 4),
    seed=SEEDS,
    shuffle=st.booleans(),
    at=st.floats(0, 1),
)
def test_an_epoch_walked_a_chunk_at_a_time_is_the_batch_by_batch_order(
    n, batch, world, seed, shuffle, at
):
    """The sampler permutes several batches' positions per call (PERMUTE_CHUNK); each
    batch must be exactly `indices()` of its own positions, from any resume point."""
    gb = batch * world
    for rank in range(world):
        s = GlobalBatchSampler(n, batch, world, rank, seed, shuffle=shuffle)
        s.consumed = int(at * (n // gb)) * gb if n >= gb else 0
        want = []
        start = s.consumed
        while start + gb <= n:
            want.append(s.indices(0, start + rank * batch, batch))
            start += gb
        got = [a.tolist() for a in s.epoch_index_arrays()]
        assert got == want
        assert list(s.epoch_indices()) == want


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4096), seed=SEEDS, epoch=st.integers(0, 10**6))
def test_the_permutation_is_a_bijection_for_every_n(n, seed, epoch):
    out = permute(np.arange(n), n, epoch_key(seed, epoch))
    assert out.dtype == np.int64
    assert np.array_equal(np.sort(out), np.arange(n))
