"""Where checkpoints live: one interface (CheckpointStorage) the manager asks, and the stores
that answer it, chosen by the checkpoint dir's URL scheme (`open_store`): a local directory
(ckpt.localstore) or an object store named by an fsspec URL, `s3://bucket/prefix`
(ckpt.objstore; s3fs serves S3 and S3-compatible servers). A new kind of store is one class
and one `register(scheme, ...)` line; the manager never asks which store it has.

What every store keeps the same: a checkpoint is a step-N entry whose marker (written last,
with every file's size and CRC-32) and DCP's `.metadata` make it complete; keep-K drops a
step's marker first; a rewind moves the later steps under `abandoned/`. A step is written
into a local dir (`dir/step-N`: the checkpoint dir itself, or a store's node-local staging
dir) by the store's DCP writer and counts once `commit` has put its marker down; a load
reads `read`'s local copy (a store may serve the data files straight from itself).

A store that stops answering mid-run (a server gone, a network cut) is StoreLost: one line
naming the store and what the kit does (`lost_line`), its tracebacks kept in the run dir;
the worker tells the launcher (train/failure.py's "store lost") and a restart waits for the
store (`check_ckpt_dir`). Credentials and the endpoint come from the environment the way
every AWS client reads them (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL,
AWS_PROFILE, ...): the kit never writes them anywhere and no message names them. Torch-free:
the renders and `ddpkit ckpt` import it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ddpkit.train.contract import CKPT_MARKER as MARKER
from ddpkit.train.contract import CKPT_STEP_PREFIX, is_remote
from ddpkit.train.errors import ConfigError

STAGE_ENV = "DDPKIT_CKPT_STAGE"  # where a remote checkpoint dir is staged (default: tmp)
# How long a restarted worker waits for a store that went away (it answered at the first
# start, so it is expected back: a server restarted, a network healed), in seconds.
STORE_WAIT_ENV = "DDPKIT_STORE_WAIT_S"
STORE_WAIT_S = 300.0
STORE_LOG = "store-errors.log"  # in the run dir: the tracebacks of a store that went away
# What S3 clients read from the environment: a container backend passes these by name from the
# submitting shell (never their values into a rendered command or manifest).
CREDENTIAL_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


@dataclass
class StepRead:
    """A step ready for a load: `path`, a local dir with at least its marker and .metadata;
    `open(file, size)`, a read stream of one of its data files when the load reads them from
    the store as they arrive (None: they are in `path`); `problem`, why the step cannot be
    read (None: it can), said by the process that made the host's copy."""

    path: Path
    open: Callable[[str, int], Any] | None = None
    problem: str | None = None


@runtime_checkable
class CheckpointStorage(Protocol):
    """What the checkpoint manager asks of the place its checkpoints live. Step names are
    `step-N`; `dir` is this host's local dir a step is written into (and read copies go
    under); every method that talks to the store may raise its client's errors."""

    url: str  # the checkpoint dir as messages name it
    dir: Path  # this host's dir of steps being written: the checkpoint dir, or a staging dir
    drop_hint: str  # what to do with checkpoints none of which loads ("delete them")

    def where(self, name: str) -> str | Path:
        """A step as messages, summary.json and --resume name it."""
        ...

    def holds(self, where: str | Path) -> bool:
        """Whether a step named as `where` names it is one of this store's."""
        ...

    def check(self, wait_s: float = 0.0) -> str | None:
        """Before training: None when the store takes a write and a delete, else one line
        naming the problem and the fix. `wait_s`: how long to keep asking a store that does
        not answer (a restart after it went away)."""
        ...

    def problem(self, e: BaseException, what: str = "", access: str = "read") -> str:
        """One line for a failed request (credentials refused, no bucket, no server)."""
        ...

    def scan(self) -> tuple[list[str], dict[str, str]]:
        """(complete step names oldest first, {incomplete step name: why})."""
        ...

    def marker(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the step's marker, None) if the step is complete, else (None, why not)."""
        ...

    def prepare(self, name: str) -> None:
        """Rank 0, before a save: `dir/name` exists and is empty, and no leftover of step
        `name` (an interrupted save's, an older timeline's) is in the store."""
        ...

    def writer(self, path: Path) -> Any:
        """The DCP storage writer of the step dir `path` (ckpt.io's HashingWriter or one
        built on it: it keeps each file's size and CRC-32 in `file_sums`)."""
        ...

    def commit(self, path: Path, info: dict[str, Any], sums: dict[str, Any]) -> str | Path:
        """Rank 0, once every rank's files are in: the step's marker, `info` with the file
        records (from `sums`, the writers' gathered ones) under "files", goes down last;
        from here on the step counts. Returns the step as `where` names it."""
        ...

    def read(self, name: str, dest: Path, here: bool, whole: bool = False) -> StepRead:
        """Step `name` ready for a load. A store that copies puts the copy in `dest`, only
        where `here` (one process per host makes it; the caller deletes dest's parent once
        every rank loaded); `whole`: every data file too, for a tool's verified copy."""
        ...

    def prune(self, keep: int) -> None:
        """Keep the newest `keep` complete steps (each dropped marker first); drop the
        incomplete ones older than the newest complete one."""
        ...

    def set_aside(self, name: str, aside: str) -> None:
        """Move a step under the name `aside` (`abandoned/step-N.<time>`), where no scan
        finds it; cut short, nothing is lost."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """One small object beside the steps (the run's summary.json, for a store that
        outlives the run dir), or nothing where the run dir keeps it."""
        ...


# --- choosing a store: by the checkpoint dir's URL scheme ------------------------------------

# scheme -> the store's class (or "module:Class", imported when first used: the object store
# pulls in fsspec). "" is a local path; any other scheme is fsspec's (_ANY_URL).
_STORES: dict[str, Any] = {"": "ddpkit.train.ckpt.localstore:LocalStore"}
_ANY_URL = "ddpkit.train.ckpt.objstore:ObjectStore"


def register(scheme: str, store: Any) -> None:
    """Serve `scheme://...` checkpoint dirs with `store`: a class (or "module:Class") whose
    instances, built from the URL, are CheckpointStorage."""
    _STORES[scheme] = store


def open_store(ckpt_dir: str | os.PathLike[str]) -> CheckpointStorage:
    """The store of a checkpoint dir as the user named it (a path or a URL)."""
    text = str(ckpt_dir)
    scheme = text.split("://", 1)[0] if is_remote(text) else ""
    factory = _STORES.get(scheme, _ANY_URL)
    if isinstance(factory, str):
        module, _, name = factory.partition(":")
        factory = getattr(importlib.import_module(module), name)
    return factory(text)


def step_at(where: str | os.PathLike[str]) -> tuple[CheckpointStorage, str]:
    """The store holding a step named as the user names it (a step dir, a step URL), and
    the step's name in it."""
    text = str(where)
    if is_remote(text):
        parent, _, name = text.rstrip("/").rpartition("/")
        return open_store(parent), name
    path = Path(text)
    return open_store(path.parent), path.name


def split_step(url: str) -> tuple[CheckpointStorage, str] | None:
    """(the store, the step name) of a store's step URL (`s3://b/run/step-40`), else None."""
    parent, _, name = url.rstrip("/").rpartition("/")
    if step_number(name) is None or not is_remote(parent):
        return None
    return open_store(parent), name


def step_number(name: str) -> int | None:
    rest = name[len(CKPT_STEP_PREFIX) :] if name.startswith(CKPT_STEP_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


def local_dir(ckpt_dir: str | os.PathLike[str]) -> Path:
    """The directory on this machine that holds the checkpoints: the dir itself, or a
    remote one's staging dir (STAGE_ENV, else under the temp dir, keyed by the URL)."""
    if not is_remote(ckpt_dir):
        return Path(ckpt_dir)
    key = hashlib.sha1(str(ckpt_dir).rstrip("/").encode()).hexdigest()[:12]
    base = os.environ.get(STAGE_ENV) or Path(tempfile.gettempdir()) / f"ddpkit-stage-{os.getuid()}"
    return Path(base) / key


def describe(e: BaseException) -> str:
    """One phrase for a store error, from the server's own words (no credentials in them)."""
    text = " ".join(str(e).split())[:200]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# --- a store that went away -----------------------------------------------------------------


class StoreLost(Exception):
    """The checkpoint store stopped answering mid-run (message: lost_line's one line)."""


LOST_HEAD = "lost the checkpoint store "  # lost_line's first words (agreed as a problem string)
# Client errors that mean no answer came, by class name (no client is imported for them):
# botocore's EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError and
# ConnectionClosedError, aiohttp's ClientConnectorError and ServerDisconnectedError.
_UNANSWERED = (
    "ConnectionError", "TimeoutError", "ConnectorError", "ConnectionClosedError",
    "DisconnectedError",
)  # fmt: skip


def unreachable(e: BaseException) -> BaseException | None:
    """The error in `e` that says the store did not answer (a refused or dropped connection,
    a timeout: botocore's EndpointConnectionError and its kin, aiohttp's, the OS's), searched
    through its causes and any rank's failure DCP gathered into a CheckpointException; None
    when `e` is another failure (a missing object, a damaged file, refused credentials)."""
    seen: set[int] = set()
    todo: list[Any] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen or not isinstance(x, BaseException):
            continue
        seen.add(id(x))
        if isinstance(x, (ConnectionError, TimeoutError)) or any(
            t.__name__.endswith(_UNANSWERED) for t in type(x).__mro__
        ):
            return x
        todo += [x.__cause__, x.__context__]
        failures = getattr(x, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None


def store_wait_s() -> float:
    try:
        return max(0.0, float(os.environ.get(STORE_WAIT_ENV) or STORE_WAIT_S))
    except ValueError:
        return STORE_WAIT_S


def lost_line(url: str, what: str, cause: BaseException, last: str | None, log: Path | None) -> str:
    """The one line for a store that went away: which store, during what, the server's own
    words, and what the kit does next (a restart of torchrun's, if one is left, waits for
    the store and resumes from the last complete checkpoint; else the user reruns)."""
    since = (
        f"the last complete checkpoint ({last})"
        if last
        else "the start (no complete checkpoint yet)"
    )
    try:
        left = int(os.environ["TORCHELASTIC_MAX_RESTARTS"]) - int(
            os.environ["TORCHELASTIC_RESTART_COUNT"]
        )
    except (KeyError, ValueError):
        left = 0
    if left > 0:
        then = f"restarting from {since}, waiting up to {store_wait_s():.0f} s for the store"
    else:
        then = f"no restart left: run the job again once the store answers; it resumes from {since}"
    where = f"; tracebacks in {log}" if log is not None else ""
    return f"{LOST_HEAD}{url} during {what} ({describe(cause)}); {then}{where}"


def keep_traceback(log: Path | None, rank: int, e: BaseException, what: str) -> None:
    """Append the error's traceback to the run dir's log (none without a run dir): kept for
    whoever looks into it, out of the console. Best effort."""
    if log is None:
        return
    head = f"--- rank {rank}, {time.strftime('%Y-%m-%d %H:%M:%S')}, during {what}\n"
    try:  # one write per block: ranks appending at once do not interleave
        with open(log, "a") as f:
            f.write(head + "".join(traceback.format_exception(e)))
    except OSError:
        pass


# --- before training, and `ddpkit ckpt` -------------------------------------------------------


def check_ckpt_dir(ckpt_dir: str) -> None:
    """ConfigError (one line) unless the checkpoint dir's store can be written now. A
    restarted worker (torchrun's restart after a failure) first waits for a store that does
    not answer (store_wait_s): it answered at the start, a restart after it went away is
    what the lost line said the kit does; the launcher is told the cause if it stays away."""
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")
    wait_s = store_wait_s() if restarted else 0.0
    t0 = time.monotonic()
    problem = open_store(ckpt_dir).check(wait_s)
    if problem is None:
        return
    if wait_s and time.monotonic() - t0 >= wait_s:
        from ddpkit.train import failure

        problem += f" (waited {wait_s:.0f} s for it since it went away)"
        failure.tell_launcher(problem, cause=failure.STORE, error=problem)
    raise ConfigError(problem)


def fetch(url: str, dest: Path) -> tuple[Path, str]:
    """(a local copy under `dest`, its step's URL) of a checkpoint in a store (`ddpkit ckpt`): the step
    URL given, else the newest complete step under the URL or under its checkpoints/. The
    copy's files are verified by whoever reads it (the marker comes along)."""
    store = open_store(url)
    try:
        if step_number(url.rstrip("/").rsplit("/", 1)[-1]) is not None:
            store, name = step_at(url)
        else:
            complete, partial = store.scan()  # a missing bucket: FileNotFoundError, said below
            if not complete and not partial:
                inner = open_store(f"{url.rstrip('/')}/checkpoints")
                got = inner.scan()
                if got[0] or got[1]:
                    store, (complete, partial) = inner, got
            if not complete:
                got = ", ".join(sorted(partial)[-3:])
                raise ConfigError(
                    f"{url}: no complete checkpoint"
                    + (f" ({got} lack {MARKER}: an upload was cut short)" if got else "")
                    + "; pass a run's checkpoint URL or a step-N URL"
                )
            name = complete[-1]
        info, why = store.marker(name)
        if info is None:
            raise ConfigError(f"{store.where(name)}: not a complete checkpoint ({why})")
        read = store.read(name, dest / name, here=True, whole=True)
        if read.problem is not None:
            raise ConfigError(f"{store.where(name)}: not a complete checkpoint ({read.problem})")
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(store.problem(e)) from None
    return read.path, str(store.where(name))
