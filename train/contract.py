"""The launch contract, in one torch-free place.

Every party to a launch reads its values from here: the trainer (`python -m ddpkit.train`), the
launcher's backends (tools/backends), the node scripts they render, the Docker entrypoint
(through docker/nproc.py) and the tools. Importing this module must stay cheap (no
torch, no third-party imports): the node side imports it before anything heavy.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ddpkit.train.jsonshape import Opt, ShapeError, load

# --- exit statuses ---------------------------------------------------------------------------
EXIT_OK = 0
EXIT_FAILED = 1  # an error that is not the user's input (crash, collective failure)
EXIT_BAD_INPUT = 2  # the user's mistake: one line on stderr naming the problem and the fix
EXIT_DIVERGED = 3  # a non-finite loss or gradient norm: nothing was saved from that state
# "Saved a checkpoint after a preemption signal, please requeue" (EX_TEMPFAIL, sysexits.h).
EXIT_REQUEUE = 75
# Ctrl-C (SIGINT): the user stopped the run by hand. The kit's trainer saves on the way out
# and exits 128 + SIGINT; the launcher never requeues it (whatever marker a script wrote).
EXIT_INTERRUPTED = 130

# --- files in the run dir / checkpoint dir ----------------------------------------------------
REQUEUE_MARKER = "requeue.json"  # each node's local rank 0 writes it after a preemption save
SUMMARY_FILE = "summary.json"  # rank 0 writes it when a run ends (with the launch id)
CONFIG_FILE = "config.json"  # rank 0 writes the run's resolved TrainConfig at start-up
METRICS_FILE = "metrics.jsonl"  # rank 0 appends one JSON line per logged step and eval
RUNS_DIR = "runs"  # a run dir defaults to runs/<name>, relative to the workspace
CKPT_SUBDIR = "checkpoints"  # a checkpoint dir defaults to <run dir>/checkpoints
CKPT_MARKER = ".complete"  # a step dir counts only once this file is in it
CKPT_STEP_PREFIX = "step-"  # <ckpt_dir>/step-<N>/

# --- signals -----------------------------------------------------------------------------------
# What means "save and requeue": SLURM preemption/time limit (TERM, or the --signal a site
# configures: USR1/USR2), Kubernetes pod deletion and docker stop (TERM). ddpkit.train.preempt
# catches these for a user's script.
PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2")
# What the kit's trainer stops on at a step boundary (ddpkit.train.signals records them
# from its first line): the preemption signals, and Ctrl-C, which saves and stops without a
# requeue.
STOP_SIGNALS = (*PREEMPT_SIGNALS, "SIGINT")
# What torchrun must forward to its workers (--signals-to-handle). Its default lacks USR1/USR2,
# and a USR1 sent to an agent that does not handle it kills the agent.
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# Which stop signals ask for a requeue on this launch (comma-separated names). SLURM's node
# script names its --signal (slurm.signal) alone: a plain `scancel` sends SIGTERM, and a user's
# or an admin's cancel ends the job (SLURM's own preemption requeues it by itself). Unset:
# every PREEMPT_SIGNAL (Kubernetes pod deletion, docker stop, `cancel local`). Another stop
# signal still saves on the way out, then ends the launch with 128 + its number.
REQUEUE_SIGNALS_ENV = "DDPKIT_REQUEUE_SIGNALS"


def requeue_signals(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The stop signals (names, e.g. "SIGUSR1") that ask for a requeue on this launch (or on
    the launch whose environment `env` is)."""
    named = (os.environ if env is None else env).get(REQUEUE_SIGNALS_ENV)
    if named is None:
        return PREEMPT_SIGNALS
    return tuple(n for n in (x.strip() for x in named.split(",")) if n in PREEMPT_SIGNALS)


def asks_requeue(signal_name: str | None) -> bool:
    """True when a save on this stop signal asks for a requeue (not a cancel, not Ctrl-C)."""
    return signal_name in requeue_signals()


# --- the shutdown budget -------------------------------------------------------------------------
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0  # torchrun's --shutdown-timeout default


# How long a collective may wait for a rank before it fails: the kit's trainer's --timeout-s,
# and for every entry point the default timeout of the process groups its workers make (the
# node launcher passes it as COLLECTIVE_TIMEOUT_ENV; ddpkit.train.launch.entry applies it to a
# user's script that names none). torch's own default is 30 min (gloo) or 10 (NCCL): a rank
# hung in a user's script held the whole job that long with nothing said.
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
COLLECTIVE_TIMEOUT_ENV = "DDPKIT_COLLECTIVE_TIMEOUT_S"


def shutdown_budget_s(seconds: float) -> int:
    """Whole seconds for torchrun's --shutdown-timeout and the schedulers' grace periods:
    rounded up (a budget is never cut short), at least 1."""
    return max(1, math.ceil(seconds))


# --- the requeue marker --------------------------------------------------------------------------
# The node launcher sets DDPKIT_LAUNCH_ID (unique per torchrun launch) and DDPKIT_RUN_DIR for
# every worker. Whoever saves after a stop signal (the trainer, or a user script through
# ddpkit.train.preempt) writes <run dir>/requeue.json carrying that id; the launcher counts a marker
# only when the id is its own, so a marker left by an earlier attempt never fakes a save.
LAUNCH_ID_ENV = "DDPKIT_LAUNCH_ID"
# The rendezvous round the workers' group formed in, the same on every node (the node launcher
# sets it): torchrun's TORCHELASTIC_RESTART_COUNT is per node, and a node restarted for the
# other's failure (a membership change) keeps its count, so it cannot key the round's store.
RDZV_ROUND_ENV = "DDPKIT_RDZV_ROUND"
RUN_DIR_ENV = "DDPKIT_RUN_DIR"
# One id per run: what one `ddpkit run` or `ddpkit submit` started, the same across its in-place
# restarts and the scheduler's requeues or recreated pods; the same job submitted again is a new
# run. The goodput report, `ddpkit status` and the run's summary are of one run: a run dir used
# by several runs (a local smoke test, then the cluster) never mixes them. Each engine binds it
# (SLURM: its job id; Kubernetes: ddpkit.k8s.attempt, from the job's first pod start on its
# claim); unset, the node launcher's launch id is the run's (local, Docker: one launch a run).
RUN_ID_ENV = "DDPKIT_RUN_ID"
# The job's checkpoint dir (ckpt_dir, else <run dir>/checkpoints) for every entry point: where
# a user's script saves so that its checkpoints outlive the node (the PVC or volume on k8s/docker).
CKPT_DIR_ENV = "DDPKIT_CKPT_DIR"
# Whole seconds a worker has after a stop signal before torchrun kills it (the node
# launcher's --shutdown-timeout); ddpkit.train.preempt.seconds_left() counts down from it.
SHUTDOWN_ENV = "DDPKIT_SHUTDOWN_TIMEOUT_S"
# What Intel lists for MKL results that repeat bit for bit from run to run (oneMKL developer
# guide, "Reproducibility Conditions"): a fixed thread count that is not adjusted at run time.
# MKL_DYNAMIC is on by default, and the kit's exact resume and its tests compare bits, so the
# node launcher gives the workers both switches off unless the job sets its own.
REPRODUCIBLE_MATH_ENV = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}


# --- where a worker runs: what each engine tells the node -----------------------------------------
# Each engine binds these in its own render (SLURM's node script from SLURMD_NODENAME,
# SLURM_NODEID and SLURM_RESTART_COUNT; Kubernetes from the downward API and its pod attempts);
# nothing outside the engine packages reads a scheduler's own variables, so a new engine binds
# these three and touches no file of train/. Unset (local, Docker): the host's name, the
# rendezvous' node rank, no earlier attempt.
NODE_NAME_ENV = "DDPKIT_NODE_NAME"  # the node's name as its scheduler knows it
NODE_NUMBER_ENV = "DDPKIT_NODE_NUMBER"  # the node's number as the user sees it (SLURM's node id)
# How many times the scheduler started this job before this attempt (SLURM's requeues, the
# recreated pods of a Kubernetes job): in-place restarts under one launch are torchrun's own.
SCHEDULER_ATTEMPT_ENV = "DDPKIT_SCHEDULER_ATTEMPT"


def node_name(env: Mapping[str, str] | None = None) -> str:
    """This node's name as its scheduler knows it (several SLURM nodes may share a host here,
    pods on one machine too), else the host name."""
    import socket

    return (os.environ if env is None else env).get(NODE_NAME_ENV) or socket.gethostname()


def node_number(env: Mapping[str, str] | None = None) -> int | None:
    """This node's number as its scheduler numbers it, when the engine says; else None (the
    caller takes the rendezvous' node rank)."""
    try:
        return int((os.environ if env is None else env).get(NODE_NUMBER_ENV, ""))
    except ValueError:
        return None


def scheduler_attempt(env: Mapping[str, str] | None = None) -> int:
    """How many times the scheduler started this job before (0: the first time)."""
    try:
        return max(0, int((os.environ if env is None else env).get(SCHEDULER_ATTEMPT_ENV) or 0))
    except ValueError:
        return 0


def default_run_dir(name: str) -> str:
    """The run dir of a run that names none: runs/<name> (the trainer, the node launcher and
    the job spec all derive it here)."""
    return f"{RUNS_DIR}/{name}"


def default_ckpt_dir(run_dir: str) -> str:
    """The checkpoint dir of a run that names none: <run dir>/checkpoints."""
    return str(Path(run_dir) / CKPT_SUBDIR)


def is_remote(ckpt_dir: str | os.PathLike[str]) -> bool:
    """A checkpoint dir in an object store: an fsspec URL other than file:// (a local path
    never holds '://'; train/ckpt/store.py serves it)."""
    s = str(ckpt_dir)
    return "://" in s and not s.startswith("file://")


def ckpt_join(ckpt_dir: str | os.PathLike[str], *parts: str) -> str:
    """A path below a checkpoint dir as the user named it: a URL keeps its `scheme://`
    (pathlib would fold it to `s3:/`), a local dir joins as a path."""
    if is_remote(ckpt_dir):
        return "/".join([str(ckpt_dir).rstrip("/"), *parts])
    return str(Path(ckpt_dir, *parts))


def write_requeue_marker(run_dir: str | Path, **info: Any) -> Path:
    """Atomically write <run_dir>/requeue.json with this launch's id and `info`."""
    path = Path(run_dir) / REQUEUE_MARKER
    body = {"launch_id": os.environ.get(LAUNCH_ID_ENV), "time": time.time(), **info}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(body) + "\n")
    os.replace(tmp, path)
    return path


def fresh_requeue_marker(run_dir: str | Path, launch_id: str | None, since: float) -> bool:
    """True when <run_dir>/requeue.json was written by this launch: same launch id when the
    launcher gave one and the marker carries one, else written after `since` (epoch seconds;
    the marker's "time", or the file's mtime for a writer that records neither)."""
    return _written_by_launch(Path(run_dir) / REQUEUE_MARKER, launch_id, since)


def finished_in_launch(run_dir: str | Path, launch_id: str | None, since: float) -> bool:
    """True when the trainer's <run_dir>/summary.json was written by this launch: the run
    ended (a stop signal in its last steps arrived too late to stop it), by the same rule."""
    return _written_by_launch(Path(run_dir) / SUMMARY_FILE, launch_id, since)


_STAMP = {"launch_id": Opt((str, None)), "time": Opt((float, None))}  # extra keys: anything
_warned: set[str] = set()  # a bad marker is said once, not on every poll


def _written_by_launch(path: Path, launch_id: str | None, since: float) -> bool:
    return launch_record(path, launch_id, since) is not None


def launch_record(path: str | Path, launch_id: str | None, since: float) -> dict | None:
    """The JSON object at `path` when this launch wrote it (the rule of fresh_requeue_marker:
    its "launch_id", else its "time" or mtime against `since`), else None: missing, an
    earlier launch's, or not a stamped object (one warning)."""
    path = Path(path)
    try:
        body = load(path, _STAMP)
        mtime = path.stat().st_mtime
    except OSError:
        return None
    except ShapeError as e:  # not this launch's: one warning, no requeue on its word
        if str(path) not in _warned:
            _warned.add(str(path))
            print(f"warning: ignoring {path} ({e})", file=sys.stderr, flush=True)
        return None
    if launch_id and body.get("launch_id") is not None:
        return body if body.get("launch_id") == launch_id else None
    return body if float(body.get("time") or mtime) >= since else None


# --- processes ----------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """Whether the process runs on this machine. A zombie does not: where PID 1 reaps orphans
    late or never (a container whose PID 1 is the kit's own launcher; this machine's init
    under load), a killed process stays one for a while: a torchft group restarted in a
    container found its own dead rank's checkpoint lock held, and `ddpkit run` refused a
    run dir as "in use" by the SIGKILLed launcher of the job before it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:  # "pid (comm) state ...": comm may hold spaces
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux): signal 0 is the answer
    return state not in ("Z", "X")
