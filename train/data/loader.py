"""This rank's micro-batches, epoch after epoch, from the sampler's position."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from ddpkit.train.data.sampler import GlobalBatchSampler
from ddpkit.train.data.tokens import TokenChunks, WindowBatches
from ddpkit.train.data.user_dataset import dataset_name, item_shapes, show_shapes
from ddpkit.train.errors import ConfigError
from torch.utils.data import DataLoader, Dataset, TensorDataset, default_collate


def iterate_batches(
    ds: Dataset, sampler: GlobalBatchSampler, device: torch.device, num_workers: int, rank: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    """This rank's micro-batches forever, epoch after epoch, from the sampler's position.

    The caller advances the sampler after consuming each batch; the index lists of an epoch
    are fixed when the epoch starts, so DataLoader workers can prefetch them.
    """
    trace = _trace_file(rank)
    while True:
        if sampler.consumed + sampler.global_batch > sampler.n:
            # the sampler rolls over before this; never spin on an empty epoch
            raise RuntimeError(
                f"sampler at epoch {sampler.epoch}, {sampler.consumed} of {sampler.n} samples "
                f"consumed, has no global batch of {sampler.global_batch} left"
            )
        epoch = sampler.epoch
        # A generator, not a list: a 10M-sample epoch as Python lists would cost ~400 MB per
        # rank. With the trace hook, tee: each batch's indices computed once for both
        # readers (the loader runs a few batches ahead).
        if trace is None:
            yield from _epoch_batches(ds, sampler.epoch_index_arrays(), device, num_workers)
            continue
        index_arrays, for_loader = itertools.tee(sampler.epoch_index_arrays())
        batches = _epoch_batches(ds, for_loader, device, num_workers)
        for idx, batch in zip(index_arrays, batches, strict=True):
            # test hook: the samples this rank trains on, as handed over (here, not where
            # the sampler hands lists to DataLoader workers: they prefetch batches that a
            # stop may leave unconsumed)
            trace.write(f"{epoch} {' '.join(map(str, idx.tolist()))}\n")
            yield batch


def _epoch_batches(
    ds: Dataset, index_arrays: Iterator[np.ndarray], device: torch.device, num_workers: int
) -> Iterator[tuple[torch.Tensor, ...]]:
    """One epoch's batches for the given index arrays, in their order."""
    if isinstance(ds, TensorDataset) and num_workers == 0:
        yield from _tensor_batches(ds.tensors, index_arrays, device)
        return
    index_lists = (a.tolist() for a in index_arrays)
    if isinstance(ds, TokenChunks) and num_workers == 0:
        for idx in index_lists:  # windows read from the file, widened per batch
            yield tuple(x.to(device, non_blocking=True) for x in ds.batch(idx))
        return
    if isinstance(ds, TokenChunks):
        # Workers read whole batches (one vectorized read, no per-window collation); the ids
        # are checked here so a bad one is the kit's one line, not a worker's traceback.
        windows = DataLoader(
            WindowBatches(ds),
            sampler=index_lists,
            batch_size=None,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
        )
        for idx, w in windows:
            ds.check(idx.tolist(), w)
            yield w[:, :-1].to(device, non_blocking=True), w[:, 1:].to(device, non_blocking=True)
        return
    # Workers: DataLoader keeps batch_sampler order (in_order), so batch k is index_lists[k].
    loader = DataLoader(
        _Indexed(ds),
        batch_sampler=index_lists,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
        collate_fn=_collate_checked,
    )
    for batch in loader:
        if isinstance(batch, _BadBatch):
            raise ConfigError(f"{dataset_name(ds)}: {batch.why}")
        yield tuple(x.to(device, non_blocking=True) for x in batch)


def _tensor_batches(
    tensors: tuple[torch.Tensor, ...], index_arrays: Iterator[np.ndarray], device: torch.device
) -> Iterator[tuple[torch.Tensor, ...]]:
    """In-memory tensors: one gather per tensor and batch, no per-sample collation. On a
    small model this is a good part of the step, so: the index array becomes a tensor
    without a copy, a CPU tensor is gathered with index_select (a third of `x[t]`'s time
    here), and a tensor already on the device is not passed through `.to()`."""
    cpu = torch.device("cpu")
    plan = [(x, x.device == cpu, x.device != device) for x in tensors]
    for idx in index_arrays:
        t = torch.from_numpy(idx)
        batch = []
        for x, on_cpu, move in plan:
            b = x.index_select(0, t) if on_cpu else x[t]
            batch.append(b.to(device, non_blocking=True) if move else b)
        yield tuple(batch)


def _trace_file(rank: int):
    d = os.environ.get("DDPKIT_TRACE_SAMPLES")
    return open(Path(d) / f"rank{rank}.txt", "a", buffering=1) if d else None  # noqa: SIM115


def _collate_checked(items: list[tuple[int, object]]) -> object:
    """default_collate of (index, item) pairs; a batch that does not stack comes back as a
    _BadBatch naming the first item whose shapes differ (raised by the main process: an
    exception raised in a DataLoader worker arrives as a multi-line re-raise)."""
    try:
        return default_collate([item for _, item in items])
    except (RuntimeError, TypeError, ValueError) as e:
        i0, first = items[0]
        try:
            want = item_shapes(first, f"item {i0}")
            for i, item in items[1:]:
                got = item_shapes(item, f"item {i}")
                if got != want:
                    return _BadBatch(
                        f"item {i} has {show_shapes(got)}, item {i0} of the same batch has "
                        f"{show_shapes(want)}; every sample must have the same shapes to stack into "
                        "a batch (pad or crop them in the dataset)"
                    )
        except ConfigError as bad_item:
            return _BadBatch(str(bad_item))
        return _BadBatch(f"items {i0}.. do not stack into a batch ({type(e).__name__}: {e})")


@dataclass
class _BadBatch:
    why: str


class _Indexed(Dataset):
    """The user's dataset, each item with its index (for _collate_checked's message)."""

    def __init__(self, ds: Dataset):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[int, object]:
        return i, self.ds[i]
