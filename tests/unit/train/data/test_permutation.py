"""The sampler's stateless permutation: pinned values, a real shuffle, O(batch) at any n.

The property tests (a bijection for every n, shards disjoint and complete, exactly-once
across a world-size change) are in test_sampler_property.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ddpkit.train.data import GlobalBatchSampler
from ddpkit.train.data.permutation import domain, epoch_key, permute


def test_the_order_is_pinned():
    # A run resumed mid-epoch recomputes the rest of the epoch from (seed, epoch, consumed):
    # a change to these values breaks exactly-once for runs resumed across the change.
    assert permute(np.arange(10), 10, epoch_key(0, 0)).tolist() == [7, 8, 3, 9, 1, 4, 0, 5, 2, 6]
    assert permute(np.arange(5), 2**40, epoch_key(7, 3)).tolist() == [
        983959138823,
        618108226111,
        382984355860,
        287146352210,
        982657983756,
    ]
    assert next(GlobalBatchSampler(100, 4, 2, 1, 0).epoch_indices()) == [16, 57, 62, 25]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 960, 961, 962, 2**12 - 1, 2**12 + 1, 10**4])
def test_a_bijection_at_squares_and_beside_them(n):  # where the domain a*b changes shape
    out = permute(np.arange(n), n, epoch_key(11, 2))
    assert sorted(out.tolist()) == list(range(n))


def test_neighbouring_positions_are_scattered():
    n = 10_000
    p = permute(np.arange(n), n, epoch_key(3, 0))
    # A uniform shuffle: E|p[i+1] - p[i]| = n/3, about one fixed point, no rank correlation.
    assert abs(np.abs(np.diff(p)).mean() / (n / 3) - 1) < 0.05
    assert (p == np.arange(n)).sum() < 10
    assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.05
    q = permute(np.arange(n), n, epoch_key(3, 1))
    assert (p == q).sum() < 10  # another epoch, another order


def test_positions_can_be_asked_for_in_any_slices():
    n, key = 1000, epoch_key(5, 9)
    whole = permute(np.arange(n), n, key)
    parts = [permute(np.arange(lo, min(lo + 37, n)), n, key) for lo in range(0, n, 37)]
    assert np.concatenate(parts).tolist() == whole.tolist()


def test_a_batch_of_a_trillion_windows_costs_a_batch():
    n = 4 * 10**12  # 1 PB of uint16 tokens at seq 128: randperm would need 32 TB
    s = GlobalBatchSampler(n, 512, 1024, 1023, seed=1)
    s.load_state_dict({"epoch": 2, "consumed": 10**12})
    t = time.perf_counter()
    idx = next(s.epoch_indices())
    assert time.perf_counter() - t < 1.0
    assert len(idx) == len(set(idx)) == 512 and all(0 <= i < n for i in idx)


def test_the_domain_sits_just_above_n():
    for n in [2, 5, 961, 962, 10**6 + 3, 2**62]:
        a, b = domain(n)
        assert a * b >= n and a * b - n < a  # so a value walks with probability < 1/sqrt(n)


def test_out_of_range_sizes_are_refused():
    with pytest.raises(ValueError, match=r"outside \[1, 2\*\*62\]"):
        permute(np.arange(3), 2**63, 0)
    assert permute(np.arange(1), 1, 0).tolist() == [0]
    assert permute(np.arange(0), 5, 0).tolist() == []
