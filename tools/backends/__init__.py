"""The typed seam between the launcher and its backends (torchx's scheduler API, smaller).

A backend is a subclass of `Backend`, registered in BACKENDS (registry.py) by name ->
"module:Class" and imported only when used (submitit and the kubernetes client stay out of other backends):

    class MyBackend(Backend):
        name = "mine"; file_ext = "sh"
        def render(self, spec) -> str: ...                 # pure: no subprocess, no env reads
        def submit(self, spec, opts) -> int: ...           # side effects; exit status
        def poll(self, job) -> JobStatus: ...              # one look at a job (for wait/status)
        def logs(self, job, opts) -> int: ...
        def cancel(self, job, opts) -> int: ...
        def list_jobs(self, opts) -> int: ...              # this user's ddpkit jobs
        def add_arguments(self, parser) -> None: ...       # optional backend-only flags
        def after_render(self, spec, opts, text) -> int: ...  # optional (e.g. build an image)

The kit's engines have one shape, one package each beside its templates or scripts
(slurm/, k8s/, docker/): `<name>/backend.py` holds the subclass, `<name>/options.py` its
job-file table and rules, `<name>/render.py` the pure pieces, other modules the side effects
(docs/development.md). This package keeps what engines share: this interface and its wait
loop, the registry, job records, the checks before the queue (node_checks.py), the local
backend, and the container engines' work dir and code shipping (containers.py, user_image.py).

A backend's job-file options are a dataclass, `Options`, read from the job file's table of
the backend's name (`[slurm]`, `[k8s]`, `[docker]`, `[mine]`) by the same typed loader as the
rest of the spec; `backend.options(spec)` (or `spec.<name>`) returns them, typed. A built-in
engine is its package and one line in registry.BACKENDS; the job spec names none of them.

A backend of another package (a plugin) is one package and one line: the entry point
`mine = "mypkg.backend:MyBackend"` in the group `ddpkit.backends` of its pyproject.toml
(`[project.entry-points."ddpkit.backends"]`); `ddpkit render mine` then finds it, its
`[mine]` table is typed by its Options, and `--set mine.key=value` works.

`status` has a default (print `poll`'s answer; exit 0, or 1 when the job failed) and `wait`
is ONE loop for every backend: poll until JobState is terminal, then the job's exit status.
`opts` is the CLI's Namespace (opts.spec is the JobSpec when --config was given, else None).
Bad input raises ddpkit.tools.jobspec.SpecError (exit 2). record_job / last_job keep "the last job
submitted from this workspace" per backend.

Every backend runs the same node launcher (`python -m ddpkit.train.node ... -- <entry point>`,
train/launch/node.py), its command line built by ddpkit.tools.jobspec.node_command: a backend
passes its rendezvous (torchrun flags, or PET_* variables it sets) and knobs, renders the list
as it is, and binds the launch contract's DDPKIT_NODE_NAME / DDPKIT_NODE_NUMBER /
DDPKIT_SCHEDULER_ATTEMPT from its scheduler's variables in its own render (unset: the host's
name, the rendezvous' node rank, no earlier attempt, as on the local and Docker engines).
This package never imports a backend module, so backend modules may import from it freely
(no cycles: ddpkit.k8s.api imports ddpkit.k8s and this package, never the other way round).
"""

from __future__ import annotations

import abc
import argparse
import dataclasses
import enum
import importlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ddpkit.tools.backends.registry import BACKENDS, registered
from ddpkit.tools.jobspec import JobSpec, SpecError
from ddpkit.train import dataclass_fields
from ddpkit.train.contract import METRICS_FILE
from ddpkit.train.jsonshape import Opt, ShapeError, load, loads

STATE_DIR = ".ddpkit"  # in the workspace: job records (jobs/), rendered files, build contexts


def state_dir() -> Path:
    """The workspace's .ddpkit/ (the launcher runs in the workspace: see submit.run)."""
    return Path.cwd() / STATE_DIR


class JobState(enum.Enum):
    """One job-state vocabulary for every engine."""

    PENDING = "pending"  # queued, not started
    RUNNING = "running"
    REQUEUED = "requeued"  # saved on a stop signal and queued again
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # the engine no longer knows the job

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.UNKNOWN)


@dataclass
class JobStatus:
    job: str
    state: JobState
    exit_code: int | None = None  # the job's exit status once terminal
    detail: str = ""  # the engine's own words (state, reason, restarts, nodes)

    def line(self) -> str:
        code = "" if self.exit_code is None else f" exit={self.exit_code}"
        return f"job {self.job}: {self.state.value}{code} {self.detail}".rstrip()


PROGRESS_EVERY_S = 30.0  # wait: a new step and ETA at most this often while a job runs


class Backend(abc.ABC):
    """One engine. Subclasses set `name` and `file_ext` and implement the abstract methods."""

    name: ClassVar[str]
    file_ext: ClassVar[str]  # of `render --write` output: "sbatch", "yaml", "sh"
    # The nodes see this machine's files (local; SLURM's shared filesystem): the training
    # inputs (--data-dir, --resume, hf:PATH) are then checked here at render time. Container
    # backends set False: those paths exist only in the image or its volumes.
    shares_filesystem: ClassVar[bool] = True
    # The backend's job-file options: a dataclass typed from the job file's [<name>] table;
    # None = the backend has no options of its own.
    Options: ClassVar[type | None] = None
    # Make variables that set a key of the backend's table (`make ... PARTITION=gpu` ->
    # `--set slurm.partition=gpu`), read by `--make` (submit.make_argv): VAR -> key.
    make_vars: ClassVar[dict[str, str]] = {}
    # Commented lines `ddpkit init` writes under the table's header in a new job file.
    job_file_lines: ClassVar[tuple[str, ...]] = ()
    # Runs fault_tolerance = "torchft" jobs (the lighthouse and the replica groups).
    runs_torchft: ClassVar[bool] = False

    def options(self, spec: JobSpec) -> Any:
        """This backend's options of the job, typed (its Options' defaults when the job file
        has no table for it)."""
        table = spec.backend_options.get(self.name)
        if table is None and self.Options is not None:
            return self.Options()
        return table

    def check_options(self, spec: JobSpec) -> None:
        """The checks declared on this backend's options' fields
        (ddpkit.train.dataclass_fields.checks); Backend.validate runs them, for this backend's
        jobs only."""
        options = self.options(spec)
        if dataclasses.is_dataclass(options):
            dataclass_fields.check_all(options, self.name, SpecError)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:  # noqa: B027 (a hook)
        """Backend-only CLI flags (none by default)."""

    def entry_python(self, spec: JobSpec) -> str:
        """The interpreter that runs the job's entry point, as this machine knows it: the
        entry point is found and compiled with it before anything is rendered or queued
        (node_checks.check_entry_point). Container backends: this one (the image runs the same
        code)."""
        return sys.executable

    def validate(self, spec: JobSpec) -> None:
        """This backend's own rules on a loaded spec (SpecError); the launcher applies them
        to this backend's jobs only, so one backend's rule never refuses another's job.
        The default checks the options' declared field rules; an override calls
        super().validate(spec) first."""
        self.check_options(spec)
        if spec.fault_tolerance == "torchft" and not self.runs_torchft:
            raise SpecError(
                f"fault_tolerance = torchft does not run on the {self.name} backend yet; use "
                '`ddpkit run` (local), slurm, k8s or docker, or fault_tolerance = "none"'
            )

    def stop_window(self, spec: JobSpec) -> tuple[int, str] | None:
        """(seconds the scheduler leaves between its stop signal and the kill, what sets
        them): a save on a stop must fit (tools/savebudget.py). None: no scheduler stops
        the job (its window is the shutdown budget)."""
        return None

    @abc.abstractmethod
    def render(self, spec: JobSpec) -> str:
        """What submit sends, as text. Pure: reads nothing but the spec."""

    def after_render(self, spec: JobSpec, opts: argparse.Namespace, text: str) -> int:
        return 0

    @abc.abstractmethod
    def submit(self, spec: JobSpec, opts: argparse.Namespace) -> int:
        """Send the job; with opts.wait follow it to its end. Returns an exit status."""

    def submit_sweep(self, specs: list[JobSpec], opts: argparse.Namespace) -> int:
        """Sweep members (ddpkit.tools.sweep): N named jobs, one after the other by default; the
        last non-zero exit status, else 0. A backend may override (SLURM: a job array)."""
        rc = 0
        for spec in specs:
            rc = self.submit(spec, opts) or rc
        return rc

    @abc.abstractmethod
    def poll(self, job: str) -> JobStatus:
        """One look at a job."""

    def job_or_last(self, job: str | None) -> str:
        return job if job is not None else str(last_job(self.name)["job"])

    def status(self, job: str | None, opts: argparse.Namespace) -> int:
        st = self.poll(self.job_or_last(job))
        print(st.line())
        for line in run_dir_lines(self.name, st.job):
            print(line)
        return 1 if st.state in (JobState.FAILED, JobState.UNKNOWN) else 0

    @abc.abstractmethod
    def logs(self, job: str | None, opts: argparse.Namespace) -> int: ...

    @abc.abstractmethod
    def cancel(self, job: str | None, opts: argparse.Namespace) -> int: ...

    def list_jobs(self, opts: argparse.Namespace) -> int:
        raise SpecError(f"`list` is not available for the {self.name} backend")

    def wait(
        self,
        job: str,
        poll_s: float = 2.0,
        on_poll: Callable[[JobStatus], None] | None = None,
        run_dir: str | Path | None = None,
        every_s: float = PROGRESS_EVERY_S,
    ) -> int:
        """The one wait loop: poll until the job ends; print a line on stderr when the
        state (or the exit status) changes, not every poll (run times tick in the detail).
        With the job's run dir on this machine (a shared filesystem), the line ends with the
        trainer's step and ETA from metrics.jsonl, and a new step is printed at most every
        `every_s` seconds."""
        last: tuple[JobState, int | None] | None = None
        shown, shown_at = "", 0.0
        while True:
            st = self.poll(job)
            if on_poll is not None:
                on_poll(st)
            now = time.monotonic()
            where = progress(run_dir) if st.state is JobState.RUNNING else ""
            changed = (st.state, st.exit_code) != last
            if changed or (where and where != shown and now - shown_at >= every_s):
                print(st.line() + where, file=sys.stderr, flush=True)
                last, shown, shown_at = (st.state, st.exit_code), where, now
            if st.state.terminal:
                if st.state is JobState.SUCCEEDED:
                    return 0
                return st.exit_code or 1
            time.sleep(poll_s)


def run_dir_lines(backend: str, job: str) -> list[str]:
    """The goodput lines of a job whose run dir is on this machine (its job record names
    it: local, SLURM on a shared filesystem); none elsewhere."""
    from ddpkit.train.goodput import status_lines

    try:
        record = last_job(backend, {"run_dir": Opt((str, None))})
    except SpecError:
        return []
    if str(record["job"]) != str(job) or not record.get("run_dir"):
        return []
    return status_lines(record["run_dir"])


def progress(run_dir: str | Path | None) -> str:
    """' step N eta D' from the last record of <run_dir>/metrics.jsonl ('step N' when the
    record has no ETA yet), or '' where there is none: no run dir here, no metrics yet, a
    script that is not the kit's trainer. Reads the file's last 4 KB only."""
    if run_dir is None:
        return ""
    try:
        with (Path(run_dir) / METRICS_FILE).open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            rec = loads(f.read().decode(errors="replace").strip().splitlines()[-1], {"step": int})
    except (OSError, ShapeError, IndexError):  # a line cut short or of another shape: none
        return ""
    step, eta = rec["step"], rec.get("eta_s")
    if not isinstance(eta, (int, float)) or isinstance(eta, bool) or not 0 <= eta < 1e9:
        return f" step {step}"  # none yet, or not a duration (NaN, infinite, negative)
    from ddpkit.train.metrics import format_duration

    return f" step {step} eta {format_duration(eta)}"


def plugin_sections(backend: Backend) -> dict[str, type | None]:
    """The plugin backends' tables a job file may hold (the built-in engines' are typed
    always: registry.builtin_options): the acting backend's typed by its Options, every
    other one kept as written."""
    sections: dict[str, type | None] = dict.fromkeys(set(registered()) - set(BACKENDS))
    if backend.name not in BACKENDS and backend.Options is not None:
        sections[backend.name] = backend.Options
    return sections


def load_backend(name: str) -> Backend:
    """The backend registered as `name`, imported now."""
    known = registered()
    if name not in known:
        raise SpecError(f"unknown backend {name!r}; use one of {', '.join(known)}")
    module_name, _, cls_name = known[name].partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, cls_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise SpecError(
            f"backend {name!r} is registered as {known[name]!r}, but {module_name} does not "
            "import; reinstall the package that provides it"
        ) from None
    except AttributeError:
        raise SpecError(
            f"backend {name!r} is registered as {known[name]!r}, but {module_name} has no "
            f"{cls_name}; fix the entry point"
        ) from None
    backend = cls()
    if not isinstance(backend, Backend) or backend.name != name:
        raise SpecError(
            f"backend {name!r} ({known[name]}) is not a ddpkit Backend named {name!r}; "
            "subclass ddpkit.tools.backends.Backend and set name"
        )
    return backend


def _last_path(backend: str) -> Path:
    return state_dir() / "jobs" / backend / "last_job.json"


def _recorded_job(path: Path) -> str | None:
    """The job id a record names; None when it is unreadable or not a record."""
    try:
        return str(load(path, {"job": (str, int)})["job"])
    except (OSError, ShapeError):
        return None


def record_job(backend: str, job: str, **info: Any) -> Path:
    """Remember the job submitted last from this workspace (.ddpkit/jobs/<backend>/); the
    record of another job it replaces is kept aside for drop_job."""
    path = _last_path(backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file() and _recorded_job(path) != job:  # a damaged record is kept aside too
        path.replace(path.with_name(PREVIOUS_FILE))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"job": job, **info}, indent=2) + "\n")
    tmp.replace(path)
    return path


PREVIOUS_FILE = "previous_job.json"


def drop_job(backend: str, job: str) -> None:
    """A submit that was refused (bad input, a run or checkpoint dir in use: exit 2 before
    anything ran) changes no record: the one it replaced is the last job again, so
    `ddpkit status` and `cancel` still find the job that runs."""
    path = _last_path(backend)
    if path.is_file() and _recorded_job(path) != job:
        return  # another submit recorded since (or a damaged record): leave it
    previous = path.with_name(PREVIOUS_FILE)
    if previous.is_file():
        previous.replace(path)
    else:
        path.unlink(missing_ok=True)


def refuse_a_live_run_dir(spec: JobSpec) -> None:
    """One rule for every backend: a run dir that the last job of ANY backend submitted from
    this workspace still trains into (or is queued to) is refused before anything is started
    or queued, in one line naming that job. A local smoke test and a SLURM job of the same
    name both wrote the same checkpoints and goodput records at once (only SLURM's own jobs
    were checked). Only a record naming the same run dir is asked about its state."""
    want = Path(spec.run_dir).resolve()
    jobs = state_dir() / "jobs"
    names = sorted(p.name for p in jobs.iterdir() if p.is_dir()) if jobs.is_dir() else []
    for name in names:
        try:
            record = last_job(name, {"run_dir": Opt((str, None))})
        except SpecError:
            continue  # no record, or a damaged one (the next submit replaces it)
        if not record.get("run_dir") or Path(record["run_dir"]).resolve() != want:
            continue
        job = str(record["job"])
        try:
            state = load_backend(name).poll(job).state
        except Exception:  # noqa: BLE001 - an engine we cannot ask now (no cluster here)
            continue
        if state in (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED):
            raise SpecError(
                f"run dir {spec.run_dir} is in use by job {job} ({state.value}), the {name} job "
                f"submitted from here; wait for it to end or cancel it (ddpkit cancel {name} "
                f"{job}), or use another run dir (--set train.run_dir=... or another name)"
            )


def last_job(backend: str, shape: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record of the last job submitted from here, with a "job" and the keys of `shape`
    (ddpkit.train.jsonshape: what the caller reads); SpecError when there is none, or when
    it is not such a record (damaged, edited): one line, never a traceback."""
    path = _last_path(backend)
    if not path.is_file():
        raise SpecError(
            f"no {backend} job submitted from this workspace yet ({path} missing); "
            f"pass a job id (ddpkit status {backend} JOB) or run from the project's directory"
        )
    try:
        return load(path, {"job": (str, int), **(shape or {})})
    except (OSError, ShapeError) as e:
        raise SpecError(
            f"{path} is not a job record this kit wrote ({e}); pass a job id (ddpkit status "
            f"{backend} JOB), or delete it and submit again"
        ) from None
