"""An async save's staging copy: in a background thread, without holding the GIL.

DCP's DefaultStager keeps one host buffer per storage from save to save and, with
use_async_staging, copies into them from a thread of its own; the caller fences the copy
before the optimizer changes the weights (Checkpointer.wait_staging). But it copies with
UntypedStorage.copy_, which holds the GIL for the whole copy: from a background thread that
stalls the training thread's next Python bytecode for as long as each copy takes (measured
here, 160 MB: another thread made no progress during a storage copy, and ran freely during a
Tensor.copy_ of the same bytes). So the copies here go through byte tensors over the same
storages: Tensor.copy_ releases the GIL, and the loop's forward/backward runs beside it.
DCP's traversal (DTensors, storages shared by several tensors, plain values) is kept.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _CopyWithoutGil(StateDictStager):
    """DCP's stager with its storage copy done by Tensor.copy_ (which releases the GIL)."""

    def _stage_untyped_storage(
        self, storage: torch.UntypedStorage, non_blocking: bool = False
    ) -> torch.UntypedStorage:
        cached = self._cached_storage_mapping.get(storage)
        if cached is None or cached.size() != storage.size():
            if self.pin_memory or self.share_memory:  # DCP allocates those (once per storage)
                self._cached_storage_mapping.pop(storage, None)
                return super()._stage_untyped_storage(storage, non_blocking)
            # The first save allocates; its copy into fresh pages (~0.7 s for 160 MB here)
            # runs without the GIL too.
            cached = torch.UntypedStorage(storage.size(), device="cpu")
            self._cached_storage_mapping[storage] = cached
        _as_bytes(cached).copy_(_as_bytes(storage), non_blocking=non_blocking)
        return cached


def background_stager(cuda: bool) -> Any:
    """One stager for a run: host buffers reused from save to save, the copy started by
    dcp.async_save and run by the stager's thread (on CUDA into pinned memory, on a stream
    of its own)."""
    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
    )
    # DefaultStager takes no stager of ours: its one StateDictStager is replaced.
    stager._state_dict_stager = _CopyWithoutGil(pin_memory=cuda, share_memory=False)
    return stager
