"""Distributed Checkpoint (DCP) behind one manager: save, async save, resume, keep-K.

Layout: <ckpt_dir>/step-<N>/ holds DCP's files; `.complete` (JSON, written last by rank 0
once every rank's data and DCP's `.metadata` are on disk, with the size and CRC-32 of every
file, which each rank took while writing its files: ddpkit.train.ckpt.io) is what makes it
count. A directory without it is a save that was interrupted: skipped with a warning, never
loaded. A complete one that fails its checksums (each rank verifies its share of the files
while loading them), its metadata or its load is skipped for the next older one, with a
warning saying what was wrong.

What goes in: a dict of named stateful parts (anything with state_dict/load_state_dict),
each saved under its name: the model and the optimizer (sharded under FSDP through
get_*_state_dict, so the same checkpoint loads under another world size or strategy), the
train state, the sampler, every rank's RNG state under its own key, the fp16 grad scaler,
and any object a user adds. A part that an older checkpoint lacks keeps its fresh value.
DCP metadata is pickled: load checkpoints only from storage you trust.

Where the steps live is the store's business (ckpt.store's CheckpointStorage, chosen by the
checkpoint dir's URL scheme): this module writes, agrees and loads the same way for each.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddpkit.train import goodput
from ddpkit.train.ckpt.compat import describe
from ddpkit.train.ckpt.files import is_no_space, no_space_message, unwritable_message
from ddpkit.train.ckpt.layout import ABANDONED_DIR, list_checkpoints, step_of
from ddpkit.train.ckpt.load import UnusableCheckpoint, agree, dcp_errors, load_step
from ddpkit.train.ckpt.parts import Stateful
from ddpkit.train.ckpt.resume_check import first_problem, not_complete
from ddpkit.train.ckpt.store import (
    LOST_HEAD,
    STORE_LOG,
    StoreLost,
    keep_traceback,
    lost_line,
    open_store,
    step_at,
    step_number,
    unreachable,
)
from ddpkit.train.contract import CKPT_STEP_PREFIX, is_remote
from ddpkit.train.errors import ConfigError


def _local_rank(rank: int) -> int:
    """This process's rank on its host (torchrun's LOCAL_RANK; the rank without it)."""
    try:
        return int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        return rank


class DiskFull(ConfigError):
    """No space left for a checkpoint: one line (where, free, needed), exit 2."""


class CheckpointDirUnwritable(ConfigError):
    """The checkpoint dir refuses writes (read-only, permissions): one line, exit 2."""


def _tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tensor_bytes(v) for v in tree)
    return 0


class Checkpointer:
    def __init__(
        self,
        ckpt_dir: str,
        keep: int,
        use_async: bool,
        log: Any,
        timeout: datetime.timedelta | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ):
        self.store = open_store(ckpt_dir)  # by the dir's URL scheme (ckpt.store)
        self.dir = self.store.dir  # this host's step dirs: written here, read copies here
        self.keep = keep
        self.use_async = use_async
        self.log = log
        self.rank = dist.get_rank()
        # A store that goes away mid-run is said in one line; its tracebacks go here.
        self.lost_log = Path(run_dir) / STORE_LOG if run_dir is not None else None
        self._last: str | None = None  # the newest complete checkpoint this run knows of
        # Checkpoint collectives get their own gloo group: an async save talks from a
        # background thread while training collectives run on the default group. A new
        # group does not inherit the default group's timeout (torch gives it 30 min): with
        # the job's own, a rank that stops mid-save is named within --timeout-s.
        self.pg = dist.new_group(backend="gloo", timeout=timeout)
        self._pending: tuple[Any, Path, dict[str, Any], float, Any] | None = None
        self._staging: Future | None = None  # an async save's staging copy still running
        self._stager: Any = None
        self._launcher: ThreadPoolExecutor | None = None  # starts dcp.async_save (_launch)
        self._local_bytes = 0  # this rank's tensor bytes in the last save
        self._finisher: tuple[threading.Thread, Path] | None = None  # rank 0: marker thread
        self._finisher_error: BaseException | None = None
        self._pruner: threading.Thread | None = None  # rank 0: deletes what keep-K drops
        # An async save's blocking part (goodput): save() returning, plus the loop's waits
        # for it later (wait_staging(); wait() when the write was still going).
        self._blocked_s: float | None = None

    # --- save ----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        states: dict[str, Stateful],
        info: dict[str, Any],
        force_sync: bool = False,
    ) -> float:
        """Write step-<step> from every part's state_dict(); returns the seconds the caller
        was blocked."""
        # DCP is imported on first use: ~1.2 s per rank that a run's first step need not wait.
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        self._join_pruner()
        path = self.dir / f"{CKPT_STEP_PREFIX}{step}"
        problem = None
        if self.rank == 0:
            try:
                self.store.prepare(path.name)
            except Exception as e:
                problem = (
                    unwritable_message(e, path)
                    or (no_space_message(path) if is_no_space(e) else None)
                    or self._lost(e, f"the save of step {step}")
                )
                if problem is None:
                    raise
        # Also the barrier before the ranks write into the dir: every rank leaves with rank
        # 0's one line when it cannot make the dir, instead of waiting on it.
        if (problem := first_problem(problem, self.pg)) is not None:
            if problem.startswith(LOST_HEAD):
                raise StoreLost(problem)
            full = problem.startswith("no space left")  # no_space_message's opening words
            raise (DiskFull if full else CheckpointDirUnwritable)(problem)
        path.mkdir(parents=True, exist_ok=True)  # a store's staging is per host: each makes it
        # An empty part (a grad scaler never used) has nothing to save and nothing to miss.
        state = {name: sd for name, part in states.items() if (sd := part.state_dict())}
        self._local_bytes = _tensor_bytes(state)
        # each rank checksums its files as it writes them (and uploads them, to a store)
        writer = self.store.writer(path)
        if self.use_async and not force_sync:
            self._staging, fut = self._launch(state, writer)
            self._pending = (fut, path, info, t0, writer)
        else:
            self._blocked_s = None  # the whole save blocks
            try:
                dcp.save(state, storage_writer=writer, process_group=self.pg)
                self._finish(path, info, t0, writer.file_sums)
            except dcp_errors() as e:
                self._raise_if_no_space(e, path, _tensor_bytes(state))
                self._raise_if_lost(e, path)
                raise
            return time.perf_counter() - t0
        self._blocked_s = time.perf_counter() - t0
        return self._blocked_s

    def _launch(self, state: dict[str, Any], writer: Any) -> tuple[Future, Future]:
        """dcp.async_save on the run's launch thread (ckpt.staging.start_async_save): the
        futures of the staging copy and of the write."""
        from ddpkit.train.ckpt.staging import start_async_save

        stager = self._get_stager()  # made on the loop's thread (CUDA: its stream)
        if self._launcher is None:
            self._launcher = ThreadPoolExecutor(1, thread_name_prefix="ckpt-launch")
        return start_async_save(self._launcher, stager, state, writer, self.pg)

    def _raise_if_no_space(self, e: BaseException, path: Path, local: int | None) -> None:
        """A full disk: the partial step dir goes (it only takes space), DiskFull says where,
        how much is free and how much a checkpoint needs (the last one's size, else at
        least this rank's state). A dir that refuses writes: CheckpointDirUnwritable."""
        if (msg := unwritable_message(e, path)) is not None:
            if self.rank == 0:  # what a refused save got down, where the filesystem lets it
                shutil.rmtree(path, ignore_errors=True)
            raise CheckpointDirUnwritable(msg) from None
        complete, _ = list_checkpoints(self.dir)
        share = local or self._local_bytes
        needed = sum(f.stat().st_size for f in complete[-1].iterdir()) if complete else share
        # torch.save reports a full disk as "unexpected pos N vs M" (no errno), so a failed
        # write counts as a full disk also when less than this rank's share is free.
        try:
            free = shutil.disk_usage(path if path.exists() else self.dir).free
        except OSError:
            free = None
        if not is_no_space(e) and not (free is not None and share and free < share):
            return
        if self.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        raise DiskFull(no_space_message(path, needed)) from None

    def _get_stager(self) -> Any:
        """One stager for the whole run: its host buffers are allocated by the first async
        save and reused by the next ones (measured on CPU: the loop's blocked time fell from
        0.20 s to 0.09 s for 161 MB per rank). The copy runs in the stager's thread, GIL
        released (ckpt.staging), beside the next step's forward/backward; on CUDA into pinned
        memory. wait_staging() fences it before the optimizer changes the parameters."""
        if self._stager is None:
            from ddpkit.train.ckpt.staging import background_stager

            self._stager = background_stager(torch.cuda.is_available())
        return self._stager

    def wait_staging(self) -> None:
        """Call before the optimizer step: the staged copy must be taken from the weights
        of the step it belongs to. What it waits counts as the save's blocking time."""
        if self._staging is not None:
            t0 = time.perf_counter()
            self._staging.result()
            self._staging = None
            self._add_blocked(time.perf_counter() - t0)

    def _add_blocked(self, seconds: float) -> None:
        if self._blocked_s is not None:
            self._blocked_s += seconds

    def close(self) -> None:
        self.wait()
        self._join_pruner()
        if self._launcher is not None:
            self._launcher.shutdown()
            self._launcher = None
        if self._stager is not None:
            from ddpkit.train.ckpt.staging import release_stager

            release_stager(self._stager)
            self._stager = None

    @property
    def in_flight(self) -> int | None:
        """The step of the async save still running, if any."""
        return None if self._pending is None else step_of(self._pending[1])

    def poll(self) -> None:
        """Mark a finished async save complete (cheap; call at step boundaries)."""
        if self._pending is not None and self._pending[0].done():
            self.wait(background=True)

    def wait(self, background: bool = False) -> None:
        """Finish the async save in flight. `background`: rank 0's marker is written and the
        old checkpoints pruned by a thread (deleting a checkpoint's files takes a while on
        some filesystems), joined by the next wait() or close()."""
        self._join_finisher()
        if self._pending is None:
            return
        fut, path, info, t0, writer = self._pending
        self._pending = None
        try:
            self.wait_staging()
            t_write = time.perf_counter()
            fut.result()
            self._add_blocked(time.perf_counter() - t_write)  # ~0 when polled done
            if not (background and self.rank == 0):
                self._finish(path, info, t0, writer.file_sums)
        except dcp_errors() as e:
            self._raise_if_no_space(e, path, None)
            self._raise_if_lost(e, path)
            raise
        if background and self.rank == 0:
            thread = threading.Thread(
                target=self._finish_in_thread, args=(path, info, t0, writer.file_sums), daemon=True
            )
            self._finisher = (thread, path)
            thread.start()

    def _finish_in_thread(self, path: Path, info: dict[str, Any], t0: float, sums: dict) -> None:
        try:
            self._finish(path, info, t0, sums)
        except BaseException as e:  # re-raised on the training thread by _join_finisher
            self._finisher_error = e

    def _join_finisher(self) -> None:
        if self._finisher is None:
            return
        thread, path = self._finisher
        self._finisher = None
        thread.join()
        e, self._finisher_error = self._finisher_error, None
        if e is not None:
            self._raise_if_no_space(e, path, None)
            self._raise_if_lost(e, path)
            raise e

    def _finish(self, path: Path, info: dict[str, Any], t0: float, sums: dict) -> None:
        # On rank 0 DCP returns only after gathering every rank's write results (and with
        # them the checksums each rank took while writing) and writing .metadata, so all
        # data is on disk (or in the store) when the marker goes down.
        if self.rank != 0:
            return
        info = {**info, "save_s": round(time.perf_counter() - t0, 3), "time": time.time()}
        where = self.store.commit(path, info, sums)
        self._last = str(where)
        self.log(f"checkpoint saved: {where} ({info['save_s']:.2f} s)")
        blocked = info["save_s"] if self._blocked_s is None else self._blocked_s
        goodput.note("save", step=step_of(path), blocking_s=round(blocked, 3))
        # Deleting the checkpoints keep-K drops (~0.2 s per 160 MB measured here) need not
        # block the loop: a thread does it, joined by the next save or close(); not a
        # daemon, so an exit without close() still finishes it (torchtitan purges so too).
        self._join_pruner()
        self._pruner = threading.Thread(target=self._prune, name="ckpt-prune")
        self._pruner.start()

    def _join_pruner(self) -> None:
        if self._pruner is not None:
            self._pruner.join()
            self._pruner = None

    def _prune(self) -> None:
        try:
            self.store.prune(self.keep)
        except Exception as e:
            # A store gone away: quiet here (its traceback to the log); the next save that
            # reaches it says so in one line, or prunes what this one left.
            if unreachable(e) is None:
                raise
            keep_traceback(self.lost_log, self.rank, e, "keep-K's prune")

    # --- a store that went away ----------------------------------------------------------

    def _lost(self, e: BaseException, what: str) -> str | None:
        """The one line for a store that stopped answering during `what` (its traceback to
        the run dir's log); None when `e` is another failure."""
        cause = unreachable(e)
        if cause is None:
            return None
        keep_traceback(self.lost_log, self.rank, e, what)
        return lost_line(self.store.url, what, cause, self._last, self.lost_log)

    def _raise_if_lost(self, e: BaseException, path: Path) -> None:
        if (line := self._lost(e, f"the save of step {step_of(path)}")) is not None:
            raise StoreLost(line) from None

    def _on_rank0(self, fn: Any, what: str) -> Any:
        """fn() on rank 0 (a store's listing or move), its result on every rank; a store
        that does not answer is StoreLost on every rank."""
        got, lost = None, None
        if self.rank == 0:
            try:
                got = fn()
            except Exception as e:
                if (lost := self._lost(e, what)) is None:
                    raise
        box = [(got, lost)]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        got, lost = box[0]
        if lost is not None:
            raise StoreLost(lost)
        return got

    # --- resume --------------------------------------------------------------------------

    def resume(self, resume: str, states: dict[str, Stateful]) -> tuple[Path, dict] | None:
        """_resume, noted for goodput: training is ready from here (rank 0 notes it)."""
        t0 = time.perf_counter()
        got = self._resume(resume, states)
        if self.rank == 0:
            step = step_of(got[0]) if got else 0
            # --resume never on the job's first start: a new run, even in a reused run dir
            fresh = resume == "never" and goodput.first_start()
            goodput.note("ready", step=step, load_s=round(time.perf_counter() - t0, 3), fresh=fresh)
        return got

    def _resume(
        self, resume: str, states: dict[str, Stateful]
    ) -> tuple[str | os.PathLike[str], dict] | None:
        """Load the checkpoint to resume from into `states`; returns (its step as the store
        names it, its marker info), or None for a fresh start. `auto`: the newest complete
        checkpoint that verifies and loads, falling back to older ones with a warning naming
        what was wrong; a PATH (a step dir, a store's step URL) that does not: ConfigError.
        Every rank takes the same decision (rank 0 lists the store and broadcasts; fetch and
        load failures are agreed by an all-reduce)."""
        if resume == "never":
            return None
        if resume != "auto":
            return self._resume_from(resume, states)
        store = self.store
        complete, partial = self._on_rank0(store.scan, "the listing of its checkpoints")
        newest = step_number(complete[-1]) if complete else -1
        for name, why in partial.items():  # an interrupted save, or a marker found damaged
            if (step_number(name) or 0) > (newest or -1):
                self.log(f"warning: skipping incomplete checkpoint {store.where(name)} ({why})")
        for name in complete[::-1]:
            got = self._load_step(states, store, name)
            if isinstance(got, str):
                self.log(
                    f"warning: skipping checkpoint {store.where(name)}: {got}; trying the "
                    "next older one"
                )
                continue
            self._last = str(store.where(name))
            return store.where(name), got
        if complete:
            raise ConfigError(
                f"no usable checkpoint in {store.url}: all {len(complete)} complete ones fail "
                f"verification or loading (warnings above); {store.drop_hint}, or start over "
                "with --resume never or another --ckpt-dir"
            )
        return None

    def _resume_from(
        self, resume: str, states: dict[str, Stateful]
    ) -> tuple[str | os.PathLike[str], dict]:
        """--resume PATH (checked by check_resume_path at start-up): that step or one line.
        A step of this checkpoint dir rewinds it: the later steps are set aside."""
        store, name = step_at(resume)
        why = self._on_rank0(lambda: store.marker(name)[1], f"the read of {name}")
        if why is not None:
            raise ConfigError(not_complete(resume, why))
        got = self._load_step(states, store, name)
        if isinstance(got, str):
            raise ConfigError(
                f"--resume {resume}: unusable checkpoint ({got}); pass another step-N "
                f"{'URL' if is_remote(resume) else 'directory'}, or --resume auto to take "
                "the newest one that loads"
            )
        where = store.where(name)
        if self.store.holds(where):
            self._last = str(where)
            self._set_aside_later_than(name)
        return where, got

    def _load_step(self, states: dict[str, Stateful], store: Any, name: str) -> dict | str:
        """Read a store's step (a store's copy is made once per host) and load it: its
        marker info, or why it is unusable (agreed by every rank); a copy is deleted either
        way. A store that stops answering is StoreLost on every rank."""
        # One copy per node: torchrun's node rank too, since nodes may share a host name and
        # a temp dir (the local SLURM cluster's do).
        node = f"{socket.gethostname()}-{os.environ.get('GROUP_RANK', '0')}"
        dest = self.dir / f".fetched-{node}" / name
        here = _local_rank(self.rank) == 0
        read, problem = None, None
        try:
            read = store.read(name, dest, here)
            problem = read.problem
        except Exception as e:  # only where `here`: the others send no request
            problem = self._lost(e, f"the read of {name}") or f"download failed ({describe(e)})"
        try:
            agree(problem, self.pg)  # also the barrier before the other ranks read the copy
            assert read is not None
            return self.load(read.path, states, read.open)
        except UnusableCheckpoint as e:
            if str(e).startswith(LOST_HEAD):
                raise StoreLost(str(e)) from None
            return str(e)
        finally:
            dist.barrier(group=self.pg)
            if here:
                shutil.rmtree(dest.parent, ignore_errors=True)

    def _set_aside_later_than(self, name: str) -> None:
        """A rewind (--resume of an older step of this checkpoint dir) starts a new timeline:
        rank 0 moves the later complete steps of the old one under ABANDONED_DIR, so keep-K
        never prunes this run's saves in their favour and a later --resume auto never jumps
        back to them. Every rank learns which; said in one line; nothing is deleted."""
        step = step_number(name)
        if step is None:
            return

        def move() -> list[str]:
            later = [s for s in self.store.scan()[0] if (step_number(s) or -1) > step]
            stamp = int(time.time())
            for s in later:
                self.store.set_aside(s, f"{ABANDONED_DIR}/{s}.{stamp}")
            return later

        later = self._on_rank0(move, f"the rewind to {name}")
        if later:  # every rank sees the new timeline before its first save
            self.log(
                f"rewound to {name}: the later {', '.join(later)} (another timeline) moved to "
                f"{self.store.where(ABANDONED_DIR)}; --resume auto will not go back to them"
            )

    def newest(self) -> str | None:
        """The newest complete checkpoint as the user names it (a step dir, or a store's
        step URL), None when there is none."""
        complete = self.store.scan()[0]
        return str(self.store.where(complete[-1])) if complete else None

    def holds(self, path: str | os.PathLike[str]) -> bool:
        """Whether a checkpoint resumed from is one of this dir's (else the run's first save
        writes its step here anew)."""
        return self.store.holds(path)

    def load(
        self, path: Path, states: dict[str, Stateful], open_data: Any = None
    ) -> dict[str, Any]:
        """Load the step dir `path` into `states` (ckpt.load.load_step); its marker info."""
        return load_step(path, states, self.pg, self.log, open_data)
