"""The resumable, world-size-independent sampler: every rank the same epoch order, its own slice.

Every rank computes the same permutation of the dataset for an epoch (seed + epoch), the epoch
is cut into global batches of `batch * world` samples, and rank r takes slice r of each. The
permutation is a seeded bijection evaluated a few batches at a time (permutation.py), never
materialized: O(batch) memory and time whatever the dataset's size. The only state is (epoch, samples
consumed in the epoch), so a checkpoint taken with one world size resumes on another at the
same sample: nothing seen twice, nothing skipped. A partial global batch at the end of an
epoch is dropped (like DistributedSampler(drop_last=True)): every rank runs the same number of
steps, so an uneven tail can never hang a collective.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist
from ddpkit.train.data.permutation import epoch_key, permute
from ddpkit.train.errors import ConfigError

if TYPE_CHECKING:
    from ddpkit.train.distributed import World


# Positions permuted per call when a rank walks an epoch (a few batches ahead: 32 KiB).
PERMUTE_CHUNK = 4096


class GlobalBatchSampler:
    """Yields this rank's index list per micro-batch; state = (epoch, consumed)."""

    def __init__(self, n: int, batch: int, world: int, rank: int, seed: int, shuffle: bool = True):
        self.n, self.batch, self.world, self.rank = n, batch, world, rank
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0
        self.consumed = 0  # samples of this epoch already handed out, summed over ranks

    @property
    def global_batch(self) -> int:
        return self.batch * self.world

    def batches_per_epoch(self) -> int:
        return self.n // self.global_batch

    def indices(self, epoch: int, start: int, count: int) -> list[int]:
        """Positions start .. start+count-1 of the epoch's order, as sample indices.
        Older kits drew the order with torch.randperm: their checkpoint taken mid-epoch resumes
        that epoch in this order, so its rest is not exactly-once (the epochs after it are)."""
        return self._order(np.arange(start, start + count, dtype=np.int64), epoch).tolist()

    def _order(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """The sample indices at these positions of the epoch's order."""
        return (
            permute(positions, self.n, epoch_key(self.seed, epoch)) if self.shuffle else positions
        )

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        # A checkpoint from another world size can stop where less than one of OUR global
        # batches is left in the epoch: that rest is this world's dropped tail, so move on
        # (staying would yield no batch and the data loop would spin forever).
        self._roll_over()

    def advance(self) -> None:
        """Mark one global batch as consumed (called by the trainer after each micro-step)."""
        self.consumed += self.global_batch
        self._roll_over()

    def _roll_over(self) -> None:
        if self.consumed + self.global_batch > self.n:  # the rest is a dropped partial batch
            self.epoch, self.consumed = self.epoch + 1, 0

    def epoch_indices(self) -> Iterator[list[int]]:
        """This rank's batches for the rest of the current epoch (does not mutate state).
        The position is read now, not at the first next(): advance() may run in between."""
        return (a.tolist() for a in self.epoch_index_arrays())

    def epoch_index_arrays(self) -> Iterator[np.ndarray]:
        """epoch_indices() as int64 arrays (the in-memory data path indexes with them)."""
        return self._batches(self.epoch, self.consumed)

    def _batches(self, epoch: int, start: int) -> Iterator[np.ndarray]:
        # Several batches' positions per permute() call: its numpy calls cost ~25 us
        # whatever their length, once per batch of 64 a tenth of an mlp step's data path.
        # The same positions as one call per batch, so the same indices.
        per_call = max(1, PERMUTE_CHUNK // self.batch)
        within = np.arange(self.batch, dtype=np.int64)
        left = (self.n - start) // self.global_batch if start <= self.n else 0
        while left > 0:
            k = min(per_call, left)
            firsts = start + self.rank * self.batch + self.global_batch * np.arange(k)
            pos = (firsts[:, None] + within).ravel()
            yield from self._order(pos, epoch).reshape(k, self.batch)
            start += k * self.global_batch
            left -= k


def check_same_length(n: int, world: World) -> None:
    """Every rank must see the same dataset: the global order is drawn over `n` samples, so
    ranks of different lengths would train on different permutations (duplicates and gaps)
    without a word. One small collective at start-up; every rank raises the same line."""
    if world.size == 1:
        return
    t = torch.tensor([n, -n], dtype=torch.int64, device=world.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    hi, lo = int(t[0]), -int(t[1])
    if hi != lo:
        raise ConfigError(
            f"the training dataset has {lo} samples on some ranks and {hi} on others: every "
            "rank must build the same dataset (the same files, or the same seed for generated "
            "data); the global order is drawn over one length"
        )
