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
"""

from __future__ import annotations

import contextlib
import datetime
import json
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
from ddpkit.train.ckpt.compat import (
    MOVED_PARTS,
    check_compatible,
    check_optimizer,
    checksum_problem,
    describe,
    moved_parts,
    plain_values_as_saved,
)
from ddpkit.train.ckpt.files import (
    METADATA,
    is_no_space,
    marker_files,
    no_space_message,
    share,
    unwritable_message,
)
from ddpkit.train.ckpt.layout import (
    ABANDONED_DIR,
    list_checkpoints,
    read_marker,
    step_of,
    verify,
    why_incomplete,
)
from ddpkit.train.ckpt.parts import RngState, Stateful
from ddpkit.train.ckpt.resume_check import first_problem, not_complete
from ddpkit.train.ckpt.store import Remote, is_remote, local_dir, split_step, step_number
from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import CKPT_STEP_PREFIX
from ddpkit.train.errors import ConfigError


def _errors() -> tuple[type[BaseException], ...]:
    """What a save or load can raise: DCP gathers every rank's errors into a
    CheckpointException, a BaseException (imported here: DCP loads on first use)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


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


def _chain(source: Future, target: Future) -> None:
    """Settle `target` as `source` settles."""

    def settle(f: Future) -> None:
        if (e := f.exception()) is not None:
            target.set_exception(e)
        else:
            target.set_result(f.result())

    source.add_done_callback(settle)


class UnusableCheckpoint(Exception):
    """A complete-looking checkpoint that fails verification or loading (message: why)."""


class Checkpointer:
    def __init__(
        self,
        ckpt_dir: str,
        keep: int,
        use_async: bool,
        log: Any,
        timeout: datetime.timedelta | None = None,
    ):
        # A remote dir (s3://...) is staged here and mirrored there (ckpt.store).
        self.remote = Remote(ckpt_dir) if is_remote(ckpt_dir) else None
        self.dir = local_dir(ckpt_dir)
        self.keep = keep
        self.use_async = use_async
        self.log = log
        self.rank = dist.get_rank()
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
        from ddpkit.train.ckpt.io import HashingWriter, UploadingWriter

        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time
        self._join_pruner()
        path = self.dir / f"{CKPT_STEP_PREFIX}{step}"
        problem = None
        if self.rank == 0:
            try:
                if path.is_dir():  # a leftover of an interrupted save (or an older run)
                    shutil.rmtree(path)
                elif path.exists():
                    path.unlink()
                path.mkdir(parents=True)
                if self.remote is not None:  # an interrupted upload of the same step
                    self.remote.clear(path.name)
            except OSError as e:
                problem = unwritable_message(e, path) or (
                    no_space_message(path) if is_no_space(e) else None
                )
                if problem is None:
                    raise
        # Also the barrier before the ranks write into the dir: every rank leaves with rank
        # 0's one line when it cannot make the dir, instead of waiting on it.
        if (problem := first_problem(problem, self.pg)) is not None:
            full = problem.startswith("no space left")  # no_space_message's opening words
            raise (DiskFull if full else CheckpointDirUnwritable)(problem)
        if self.remote is not None:  # node-local staging: every host makes its own
            path.mkdir(parents=True, exist_ok=True)
        # An empty part (a grad scaler never used) has nothing to save and nothing to miss.
        state = {name: sd for name, part in states.items() if (sd := part.state_dict())}
        self._local_bytes = _tensor_bytes(state)
        # each rank checksums its files as it writes them (and uploads them, to a store)
        writer = HashingWriter(path) if self.remote is None else UploadingWriter(path, self.remote)
        if self.use_async and not force_sync:
            self._staging, fut = self._launch(state, writer)
            self._pending = (fut, path, info, t0, writer)
        else:
            self._blocked_s = None  # the whole save blocks
            try:
                dcp.save(state, storage_writer=writer, process_group=self.pg)
                self._finish(path, info, t0, writer.file_sums)
            except _errors() as e:
                self._raise_if_no_space(e, path, _tensor_bytes(state))
                raise
            return time.perf_counter() - t0
        self._blocked_s = time.perf_counter() - t0
        return self._blocked_s

    def _launch(self, state: dict[str, Any], writer: Any) -> tuple[Future, Future]:
        """dcp.async_save, started from the run's launch thread; returns (staged, written).
        It starts the staging copy (the stager's thread) and the write (a thread of DCP's);
        its own Python work (the stager's traversal, making the write's thread) then competes
        with the copy it just started: measured on the loop's thread, 4-6 ms of a 9 ms save()
        (mlp-deep, 2 ranks on 2 cores). Its errors come out of wait_staging() and wait()."""
        import torch.distributed.checkpoint as dcp
        from ddpkit.train.ckpt.staging import mark_taken

        stager = self._get_stager()  # made on the loop's thread (CUDA: its stream)
        mark_taken(stager)  # CUDA: the copy waits for what the loop queued before save()
        staged: Future = Future()
        written: Future = Future()

        def launch() -> None:
            try:
                resp = dcp.async_save(
                    state, storage_writer=writer, process_group=self.pg, async_stager=stager
                )
            except BaseException as e:  # noqa: BLE001 - raised where the futures are awaited
                staged.set_exception(e)
                written.set_exception(e)
                return
            _chain(resp.staging_completion, staged)
            _chain(resp.upload_completion, written)

        if self._launcher is None:
            self._launcher = ThreadPoolExecutor(1, thread_name_prefix="ckpt-launch")
        self._launcher.submit(launch)
        return staged, written

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
        except _errors() as e:
            self._raise_if_no_space(e, path, None)
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
            raise e

    def _finish(self, path: Path, info: dict[str, Any], t0: float, sums: dict) -> None:
        # On rank 0 DCP returns only after gathering every rank's write results (and with
        # them the checksums each rank took while writing) and writing .metadata, so all
        # data is on disk when the marker goes down.
        if self.rank != 0:
            return
        # A stat per file, no data read back; staged for a store, the files are uploaded
        # and gone, and the sums every rank took are the list.
        files = marker_files(path, sums) if self.remote is None else dict(sorted(sums.items()))
        info = {**info, "save_s": round(time.perf_counter() - t0, 3), "time": time.time()}
        info["files"] = files
        tmp = path / (MARKER + ".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        os.replace(tmp, path / MARKER)
        where: Any = path
        if self.remote is not None:  # the marker last: every rank's files are up
            self.remote.upload(path, [MARKER])
            shutil.rmtree(path, ignore_errors=True)
            where = self.remote.where(path.name)
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
        if self.remote is not None:
            self.remote.prune(self.keep)
            return
        complete, partial = list_checkpoints(self.dir)
        newest = step_of(complete[-1]) if complete else -1
        for p in complete[: -self.keep]:
            # The marker first: a deletion cut short leaves an incomplete dir, never a
            # complete-looking one with files missing.
            with contextlib.suppress(OSError):
                (p / MARKER).unlink()
            shutil.rmtree(p, ignore_errors=True)
        for p in partial:  # interrupted saves older than a complete one are garbage
            if (step_of(p) or 0) < (newest or 0):
                shutil.rmtree(p, ignore_errors=True)

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

    def _resume(self, resume: str, states: dict[str, Stateful]) -> tuple[Path, dict] | None:
        """Load the checkpoint to resume from into `states`; returns (path, its marker info),
        or None for a fresh start. `auto`: the newest complete checkpoint that verifies and
        loads, falling back to older ones with a warning naming what was wrong; a PATH that
        does not: ConfigError. Every rank takes the same decision (rank 0 verifies the files
        and broadcasts; load failures are agreed by an all-reduce)."""
        if resume == "never":
            return None
        if self.remote is not None and resume == "auto":
            return self._resume_remote(states)
        if is_remote(resume):  # one step of a store (checked by check_resume_path)
            got = split_step(resume)
            assert got is not None
            return self._resume_remote(states, *got)
        if resume != "auto":
            path = Path(resume)
            if (why := why_incomplete(path)) is not None:
                raise ConfigError(not_complete(resume, why))
            candidates = [path]
        else:
            complete, partial = list_checkpoints(self.dir)
            newest = step_of(complete[-1]) if complete else -1
            for p in partial:  # an interrupted save, or a marker found damaged
                if (step_of(p) or 0) > (newest or -1):
                    self.log(f"warning: skipping incomplete checkpoint {p} ({why_incomplete(p)})")
            candidates = complete[::-1]
        for path in candidates:
            try:
                info = self.load(path, states)
            except UnusableCheckpoint as e:
                if resume != "auto":
                    raise ConfigError(
                        f"--resume {resume}: unusable checkpoint ({e}); pass another step-N "
                        "directory, or --resume auto to take the newest one that loads"
                    ) from None
                self.log(f"warning: skipping checkpoint {path}: {e}; trying the next older one")
                continue
            if resume != "auto":
                self._set_aside_later_than(path)
            return path, info
        if candidates:
            raise ConfigError(
                f"no usable checkpoint in {self.dir}: all {len(candidates)} complete ones fail "
                "verification or loading (warnings above); move them aside, or start over "
                "with --resume never or another --ckpt-dir"
            )
        return None

    def _resume_remote(
        self, states: dict[str, Stateful], remote: Remote | None = None, step: str | None = None
    ) -> tuple[str, dict] | None:
        """--resume auto from a store: the newest complete step that downloads, verifies and
        loads (older ones after it with a warning), as a local resume; --resume URL (`remote`
        and its `step`): that step or one line."""
        remote = remote or self.remote
        assert remote is not None
        if step is not None:
            got = self._load_remote(states, remote, step)
            if isinstance(got, str):
                raise ConfigError(
                    f"--resume {remote.where(step)}: unusable checkpoint ({got}); pass another "
                    "step-N URL, or --resume auto to take the newest one that loads"
                )
            if self.remote is not None and remote.url == self.remote.url:
                self._set_aside_later_in_store(step)
            return remote.where(step), got
        complete, partial = remote.scan() if self.rank == 0 else ([], {})
        box = [(complete, partial)]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        complete, partial = box[0]
        newest = step_number(complete[-1]) if complete else -1
        for name, why in partial.items():
            if (step_number(name) or 0) > (newest or -1):
                self.log(f"warning: skipping incomplete checkpoint {remote.where(name)} ({why})")
        for name in complete[::-1]:
            got = self._load_remote(states, remote, name)
            if isinstance(got, str):
                self.log(
                    f"warning: skipping checkpoint {remote.where(name)}: {got}; trying the "
                    "next older one"
                )
                continue
            return remote.where(name), got
        if complete:
            raise ConfigError(
                f"no usable checkpoint in {remote.url}: all {len(complete)} complete ones "
                "fail verification or loading (warnings above); delete them, or start over "
                "with --resume never or another --ckpt-dir"
            )
        return None

    def _load_remote(self, states: dict[str, Stateful], remote: Remote, name: str) -> dict | str:
        """Fetch a store's step into the staging dir and load it: its marker info, or why it
        is unusable (agreed by every rank); the copy is deleted either way."""
        # One copy per node: torchrun's node rank too, since nodes may share a host name and
        # a temp dir (the local SLURM cluster's do).
        node = f"{socket.gethostname()}-{os.environ.get('GROUP_RANK', '0')}"
        copy = self.dir / f".fetched-{node}" / name
        # One process on this host: its data files are read as they arrive, not downloaded
        # first (several share one download: each would fetch what it reads).
        stream = os.environ.get("LOCAL_WORLD_SIZE", "1") == "1" and hasattr(remote.fs, "_call_s3")
        try:
            self._agree(self._fetch(remote, name, copy, stream))
            return self.load(copy, states, (remote, name) if stream else None)
        except UnusableCheckpoint as e:
            return str(e)
        finally:
            dist.barrier(group=self.pg)
            if _local_rank(self.rank) == 0:
                shutil.rmtree(copy.parent, ignore_errors=True)

    def _fetch(self, remote: Remote, name: str, copy: Path, stream: bool = False) -> str | None:
        """Download a step into `copy`, once per host (its local rank 0); the problem, if
        any (the caller agrees on it: also the barrier before the other ranks read).
        `stream`: only .metadata and the marker; the data files' sizes are checked in the
        store (the load reads them from there)."""
        if _local_rank(self.rank) != 0:
            return None
        shutil.rmtree(copy, ignore_errors=True)
        info, why = remote.marker(name)
        if info is None:
            return why
        files = info.get("files") or {}
        try:
            if stream:
                sizes = remote.sizes(name)
                for file, rec in sorted(files.items()):
                    if file not in sizes:
                        return f"{file} is missing"
                    if sizes[file] != rec.get("bytes"):
                        return f"{file} has {sizes[file]} bytes, {rec.get('bytes')} were written"
            remote.download(name, copy, [METADATA] if stream and files else sorted(files))
        except Exception as e:
            return f"download failed ({describe(e)})"
        return None

    def _set_aside_later_than(self, path: Path) -> None:
        """A rewind (--resume of an older step of this checkpoint dir) starts a new timeline:
        the later checkpoints of the old one move to ABANDONED_DIR, so keep-K never prunes
        this run's saves in their favour and a later --resume auto never jumps back to them.
        Said in one line; nothing is deleted."""
        step = step_of(path)
        if step is None or path.resolve().parent != self.dir.resolve():
            return
        later = [p for p in list_checkpoints(self.dir)[0] if (step_of(p) or -1) > step]
        if not later:
            return
        aside = self.dir / ABANDONED_DIR
        if self.rank == 0:
            aside.mkdir(exist_ok=True)
            for p in later:
                p.rename(aside / f"{p.name}.{int(time.time())}")
        self.log(
            f"rewound to {path.name}: the later {', '.join(p.name for p in later)} (another "
            f"timeline) moved to {aside}; --resume auto will not go back to them"
        )
        dist.barrier(group=self.pg)  # every rank sees the new timeline before its first save

    def _set_aside_later_in_store(self, step: str) -> None:
        """_set_aside_later_than for a store: rank 0 moves the old timeline's later complete
        steps under `<url>/ABANDONED_DIR/` (copied, then deleted marker first), every rank
        learns which, and the rewind is said in one line."""
        remote = self.remote
        assert remote is not None
        later: list[str] = []
        if self.rank == 0:
            n = step_number(step) or 0
            later = [s for s in remote.scan()[0] if (step_number(s) or -1) > n]
            stamp = int(time.time())
            for name in later:
                remote.set_aside(name, f"{ABANDONED_DIR}/{name}.{stamp}")
        box = [later]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        if box[0]:
            self.log(
                f"rewound to {step}: the later {', '.join(box[0])} (another timeline) moved to "
                f"{remote.where(ABANDONED_DIR)}; --resume auto will not go back to them"
            )

    def newest(self) -> str | None:
        """The newest complete checkpoint as the user names it (a step dir, or a store's
        step URL), None when there is none."""
        if self.remote is not None:
            complete = self.remote.scan()[0]
            return self.remote.where(complete[-1]) if complete else None
        complete = list_checkpoints(self.dir)[0]
        return str(complete[-1]) if complete else None

    def holds(self, path: str | Path) -> bool:
        """Whether a checkpoint resumed from is one of this dir's (else the run's first save
        writes its step here anew)."""
        if self.remote is not None:
            return str(path).startswith(f"{self.remote.url}/")
        if is_remote(path):  # a store's step resumed into a local dir
            return False
        return Path(path).parent.resolve() == self.dir.resolve()

    def _agree(self, problem: str | None) -> None:
        """Raise UnusableCheckpoint on every rank when any rank has a problem."""
        if (first := first_problem(problem, self.pg)) is not None:
            raise UnusableCheckpoint(first)

    def load(
        self, path: Path, states: dict[str, Stateful], remote: tuple[Remote, str] | None = None
    ) -> dict[str, Any]:
        """Check, then load every part in place, verifying checksums while reading; returns
        the checkpoint's marker info. UnusableCheckpoint (on every rank) when the files or
        the load fail. Before the load each rank checks that its share of the files is there
        with its size (a stat) and rank 0 hashes .metadata; during it each rank hashes its
        share: about 1/world of the bytes per rank, whatever the world."""
        import torch.distributed.checkpoint as dcp
        from ddpkit.train.ckpt.io import VerifyingReader

        world = dist.get_world_size(self.pg)
        # from a store (`remote`: its step): the data files there, their sizes checked by _fetch
        self._agree(verify(path, self.rank, world, read=False, data=remote is None))
        info = read_marker(path) or {}
        meta = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
        present = {k.split(".", 1)[0] for k in meta}
        state = {n: p.state_dict() for n, p in states.items() if n in present}
        old_keys = plain_values_as_saved(states, state, meta)
        moved = moved_parts(states, state, meta, present)
        if "model" in state:
            check_compatible(path, state["model"], meta, info)
        if "optim" in state:
            check_optimizer(path, state["optim"], meta, info)
        rng = next((n for n, p in states.items() if isinstance(p, RngState)), None)
        if rng in state and f"{rng}.{states[rng].key}" not in meta:  # type: ignore[attr-defined]
            del state[rng]  # the world grew: this rank has no saved RNG state
        missing = [n for n, p in states.items() if n not in present | moved and p.state_dict()]
        missing += old_keys
        if missing and self.rank == 0:
            self.log(
                f"warning: checkpoint {path} has no {', '.join(missing)} (written before "
                f"{'it was' if len(missing) == 1 else 'they were'} checkpointed): fresh values kept"
            )
        problem = None
        sizes = {n: rec.get("bytes", 0) for n, rec in (info.get("files") or {}).items()}
        opener = (
            (lambda f, r=remote[0], n=remote[1]: r.open_download(n, f, sizes[f]))
            if remote is not None
            else None
        )
        reader = VerifyingReader(path, share(info, self.rank, world), opener)
        try:
            dcp.load(state, storage_reader=reader, process_group=self.pg)
        # DCP gathers every rank's read errors into a CheckpointException (a BaseException)
        # raised on all ranks; the all-reduce in _agree covers a rank that failed alone.
        # A checksum failure can leave damaged bytes in the parts: the older checkpoint
        # tried next overwrites them, as after any failed load.
        except _errors() as e:
            problem = checksum_problem(e) or f"load failed ({describe(e)})"
        self._agree(problem)
        for name in moved:  # read from where an older version kept it
            src, keys = MOVED_PARTS[name]
            states[name].load_state_dict({k: state[src].pop(k) for k in keys})
        for name, sd in state.items():
            states[name].load_state_dict(sd)
        return info
