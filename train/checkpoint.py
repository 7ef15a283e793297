"""Distributed Checkpoint (DCP) behind one manager: save, async save, resume, keep-K.

Layout: <ckpt_dir>/step-<N>/ holds DCP's files; `.complete` (JSON, written last by rank 0
once every rank's data and DCP's `.metadata` are on disk) is what makes it count. A directory
without it is a save that was interrupted: skipped with a warning, never loaded.

What goes in: the model and optimizer through get_state_dict (sharded under FSDP, so the
same checkpoint loads under another world size or strategy), the train state (step, sampler
epoch and position, peak LR, world size) and every rank's RNG state under its own key.
DCP metadata is pickled: load checkpoints only from storage you trust.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from train.config import ConfigError

MARKER = ".complete"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return None


def list_checkpoints(ckpt_dir: Path) -> tuple[list[Path], list[Path]]:
    """(complete step dirs oldest first, incomplete step dirs)."""
    complete, partial = [], []
    if not ckpt_dir.is_dir():
        return complete, partial
    for p in sorted(ckpt_dir.iterdir(), key=lambda q: _step_of(q) or -1):
        if _step_of(p) is None or not p.is_dir():
            continue
        ok = read_marker(p) is not None and (p / ".metadata").is_file()
        (complete if ok else partial).append(p)
    return complete, partial


def _step_of(p: Path) -> int | None:
    m = _STEP_DIR.match(p.name)
    return int(m.group(1)) if m else None


def rng_state() -> torch.Tensor:
    state = torch.get_rng_state()
    if torch.cuda.is_available():
        state = torch.cat([state, torch.cuda.get_rng_state()])
    return state


def set_rng_state(state: torch.Tensor) -> None:
    cpu = torch.get_rng_state()
    torch.set_rng_state(state[: cpu.numel()])
    if torch.cuda.is_available() and state.numel() > cpu.numel():
        torch.cuda.set_rng_state(state[cpu.numel() :])


class Checkpointer:
    def __init__(self, ckpt_dir: str, keep: int, use_async: bool, log: Any):
        self.dir = Path(ckpt_dir)
        self.keep = keep
        self.use_async = use_async
        self.log = log
        self.rank = dist.get_rank()
        # Checkpoint collectives get their own gloo group: an async save talks from a
        # background thread while training collectives run on the default group.
        self.pg = dist.new_group(backend="gloo")
        self._pending: tuple[Any, Path, dict[str, Any], float] | None = None
        self._staging: Any = None  # CUDA: the device-to-host copy still running
        self._stager: Any = None

    # --- state dicts ---------------------------------------------------------------------

    def _state(self, model: nn.Module, optim: torch.optim.Optimizer, train: dict[str, Any]) -> dict:
        # DCP is imported on first use: ~1.2 s per rank that a run's first step need not wait.
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(model, optim)
        return {
            "model": msd,
            "optim": osd,
            "train": dict(train),
            "rng": {f"rank{self.rank}": rng_state()},
        }

    # --- save ----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: nn.Module,
        optim: torch.optim.Optimizer,
        train: dict[str, Any],
        info: dict[str, Any],
        force_sync: bool = False,
    ) -> float:
        """Write step-<step>; returns the seconds the caller was blocked."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        path = self.dir / f"step-{step}"
        if self.rank == 0:
            if path.exists():  # a leftover of an interrupted save (or an older run): replace
                shutil.rmtree(path)
            path.mkdir(parents=True)
        dist.barrier(group=self.pg)
        state = self._state(model, optim, train)
        if self.use_async and not force_sync:
            resp = dcp.async_save(
                state,
                checkpoint_id=str(path),
                process_group=self.pg,
                async_stager=self._get_stager(),
            )
            fut = getattr(resp, "upload_completion", resp)
            self._staging = getattr(resp, "staging_completion", None)
            self._pending = (fut, path, info, t0)
        else:
            dcp.save(state, checkpoint_id=str(path), process_group=self.pg)
            self._finish(path, info, t0)
        return time.perf_counter() - t0

    def _get_stager(self) -> Any:
        """One stager for the whole run: its host buffers are allocated by the first async
        save and reused by the next ones (measured on CPU: the loop's blocked time fell from
        0.20 s to 0.09 s for 161 MB per rank). With CUDA the device-to-host copy also runs in
        the background into pinned memory; wait_staging() fences it before the optimizer
        changes the parameters."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda,
                    use_shared_memory=False,
                    use_async_staging=cuda,
                    use_non_blocking_copy=cuda,
                )
            )
        return self._stager

    def wait_staging(self) -> None:
        """Call before the optimizer step: the staged copy must be taken from the weights
        of the step it belongs to."""
        if self._staging is not None:
            self._staging.result()
            self._staging = None

    def close(self) -> None:
        self.wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def poll(self) -> None:
        """Mark a finished async save complete (cheap; call at step boundaries)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        fut, path, info, t0 = self._pending
        self._pending = None
        self.wait_staging()
        fut.result()
        self._finish(path, info, t0)

    def _finish(self, path: Path, info: dict[str, Any], t0: float) -> None:
        # On rank 0 DCP returns only after gathering every rank's write results and
        # writing .metadata, so all data is on disk when the marker goes down.
        if self.rank != 0:
            return
        info = {**info, "save_s": round(time.perf_counter() - t0, 3), "time": time.time()}
        tmp = path / (MARKER + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, path / MARKER)
        self.log(f"checkpoint saved: {path} ({info['save_s']:.2f} s)")
        self._prune()

    def _prune(self) -> None:
        complete, partial = list_checkpoints(self.dir)
        newest = _step_of(complete[-1]) if complete else -1
        for p in complete[: -self.keep]:
            shutil.rmtree(p, ignore_errors=True)
        for p in partial:  # interrupted saves older than a complete one are garbage
            if (_step_of(p) or 0) < (newest or 0):
                shutil.rmtree(p, ignore_errors=True)

    # --- resume --------------------------------------------------------------------------

    def find(self, resume: str) -> Path | None:
        if resume == "never":
            return None
        if resume != "auto":
            path = Path(resume)
            if read_marker(path) is None or not (path / ".metadata").is_file():
                raise ConfigError(
                    f"--resume {resume}: not a complete ddpkit checkpoint (no {MARKER} or "
                    ".metadata); pass a step-N directory written by a finished save"
                )
            return path
        complete, partial = list_checkpoints(self.dir)
        newest = _step_of(complete[-1]) if complete else -1
        for p in partial:
            if (_step_of(p) or 0) > (newest or -1):
                self.log(f"warning: skipping incomplete checkpoint {p} (interrupted save)")
        return complete[-1] if complete else None

    def load(
        self, path: Path, model: nn.Module, optim: torch.optim.Optimizer, train: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load in place; returns (train state, the checkpoint's .complete info)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        info = read_marker(path) or {}
        meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        state = self._state(model, optim, train)
        self._check_compatible(path, state, meta, info)
        rng_key = f"rng.rank{self.rank}"
        if rng_key not in meta:  # the world grew: this rank has no saved RNG state
            del state["rng"]
        dcp.load(state, checkpoint_id=str(path), process_group=self.pg)
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        if "rng" in state:
            set_rng_state(state["rng"][f"rank{self.rank}"])
        return state["train"], info

    @staticmethod
    def _check_compatible(path: Path, state: dict, meta: dict, info: dict[str, Any]) -> None:
        ours = {
            f"model.{k}": tuple(v.shape)
            for k, v in state["model"].items()
            if isinstance(v, torch.Tensor)
        }
        theirs = {
            k: tuple(getattr(v, "size", ())) for k, v in meta.items() if k.startswith("model.")
        }
        if ours.keys() != theirs.keys() or any(ours[k] != theirs[k] for k in ours):
            diff = (
                sorted(set(ours) ^ set(theirs))[:3]
                or [f"{k}: {theirs[k]} vs {ours[k]}" for k in ours if ours[k] != theirs[k]][:3]
            )
            raise ConfigError(
                f"checkpoint {path} holds a different model ({info.get('model', '?')}; "
                f"first differences: {', '.join(map(str, diff))}); resume with the same model "
                "flags, or start fresh with --resume never / another --ckpt-dir"
            )
