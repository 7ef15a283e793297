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
`start_async_save` starts an async save with the run's one stager.

On CUDA the copy runs on the stager's own stream, which DCP does not order after the loop's
stream: without a wait it could read a parameter before the optimizer step queued just
before save() had written it, or a buffer's copy (ckpt.parts) before it was made. save()
records an event on the loop's stream once the state dict is taken (`mark_taken`), and the
stager's stream waits for it before its first copy.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _CopyWithoutGil(StateDictStager):
    """DCP's stager with its storage copy done by Tensor.copy_ (which releases the GIL), after
    the work the loop queued before the save (CUDA)."""

    taken: Any = None  # CUDA: the event save() recorded on the loop's stream

    @torch.no_grad()
    def stage(self, state_dict: Any, non_blocking: bool = False) -> Any:
        if self.taken is not None:  # runs on the stager's stream (DefaultStager._stage)
            torch.cuda.current_stream().wait_event(self.taken)
            self.taken = None
        return super().stage(state_dict, non_blocking)

    def close(self) -> None:
        """Nothing: some torch versions' DefaultStager closes its StateDictStager after every
        stage (2.11 does, 2.14 does not). That emptied the copy's dispatch table, so the next
        save failed (KeyError: <class 'type'>, seen on an H200 with torch 2.11), and dropped
        the host buffers meant for reuse. `release_stager` frees them at the end of the run."""

    def release(self) -> None:
        super().close()

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


def release_stager(stager: Any) -> None:
    """The end of a run's async saves: the stager's thread and its host buffers."""
    stager.close()
    stager._state_dict_stager.release()


def mark_taken(stager: Any) -> None:
    """On the loop's thread, once the state dict is built: the staging copy starts after
    everything the loop's CUDA stream has queued so far (a no-op without CUDA)."""
    if torch.cuda.is_available():
        event = torch.cuda.Event()
        event.record()
        stager._state_dict_stager.taken = event


def _chain(source: Future, target: Future) -> None:
    """Settle `target` as `source` settles."""

    def settle(f: Future) -> None:
        if (e := f.exception()) is not None:
            target.set_exception(e)
        else:
            target.set_result(f.result())

    source.add_done_callback(settle)


def start_async_save(
    launcher: ThreadPoolExecutor, stager: Any, state: dict[str, Any], writer: Any, pg: Any
) -> tuple[Future, Future]:
    """dcp.async_save, started from the run's launch thread (`launcher`); returns (staged,
    written). It starts the staging copy (the stager's thread) and the write (a thread of
    DCP's); its own Python work (the stager's traversal, making the write's thread) then
    competes with the copy it just started: measured on the loop's thread, 4-6 ms of a 9 ms
    save() (mlp-deep, 2 ranks on 2 cores), so the loop does not wait for it. Its errors
    come out of the futures."""
    import torch.distributed.checkpoint as dcp

    mark_taken(stager)  # CUDA: the copy waits for what the loop queued before save()
    staged: Future = Future()
    written: Future = Future()

    def launch() -> None:
        try:
            resp = dcp.async_save(
                state, storage_writer=writer, process_group=pg, async_stager=stager
            )
        except BaseException as e:  # noqa: BLE001 - raised where the futures are awaited
            staged.set_exception(e)
            written.set_exception(e)
            return
        _chain(resp.staging_completion, staged)
        _chain(resp.upload_completion, written)

    launcher.submit(launch)
    return staged, written
