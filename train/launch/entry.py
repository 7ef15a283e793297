"""The workers' side of a user's script or module: `python -m ddpkit.train.launch.entry
[-m] TARGET ARGS` runs it exactly as `python [-m] TARGET ARGS` would (sys.argv, sys.path[0],
__main__), on every rank the node launcher starts for it (wrap_user_entry), and tells the
launcher how it ended: an unhandled KeyboardInterrupt (Ctrl-C, which torchrun forwards to
every rank) ends a rank quietly with 130 and the launcher prints the one line; an exception
or a nonzero `sys.exit` of the user's code is noted as the code's failure
(ddpkit.train.failure), which the launcher never retries; a return is noted beside the
worker's error file, so a rank still in its interpreter's exit when torchrun stops it has
left all the same. Imports no torch itself (the script does).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from ddpkit.train import failure
from ddpkit.train.contract import COLLECTIVE_TIMEOUT_ENV, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

# `python -m ddpkit.train.node --run-entry [-m] TARGET ARGS`, the worker command of earlier
# releases, still runs a user's entry through run_entry (a queued job's script keeps working).
RUN_ENTRY = "--run-entry"
ENTRY_MODULE = "ddpkit.train.launch.entry"
RETURNED_SUFFIX = ".ddpkit-returned"


def wrap_user_entry(args: argparse.Namespace) -> None:
    """Run a user's Python script or module (not --no-python, --run-path or the legacy
    --local-rank argument) through run_entry on every worker (torchrun's parsed `args`)."""
    if args.no_python or args.run_path or not getattr(args, "use_env", True):
        return
    target = ["-m", args.training_script] if args.module else [args.training_script]
    args.module, args.training_script = True, ENTRY_MODULE
    args.training_script_args = [*target, *args.training_script_args]


def run_entry(argv: list[str]) -> int:
    """`[-m] TARGET ARGS` in this interpreter, as `python [-m] TARGET ARGS` runs it
    (sys.argv, sys.path[0], __main__). An unhandled KeyboardInterrupt: exit 130 without a
    traceback. Any other exception: its traceback as Python prints it (through sys.excepthook,
    torch's rank prefix included), without this runner's frames, and exit 1."""
    import runpy

    from ddpkit.train import diagnosis, teardown

    teardown.install()  # the exit waits for gloo's threads (train/teardown.py)
    diagnosis.scope_rendezvous_to_attempt()  # a restart's group meets under its own keys
    bound_collectives()
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
        else:  # the code's own decision to fail (`sys.exit(1)`): the same on every attempt
            failure.note_cause(e)
        raise
    except BaseException as e:
        ours = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
        explained = None
        if "torch.distributed" in sys.modules:  # a collective that failed: who stopped?
            from ddpkit.train.diagnosis import diagnose_script_failure

            with contextlib.suppress(Exception):
                explained = diagnose_script_failure(e)
        failure.note_cause(e)  # the user's code raised: the launcher does not retry it
        if explained and not os.environ.get("DDPKIT_DEBUG"):
            # Another rank's end or hang explains it: one line, not a traceback from every
            # surviving rank (a kill on 4 ranks printed 36 lines of gloo's).
            rank = os.environ.get("RANK", "?")
            print(f"[rank{rank}]: {explained}", file=sys.stderr, flush=True)
            return EXIT_FAILED
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in ours:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # it prints e.__traceback__
        return EXIT_FAILED
    _note_returned()
    return EXIT_OK


def bound_collectives(env: dict[str, str] | None = None) -> float | None:
    """The default timeout of the process groups the user's code makes (init_process_group
    without `timeout=`): the job's collective timeout (contract.COLLECTIVE_TIMEOUT_ENV), not
    torch's 30 minutes (gloo) or 10 (NCCL). A rank hung in the user's code, stopped or gone
    then fails its peers' next collective within the job's timeout, and they say which rank
    never came (diagnosis.diagnose_script_failure); the launcher ends the attempt. A script
    that passes its own timeout keeps it. Returns the seconds set, None when none."""
    raw = (os.environ if env is None else env).get(COLLECTIVE_TIMEOUT_ENV, "")
    try:
        seconds = float(raw)
    except ValueError:
        return None
    if not 0 < seconds < float("inf"):
        return None
    from datetime import timedelta

    from torch.distributed import distributed_c10d  # the script imports torch anyway

    distributed_c10d.default_pg_timeout = timedelta(seconds=seconds)
    if isinstance(getattr(distributed_c10d, "default_pg_nccl_timeout", None), timedelta):
        distributed_c10d.default_pg_nccl_timeout = timedelta(seconds=seconds)
    return seconds


def _note_returned() -> None:
    path = os.environ.get(failure.ERROR_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path + RETURNED_SUFFIX).write_text(repr(time.time()))


def returned_at(error_file: str) -> float | None:
    """When the worker whose error file is `error_file` returned from the user's code, if it
    did (the launcher reads it at the worker's end)."""
    if not error_file:
        return None
    with contextlib.suppress(OSError, ValueError):
        return float(Path(error_file + RETURNED_SUFFIX).read_text())
    return None


if __name__ == "__main__":
    sys.exit(run_entry(sys.argv[1:]))
