"""Property tests of the resumable sampler and its stateless permutation.

The permutation (train/data/permutation.py): for every n, seed and epoch it is a bijection on
[0, n); an epoch's shards over the ranks are disjoint and, with the dropped tail, complete.

Across a world-size change: random (dataset size, per-rank batch, world size before/after,
resume point); the ranks' batches come from the real data iterator (`iterate_batches`), the
state goes through state_dict/load_state_dict as in a checkpoint. Nothing is seen twice in an
epoch, ranks' batches are disjoint, only less than one global batch per epoch is dropped, and
the iterator never stalls (an alarm turns a spin into a failure instead of a hung suite).

Here the tests that run in this process; those that start processes in
tests/process/train/data/test_sampler_property.py."""

from __future__ import annotations

from ddpkit.train.data import GlobalBatchSampler
from hypothesis import given, settings
from hypothesis import strategies as st

SEEDS = st.integers(-(2**40), 2**40)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 3000),
    batch=st.integers(1, 64),
    world=st.integers(1, 16),
    seed=SEEDS,
    epoch=st.integers(0, 1000),
)
def test_an_epochs_shards_are_disjoint_and_complete(n, batch, world, seed, epoch):
    gb = batch * world
    shards = []
    for r in range(world):
        s = GlobalBatchSampler(n, batch, world, r, seed)
        s.epoch = epoch
        shards.append([i for b in s.epoch_indices() for i in b])
    kept = (n // gb) * gb
    assert all(len(sh) == kept // world for sh in shards)  # no rank waits for another
    flat = [i for sh in shards for i in sh]
    assert len(flat) == len(set(flat)) == kept  # disjoint
    # complete: what the ranks train on plus the dropped tail (< one global batch) is [0, n)
    tail = GlobalBatchSampler(n, batch, world, 0, seed).indices(epoch, kept, n - kept)
    assert n - kept < gb and sorted(flat + tail) == list(range(n))


def test_less_than_one_global_batch_left_moves_to_the_next_epoch():
    # The case: 2 ranks stop 1 global batch (of 2 x 64) before an epoch's end; 4
    # ranks need 256 samples: none left in this epoch, so they start the next one.
    s = GlobalBatchSampler(1024, 64, 4, 0, 0)
    s.load_state_dict({"epoch": 3, "consumed": 1024 - 128})
    assert s.state_dict() == {"epoch": 4, "consumed": 0}
    assert len(list(s.epoch_indices())) == 4
