"""Preemption for your own training script, in a few lines (import-light: no torch).

    from ddpkit.train import preempt

    preempt.install()                       # once, early (main thread)
    for step in range(start, steps):
        ...                                 # one training step
        sig = torch.tensor([preempt.signal_number()])   # 0 until a stop signal came here
        dist.all_reduce(sig, op=dist.ReduceOp.MAX)      # every rank: the same signal
        if preempt.agree(int(sig.item())):  # True on every rank at the same step
            save_checkpoint(step)           # your own save; you have preempt.seconds_left()
            preempt.request_requeue(step=step)   # local rank 0 writes the marker; others no-op
            break                           # then exit normally

The contract (the same under every backend, set by the node launcher, train/node.py):
  - the stop signal is SIGTERM (Kubernetes pod deletion, docker stop, `cancel local`, a SLURM
    preemption) or SLURM's --signal (slurm.signal: USR1 by default, sent slurm.grace_s
    seconds before the time limit); torchrun forwards it to every worker;
  - from then on a worker has DDPKIT_SHUTDOWN_TIMEOUT_S seconds (train.shutdown_timeout_s,
    rounded up) before torchrun kills it;
  - `request_requeue()` writes <run dir>/requeue.json with this launch's id; the launcher
    then exits 75 and SLURM requeues the job (Kubernetes restarts the pod, Docker reports 75).
    Without it, the launch ends with 128 + the signal number and is not requeued;
  - on SLURM only its --signal asks for a requeue: a plain `scancel` (SIGTERM) is a cancel,
    so `request_requeue()` writes nothing then (DDPKIT_REQUEUE_SIGNALS, train/contract.py)
    and the job ends with your save on disk.
A script that never calls this module still ends cleanly: the signal ends it, exit 143.
Ranks see a signal at slightly different steps, and some only through their peers (each
SLURM node's slurmd signals its own processes). So agree on the signal itself, not on a flag:
the MAX all-reduce of `signal_number()` (as the kit's trainer does), then `agree()`. A rank
that learned of a plain `scancel` from a peer then knows it was a cancel and asks for no
requeue; with a bare flag it would ask for one.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from ddpkit.train.contract import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    PREEMPT_SIGNALS,
    RUN_DIR_ENV,
    SHUTDOWN_ENV,
    asks_requeue,
    write_requeue_marker,
)

_received: dict[str, Any] = {}  # {"signal": name, "at": epoch seconds} once a signal came
_installed = False


def _handler(signum: int, _frame: object) -> None:
    _received.setdefault("signal", signal.Signals(signum).name)
    _received.setdefault("at", time.time())


def install() -> None:
    """Catch the stop signals (record them, do not die). Call once, from the main thread."""
    global _installed
    if not _installed:
        for name in PREEMPT_SIGNALS:
            signal.signal(getattr(signal, name), _handler)
        _installed = True


def stop_requested() -> bool:
    """True once a stop signal arrived (installs the handlers on the first call)."""
    install()
    return bool(_received)


def signal_number() -> int:
    """The number of the stop signal this rank goes by (0 before one): the first received
    here, or the one `agree` recorded. All-reduce it with MAX across ranks, then `agree`."""
    name = _received.get("signal")
    return int(getattr(signal, name)) if name else 0


def agree(signum: int) -> bool:
    """Record the signal the ranks agreed on (the MAX all-reduce of `signal_number()`; 0 for
    none) and say whether to stop. A rank that had no signal of its own, or another one, now
    goes by the agreed one, so every rank's `request_requeue` decides alike. The shutdown
    budget counts from this rank's own signal, else from now."""
    if not signum:
        return False
    _received["signal"] = signal.Signals(signum).name
    _received.setdefault("at", time.time())
    return True


def received_signal() -> str | None:
    """The name of the stop signal this rank goes by, e.g. "SIGTERM" (the first received, or
    the agreed one); None before one."""
    return _received.get("signal")


def seconds_left() -> float:
    """Seconds until torchrun kills this worker (the whole budget before a signal)."""
    budget = float(os.environ.get(SHUTDOWN_ENV) or DEFAULT_SHUTDOWN_TIMEOUT_S)
    if not _received:
        return budget
    return budget - (time.time() - _received["at"])


def request_requeue(**info: Any) -> Path | None:
    """Ask the launcher to requeue this job (call after your checkpoint is saved, on every
    rank). One process per node writes (local rank 0: each node's launcher reads its own
    run dir, which need not be shared, e.g. a Kubernetes pod without a claim); returns the
    marker path, or None on other ranks, outside the ddpkit launcher, or when the signal
    this rank goes by (received, or agreed) is a cancel here (SIGTERM on SLURM: not its
    --signal). A rank with no signal at all (it stopped on a bare flag from its peers)
    writes one, as before: `agree` is what lets it know better."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    local = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
    if local != "0" or not run_dir:
        return None
    if _received and not asks_requeue(received_signal()):
        return None
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    return write_requeue_marker(run_dir, signal=received_signal(), **info)
