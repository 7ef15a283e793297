"""The one node launcher every backend runs: torchrun in process, one exit status out.

    python -m ddpkit.train.node [ddpkit flags] [torchrun flags] -- <entry point argv>

    entry point argv:  -m ddpkit.train [train flags]      (the default: the kit's trainer)
                       -m pkg.module [args]         (the user's module)
                       path/script.py [args]        (the user's script, unchanged)

`make train`, `submit local`, the SLURM node step, the Kubernetes container command and the
Docker entrypoint all call this; each backend only sets the rendezvous (torchrun's flags or
its PET_* environment variables, e.g. PET_NNODES, PET_RDZV_ENDPOINT). What it adds, from
ddpkit.train.contract, so no backend retypes it:
  - torchrun's --signals-to-handle (TORCHRUN_SIGNALS: USR1/USR2 reach the workers) and
    --shutdown-timeout (shutdown_budget_s of train.shutdown_timeout_s, or --shutdown-timeout);
  - DDPKIT_LAUNCH_ID (one id per launch, the same on every node of it), DDPKIT_RUN_DIR and
    DDPKIT_SHUTDOWN_TIMEOUT_S for the workers (train/preempt.py reads them); a requeue
    marker only counts when it carries this launch's id;
  - MKL_DYNAMIC=FALSE and OMP_DYNAMIC=FALSE unless the job sets them (REPRODUCIBLE_MATH_ENV):
    Intel's conditions for MKL results that repeat from run to run (exact resume compares bits);
  - for the default entry point, the training flags are checked BEFORE torchrun starts, with
    the world size this launch will have: a bad flag is one line + exit 2, no process group;
    so is a checkpoint or run dir that a live job on this host holds (train/loop/runlock.py).
Exit status (one, whatever torchrun's): a worker's 2 (bad input) -> 2, 3 (diverged) -> 3; a
requeue marker of this launch -> 75; Ctrl-C (SIGINT) -> 130, never a requeue (the kit's
trainer saves on the way out); a stop signal that asks for no requeue here (a plain scancel's
SIGTERM on SLURM: contract.REQUEUE_SIGNALS_ENV) -> 128 + signal, whatever marker a script
wrote; another stop signal without a marker -> 128 + signal, unless the run finished in this
launch anyway (summary.json with its id) -> 0; the first stop signal of a launch is its only
one; other worker failures -> 1, naming the rank (and host) that stopped taking part: the
first worker to end, by the launcher's own timing of every worker (not torchrun's
whole-second stamps), or a rank that left early with exit 0; success -> 0. The workers' exit waits for gloo's threads (train/teardown.py: the cause
of `terminate called without an active exception` after a finished run); should a worker of
the kit's trainer still die by SIGABRT after it wrote this launch's summary.json, that one
failure is forgiven -> 0 with one line. torch's
ChildFailedError dump is replaced by one short line. A user's script or module runs on the
workers through run_entry (exactly as `python [-m] TARGET` would), so its unhandled
KeyboardInterrupt on Ctrl-C ends each rank quietly and the launch says it once.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ddpkit.train import goodput
from ddpkit.train.contract import (
    CKPT_DIR_ENV,
    COLLECTIVE_TIMEOUT_ENV,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REQUEUE,
    LAUNCH_ID_ENV,
    PREEMPT_SIGNALS,
    REPRODUCIBLE_MATH_ENV,
    RUN_DIR_ENV,
    RUN_ID_ENV,
    SHUTDOWN_ENV,
    STOP_SIGNALS,
    TORCHRUN_SIGNALS,
    asks_requeue,
    default_ckpt_dir,
    finished_in_launch,
    fresh_requeue_marker,
    requeue_signals,
    shutdown_budget_s,
)
from ddpkit.train.errors import run_cli
from ddpkit.train.failure import Failure, culprit, signame
from ddpkit.train.ft_env import group_dirs
from ddpkit.train.launch import hooks
from ddpkit.train.launch.entry import wrap_user_entry
from ddpkit.train.launch.flags import (
    NodeError,
    build_parser,
    parse_flags,
    planned_world,
    split_argv,
)
from ddpkit.train.launch.outcome import PREFIX, outcome

MARKER_WAIT_S = 5.0  # how long a node waits for the marker of a rank 0 elsewhere


def require_torch() -> None:
    """torch imports with this interpreter, or one line: the local backend runs no separate
    import check for it (this launcher is the check, at no extra interpreter's cost)."""
    try:
        import torch.distributed.run  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install raises anything
        raise NodeError(
            f"torch does not import with {sys.executable} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); install torch for that Python"
        ) from None


def is_default_entry(entry: list[str]) -> bool:
    return entry[:2] == ["-m", "ddpkit.train"]


def precheck_train(train_argv: list[str], world_size: int, nnodes: int) -> object:
    """The trainer's own parse + validate, for the world size this launch will have."""
    from ddpkit.train.config import parse_config

    cfg, _ = parse_config(train_argv, world=(world_size, nnodes))
    return cfg


def refuse_dirs_in_use(cfg: Any) -> None:
    """A checkpoint or run dir that a live job on this host holds (its lock, reached by any
    path: a symlink resolves to the same lock file) is refused before a worker starts."""
    from ddpkit.train.loop.rundir import lock_dirs
    from ddpkit.train.loop.runlock import RunLock

    for d in lock_dirs(cfg):
        RunLock(d).refuse_if_live()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        build_parser().print_help()
        return EXIT_OK
    flags, entry = split_argv(argv)
    require_torch()
    own, args = parse_flags(flags, entry)
    from torch.distributed import run as torchrun

    world_size, nnodes = planned_world(args.nnodes, args.nproc_per_node)

    group = group_dirs()  # a torchft replica group's own dirs win over the job's --run-dir
    run_dir, timeout_s = group[0] if group else own.run_dir, own.shutdown_timeout
    collective_s = own.collective_timeout
    if is_default_entry(entry):
        cfg = precheck_train(entry[2:], world_size, nnodes)
        refuse_dirs_in_use(cfg)
        run_dir = run_dir or cfg.run_dir
        if timeout_s is None:
            timeout_s = cfg.shutdown_timeout_s
        if collective_s is None:
            collective_s = cfg.timeout_s
    else:
        wrap_user_entry(args)
    if not run_dir:  # another entry point, run by hand: runs/<its name>, as the trainer does
        run_dir = f"runs/{entry[1].rsplit('.', 1)[-1] if entry[0] == '-m' else Path(entry[0]).stem}"
    if timeout_s is None:
        timeout_s = DEFAULT_SHUTDOWN_TIMEOUT_S
    args.signals_to_handle = TORCHRUN_SIGNALS
    args.shutdown_timeout = shutdown_budget_s(timeout_s)

    # One id per launch, the same on every node: the rendezvous id is exactly that (the
    # backends make it unique per attempt); --standalone draws a fresh one.
    launch_id = own.launch_id or os.environ.get(LAUNCH_ID_ENV)
    if not launch_id:
        launch_id = uuid.uuid4().hex if args.standalone else f"{args.rdzv_id}"
    if args.standalone:
        args.rdzv_id = launch_id  # torchrun would draw its own uuid; keep one id
    os.environ[LAUNCH_ID_ENV] = launch_id
    os.environ.setdefault(RUN_ID_ENV, launch_id)  # the engine's run id, else this launch's
    os.environ[RUN_DIR_ENV] = str(Path(run_dir))
    os.environ.setdefault(CKPT_DIR_ENV, default_ckpt_dir(run_dir))  # the job's, when it set one
    os.environ[SHUTDOWN_ENV] = str(args.shutdown_timeout)
    os.environ[COLLECTIVE_TIMEOUT_ENV] = f"{collective_s or DEFAULT_COLLECTIVE_TIMEOUT_S:g}"
    for name, value in REPRODUCIBLE_MATH_ENV.items():  # the job's own value wins
        os.environ.setdefault(name, value)
    # A script's own directory comes first on its sys.path, not the submit directory: put the
    # submit directory (the repository root) next, so `from train import preempt` resolves.
    paths = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    hooks.install(args.shutdown_timeout, _blame, _rdzv_port(args))

    failures: dict[int, Failure] = {}
    stopped_by: int | None = None
    started = time.time()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        hooks.worker_ends()  # every watcher has noted its worker's end
        failures = hooks.timed(e.failures)
    except SignalException as e:
        stopped_by = int(e.sigval)
    except Exception as e:  # rendezvous timeouts, a closed store: one line, not a dump
        print(f"{PREFIX}: torchrun failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    cancelled = stopped_by is not None and not asks_requeue(signame(stopped_by))
    # A cancel (SIGTERM where the requeue signal is SLURM's --signal) is never a requeue, even
    # when a script with a handler of its own wrote the marker.
    fresh = not cancelled and fresh_requeue_marker(run_dir, launch_id, started)
    if stopped_by == signal.SIGINT:  # Ctrl-C: the user's stop, never a requeue
        finished = is_default_entry(entry) and finished_in_launch(run_dir, launch_id, started)
        for name in STOP_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        goodput.launcher_exit(
            run_dir, False, int(args.node_rank), *(hooks.LAST_ATTEMPT or [None]), cancel="SIGINT"
        )
        if finished:
            print(f"{PREFIX}: SIGINT arrived after the run finished; exit 0", file=sys.stderr)
            return EXIT_OK
        print(
            f"{PREFIX}: stopped by SIGINT (Ctrl-C); exit {EXIT_INTERRUPTED}, not requeued",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    if stopped_by is not None and not fresh and not cancelled and not args.standalone:
        # Rank 0 may sit on another node and write the marker just after this node's
        # workers left: give it a moment before calling this a plain stop.
        deadline = time.monotonic() + MARKER_WAIT_S
        while not fresh and time.monotonic() < deadline:
            time.sleep(0.2)
            fresh = fresh_requeue_marker(run_dir, launch_id, started)
    finished = is_default_entry(entry) and finished_in_launch(run_dir, launch_id, started)
    hooks.worker_ends()
    left = hooks.left_ranks()  # the other nodes' as the agent last read them
    code, line = outcome(failures, fresh, finished, left, hooks.stopped_at())
    if (
        stopped_by is not None
        and code == EXIT_OK
        and finished_in_launch(run_dir, launch_id, started)
    ):
        line = (
            f"{PREFIX}: {signame(stopped_by)} arrived during the last steps; the run finished "
            "(nothing to requeue)"
        )
    elif stopped_by is not None and code == EXIT_OK and cancelled:
        code = 128 + stopped_by
        line = (
            f"{PREFIX}: stopped by {signame(stopped_by)} (a cancel, or the step ended after "
            f"another node failed): exit {code}, no requeue asked by this node (this job "
            f"requeues on {'/'.join(requeue_signals())}; a failed node's requeue is the batch "
            "script's)"
        )
    elif stopped_by is not None and code == EXIT_OK:
        code = 128 + stopped_by
        line = (
            f"{PREFIX}: stopped by {signame(stopped_by)} without a requeue request "
            f"(exit {code}); see docs/running.md 'Preemption in your own script' to ask for a requeue"
        )
    # The outcome is decided: a late stop signal (srun stopping the step once a node exited)
    # must not turn it into a death by signal while the interpreter shuts down.
    for name in PREEMPT_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    if line and hooks.STOPPED and code == EXIT_FAILED:
        line += f"; {hooks.STOPPED[0][1]}"
    # The goodput first: the outcome line stays the launch's last word.
    said = goodput.launcher_exit(
        run_dir,
        code == EXIT_REQUEUE,
        int(args.node_rank),
        *(hooks.LAST_ATTEMPT or [None]),
        finished=code == EXIT_OK,
        # A stop signal without a requeue's save: the user's or an admin's stop, not a failure.
        cancel=signame(stopped_by) if stopped_by and code not in (EXIT_OK, EXIT_REQUEUE) else None,
    )
    for text in (said, line):
        if text:
            print(text, file=sys.stderr, flush=True)
    return code


def _rdzv_port(args: Any) -> int | None:
    """The rendezvous endpoint's port (flag or PET_RDZV_ENDPOINT), None without one."""
    endpoint = str(getattr(args, "rdzv_endpoint", "") or "")
    port = endpoint.rpartition(":")[2]
    return int(port) if port.isdigit() else None


def _blame(failed: dict[Any, Any]) -> tuple[int, Failure]:
    """The rank to blame among torchrun's failures of an attempt (the agent asks before it
    restarts: the user's code failing is never retried)."""
    return culprit(hooks.timed(failed))


if __name__ == "__main__":
    sys.exit(run_cli(main))
