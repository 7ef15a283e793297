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

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ddpkit.train import failclass, goodput, places
from ddpkit.train.contract import (
    CKPT_DIR_ENV,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REQUEUE,
    LAUNCH_ID_ENV,
    PREEMPT_SIGNALS,
    RDZV_ROUND_ENV,
    REPRODUCIBLE_MATH_ENV,
    RUN_DIR_ENV,
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
from ddpkit.train.node_flags import (
    NodeError,
    build_parser,
    parse_flags,
    planned_world,
    split_argv,
)
from ddpkit.train.outcome import (
    PREFIX,
    Failure,
    WorkerEnd,
    culprit,
    last_attempt_exits_0,
    outcome,
    signame,
)

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


# The workers' side of a user's script or module: `python -m ddpkit.train.node RUN_ENTRY
# [-m] TARGET ARGS` runs it as `python [-m] TARGET ARGS` would (run_entry below).
RUN_ENTRY = "--run-entry"


def wrap_user_entry(args: argparse.Namespace) -> None:
    """Run a user's Python script or module (not --no-python, --run-path or the legacy
    --local-rank argument) through run_entry on every worker: an unhandled KeyboardInterrupt
    (Ctrl-C, which torchrun forwards to every rank) then ends a rank quietly with 130 and the
    launcher prints the one line, instead of a traceback from every rank."""
    if args.no_python or args.run_path or not getattr(args, "use_env", True):
        return
    target = ["-m", args.training_script] if args.module else [args.training_script]
    args.module, args.training_script = True, "ddpkit.train.node"
    args.training_script_args = [RUN_ENTRY, *target, *args.training_script_args]


def run_entry(argv: list[str]) -> int:
    """`[-m] TARGET ARGS` in this interpreter, as `python [-m] TARGET ARGS` runs it
    (sys.argv, sys.path[0], __main__). An unhandled KeyboardInterrupt: exit 130 without a
    traceback. Any other exception: its traceback as Python prints it (through sys.excepthook,
    torch's rank prefix included), without this runner's frames, and exit 1."""
    import runpy

    from ddpkit.train import fault, teardown

    teardown.install()  # the exit waits for gloo's threads (train/teardown.py)
    fault.scope_rendezvous_to_attempt()  # a restart's group meets under its own keys
    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    sys.argv = [target, *args]
    try:
        if module:  # sys.path[0] is the working directory already, as for python -m
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            if os.path.isfile(target):  # a directory or zip is put on sys.path by run_path
                sys.path[0] = os.path.dirname(os.path.realpath(target))
            runpy.run_path(os.path.abspath(target), run_name="__main__")
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # the launcher says it once for the launch
    except SystemExit as e:
        if e.code in (None, 0):
            _note_returned()
        raise
    except BaseException as e:
        ours = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
        if "torch.distributed" in sys.modules:  # a collective that failed: who stopped?
            from ddpkit.train.fault import diagnose_script_failure

            with contextlib.suppress(Exception):
                diagnose_script_failure(e)
        failclass.note_cause(e)  # the user's code raised: the launcher does not retry it
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # it prints e.__traceback__
        return EXIT_FAILED
    _note_returned()
    return EXIT_OK


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


def workers_die_with_launcher() -> bool:
    """Every worker torchrun starts gets SIGKILL when this process dies (Linux
    PR_SET_PDEATHSIG, set in the child between fork and exec, kept across exec).

    torchrun starts each worker in a session of its own (start_new_session), so nothing
    else reaches them when the launcher is SIGKILLed (an OOM kill, SLURM's final KILL, a
    `kill -9`): a user script would live on holding its port and GPU. The kit's trainer
    sets the same signal on itself (ddpkit.train.startup_signals); this covers every entry
    point.
    The signal follows the forking thread: torchrun starts its workers from its main
    thread, which lives as long as the launcher. True when installed."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import subprocess

    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import (
            subprocess_handler as handler,
        )

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return False
    parent = os.getpid()

    def in_child() -> None:  # async-signal-safe work only: two syscalls
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before prctl: go now
            os.kill(os.getpid(), signal.SIGKILL)

    class Popen(subprocess.Popen):  # type: ignore[type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("preexec_fn", in_child)
            if _RDZV_ROUND and isinstance(kwargs.get("env"), dict):
                kwargs["env"][RDZV_ROUND_ENV] = str(_RDZV_ROUND[-1])
            super().__init__(*args, **kwargs)
            env = kwargs.get("env") or {}
            try:
                who = (
                    int(env["RANK"]),
                    goodput.attempt_number(env),  # the round, the same on every node
                    env.get(ERROR_FILE_ENV, ""),
                )
            except (KeyError, ValueError):
                return
            places.note(who[0], int(env.get("GROUP_RANK", 0)))
            goodput.launcher_attempt(who[1], int(env.get("LOCAL_RANK", 0)), env)
            _LAST_ATTEMPT[:] = [who[1]]
            watcher = threading.Thread(
                target=_watch_end, args=(self.pid, *who, dict(env)), daemon=True
            )
            watcher.start()
            _WATCHERS.append(watcher)
            _STOP_AT[:] = []  # a new attempt: its stop is still to come

    if getattr(handler, "Popen", None) is not subprocess.Popen:
        return False  # a torch whose handler changed: leave it alone
    handler.Popen = Popen  # type: ignore[misc]
    _note_rendezvous_rounds()
    return True


_RDZV_ROUND: list[int] = []  # the round of this node's last completed rendezvous
_LAST_ATTEMPT: list[int] = []  # the attempt this node's workers last started in (goodput's)


def _note_rendezvous_rounds() -> None:
    """Keep the round each rendezvous of this agent completed (c10d's dynamic rendezvous,
    which --standalone uses too): the workers key their attempt's store by it
    (contract.RDZV_ROUND_ENV). Another torch, another rendezvous: left alone (the workers
    then fall back to torchrun's per-node restart count)."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

        cls = dr.DynamicRendezvousHandler
        original = cls.next_rendezvous
    except (ImportError, AttributeError):
        return
    if getattr(original, "_ddpkit", False):
        return

    def next_rendezvous(self: Any) -> Any:
        info = original(self)
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            _RDZV_ROUND.append(int(self._state_holder.state.round))
        return info

    next_rendezvous._ddpkit = True  # type: ignore[attr-defined]
    cls.next_rendezvous = next_rendezvous  # type: ignore[method-assign]


_PR_SET_PDEATHSIG = 1

# Each worker's end as it happened (pid -> WorkerEnd), which torchrun's ProcessFailure lacks:
# its timestamp is whole seconds read when the agent polls (a rank the agent stopped after
# another one's failure ties with it), and a rank that exits 0 is not reported at all.
ENDS: dict[int, WorkerEnd] = {}
_WATCHERS: list[threading.Thread] = []
_STOP_AT: list[float] = []  # when torchrun began stopping this attempt's workers


def note_first_stop() -> None:
    """Note when torchrun begins stopping the workers (a failure seen, or a stop signal):
    a worker that exited 0 before then left of its own accord, while the others ran."""
    from torch.distributed.elastic.multiprocessing import api

    close = api.SubprocessContext._close
    if getattr(close, "noted", False):
        return

    def noted(self: Any, *args: Any, **kwargs: Any) -> None:
        if not _STOP_AT:
            _STOP_AT.append(time.time())
        close(self, *args, **kwargs)

    noted.noted = True  # type: ignore[attr-defined]
    api.SubprocessContext._close = noted  # type: ignore[method-assign]


def stops_keep_the_shutdown_budget(budget_s: int) -> None:
    """torchrun (2.14) stops workers without a stop signal in two places, each with a fixed
    30 s before the SIGKILL, whatever --shutdown-timeout says (only a stop signal's shutdown
    honours it): the agent's `_stop_workers` for a restart (another node's failure), and the
    process context's `_poll`, which closes the node's other workers as soon as one of them
    failed. A rank that cannot act on SIGTERM (stopped, stuck in a collective) held the
    restart those 30 s: a stopped rank's detection took 46-53 s with timeout_s 15 and
    shutdown_timeout_s 3 (the agent's path), then 51.7 s in the 15-minute SLURM drill (the
    poll's: the stopped rank shared its node with a rank whose collective failed). Both end
    in the process context's close(), which now waits the job's budget at most."""
    from torch.distributed.elastic.multiprocessing import api as mp_api

    ctx = mp_api.PContext
    if getattr(ctx.close, "_ddpkit", False):
        return
    close = ctx.close

    def close_within_budget(self: Any, death_sig: Any = None, timeout: int = budget_s) -> None:
        close(self, death_sig, min(timeout, budget_s))

    close_within_budget._ddpkit = True  # type: ignore[attr-defined]
    ctx.close = close_within_budget  # type: ignore[method-assign]


def worker_ends(wait_s: float = 5.0) -> dict[int, WorkerEnd]:
    """ENDS once every watcher has written its worker's end: torchrun may report a failure
    before the watcher thread of that worker ran (a loaded node), and an untimed end would
    fall back to torchrun's whole-second stamps."""
    deadline = time.monotonic() + wait_s
    for watcher in _WATCHERS:
        watcher.join(max(0.0, deadline - time.monotonic()))
    return ENDS


def _watch_end(
    pid: int, rank: int, attempt: int, error_file: str, env: dict[str, str] | None = None
) -> None:
    """Wait for the worker's end without reaping it (torchrun's poll reaps), and note it; a
    failed end also goes to the attempt's store (`env`: the worker's), where peers waiting
    for its report of a failed collective stop waiting (fault.publish_end)."""
    code = None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        if info is not None:
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    except ChildProcessError:  # reaped already: its code is torchrun's to tell
        pass
    returned = None
    if error_file:
        with contextlib.suppress(OSError, ValueError):
            returned = float(Path(error_file + RETURNED_SUFFIX).read_text())
    # Not a stop's own ends: its SIGTERMs, and the SIGKILLs of workers past the budget, say
    # nothing new, and after a stop signal the store may be on its way down (torch's client
    # then printed a C++ stack trace on a clean stop's stderr).
    stopped = code == -signal.SIGTERM or (bool(_STOP_AT) and code == -signal.SIGKILL)
    # Nor a Ctrl-C's: it reaches every rank (torchrun forwards it; a terminal signals the whole
    # group, maybe before this launcher's handler ran), so no peer waits on this rank's report,
    # and the store is going down: a publish then printed torch's `recvValue failed` warning
    # after the launcher's one line (CI of 41026cf).
    interrupted = code in (EXIT_INTERRUPTED, -signal.SIGINT)
    if code and not stopped and not interrupted and env is not None:
        from ddpkit.train import fault

        threading.Thread(target=fault.publish_end, args=(env, rank, code), daemon=True).start()
    ENDS[pid] = end = WorkerEnd(rank, code, time.time(), attempt, returned)
    goodput.launcher_end(rank, code, end.when, attempt, error_file, returned, stopped)


# run_entry notes when a user's script or module returned (beside the worker's torchrun
# error file): a rank still in its interpreter's exit when torchrun stops it has left all
# the same, whatever its exit status then.
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
RETURNED_SUFFIX = ".ddpkit-returned"


def _note_returned() -> None:
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path + RETURNED_SUFFIX).write_text(repr(time.time()))


def one_stop_signal() -> None:
    """The launch's first stop signal is its only one: torchrun raises SignalException for
    every signal it handles, also for one that comes while it is stopping the workers for
    the first. That second exception cuts the first shutdown short, and torchrun's `finally`
    stops the workers again with SIGTERM: a Ctrl-C (which `ddpkit run` repeats to the
    launcher) reached the trainer as a preemption, and the launcher said `exit 130, not
    requeued` while the trainer said `exiting 75 (requeue)`. Later ones are ignored; the
    shutdown budget still ends workers that do not stop."""
    from torch.distributed.elastic.multiprocessing import api

    raise_it = api._terminate_process_handler
    if getattr(raise_it, "once", False):
        return
    seen: list[int] = []

    def first_only(signum: int, frame: Any) -> None:
        if not seen:
            seen.append(signum)
            raise_it(signum, frame)

    first_only.once = True  # type: ignore[attr-defined]
    api._terminate_process_handler = first_only


def _quiet_torch_logs() -> None:
    # torchelastic logs a multi-line banner per failure and per signal; the outcome line
    # replaces them. DDPKIT_DEBUG / LOGLEVEL=INFO keep them for debugging.
    if os.environ.get("LOGLEVEL") or os.environ.get("DDPKIT_DEBUG"):
        return
    import torch.distributed.elastic.agent.server.api  # noqa: F401  (its logger exists now)

    # torch sets a level on each of its loggers, so the parent's level is not enough.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


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

    run_dir, timeout_s = own.run_dir, own.shutdown_timeout
    if is_default_entry(entry):
        cfg = precheck_train(entry[2:], world_size, nnodes)
        refuse_dirs_in_use(cfg)
        run_dir = run_dir or cfg.run_dir
        if timeout_s is None:
            timeout_s = cfg.shutdown_timeout_s
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
    os.environ[RUN_DIR_ENV] = str(Path(run_dir))
    os.environ.setdefault(CKPT_DIR_ENV, default_ckpt_dir(run_dir))  # the job's, when it set one
    os.environ[SHUTDOWN_ENV] = str(args.shutdown_timeout)
    for name, value in REPRODUCIBLE_MATH_ENV.items():  # the job's own value wins
        os.environ.setdefault(name, value)
    # A script's own directory comes first on its sys.path, not the submit directory: put the
    # submit directory (the repository root) next, so `from train import preempt` resolves.
    paths = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _quiet_torch_logs()
    workers_die_with_launcher()
    places.install()
    note_first_stop()
    stops_keep_the_shutdown_budget(args.shutdown_timeout)
    one_stop_signal()
    failclass.stop_retrying_code_failures(
        lambda fs: culprit({int(r): Failure.of(f, ENDS.get(f.pid)) for r, f in fs.items()})
    )

    failures: dict[int, Failure] = {}
    stopped_by: int | None = None
    started = time.time()
    try:
        torchrun.run(args)
    except ChildFailedError as e:
        ends = worker_ends()
        failures = {int(rank): Failure.of(f, ends.get(f.pid)) for rank, f in e.failures.items()}
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
    left = last_attempt_exits_0(worker_ends())
    code, line = outcome(failures, fresh, finished, left, min(_STOP_AT, default=None))
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
    if line and failclass.STOPPED and code == EXIT_FAILED:
        err = failclass.STOPPED[0][1] or "an exception"
        line += f"; its own code raised {err}: not retried (a restart would fail the same way)"
    # The goodput first: the outcome line stays the launch's last word.
    said = goodput.launcher_exit(
        run_dir,
        code == EXIT_REQUEUE,
        int(args.node_rank),
        *(_LAST_ATTEMPT or [None]),
        finished=code == EXIT_OK,
    )
    for text in (said, line):
        if text:
            print(text, file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == [RUN_ENTRY]:  # a worker: the user's entry point, not the launcher
        sys.exit(run_entry(sys.argv[2:]))
    sys.exit(run_cli(main))
