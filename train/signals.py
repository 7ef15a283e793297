"""Stop signals in the workers: recorded from a worker's first line, agreed on by every rank at a
step boundary.

`install()` is what `python -m ddpkit.train` does before anything heavy (torch-free, a few
ms), so a stop signal that arrives while torch imports, the process group forms or the data
loads is recorded rather than killing the worker silently; the trainer's StopRequest adopts
it and acts at once. StopRequest imports torch when it is made.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

from ddpkit.train import contract, failure

# SIGTERM: SLURM preemption and time limits, Kubernetes pod deletion, docker stop, torchrun's
# shutdown. SIGUSR1/SIGUSR2: what sites configure with `#SBATCH --signal` (submitit uses USR2).
# SIGINT: Ctrl-C (torchrun forwards it): saved too, but a stop, not a requeue.
STOP_SIGNALS = tuple(getattr(signal, name) for name in contract.STOP_SIGNALS)

_received: list[tuple[int, float]] = []
_PR_SET_PDEATHSIG = 1


def _record(signum: int, frame: object) -> None:
    if not _received:  # the first one counts; torchrun may forward a second
        _received.append((signum, time.time()))


def install() -> None:
    for s in STOP_SIGNALS:
        signal.signal(s, _record)
    die_with_parent()


def received() -> tuple[int, float] | None:
    """(signal number, when) of the first stop signal since install(), else None."""
    return _received[0] if _received else None


def die_with_parent() -> bool:
    """Under torchrun: SIGKILL this worker when its agent dies (Linux prctl), so a killed
    agent leaves no workers training on into a requeued job's run dir. True when set."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class StopRequest:
    """Records a stop signal; ranks agree on it at a step boundary through a collective."""

    def __init__(self, boundary_timeout_s: float) -> None:
        self.signum = 0
        self.received_at = 0.0
        self.acknowledged = threading.Event()
        self.boundary_timeout_s = boundary_timeout_s
        import torch  # here, not at import: install() runs before torch loads

        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None  # the pipelined all-reduce in flight (a dist.Work)
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)
        got = received()  # a signal during start-up, recorded there
        if got is not None and not self.signum:
            self._handle(got[0], None)
            self.received_at = got[1]

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum:  # the first one counts; torchrun may forward a second
            return
        self.signum, self.received_at = signum, time.time()
        # A rank stuck in a step (a hang, a dead peer) never reaches the boundary where the
        # save happens; rather than make the launcher wait for its SIGKILL, leave promptly.
        threading.Thread(target=self._watchdog, daemon=True).start()

    def _watchdog(self) -> None:
        if not self.acknowledged.wait(self.boundary_timeout_s):
            name = signal.Signals(self.signum).name
            print(
                f"error: {name} received but the current step did not finish within "
                f"{self.boundary_timeout_s:g} s (stuck in a collective?); exiting without a "
                "checkpoint",
                file=sys.stderr,
                flush=True,
            )
            failure.tell_launcher(f"stuck when {name} came", stuck=True)
            os._exit(1)

    def agreed(self, group: Any = None) -> int:
        """The signal number if any rank had one at the previous step boundary, else 0.

        Collective, pipelined by one step: each boundary waits for the MAX all-reduce of the
        flags started at the boundary before, then starts the next one, so the reduction runs
        while the step computes instead of stalling it (measured: a blocking one-int
        all-reduce cost ~0.8 ms of a 6.5 ms CPU step). Every rank sees the same value at the
        same boundary, so all leave the loop after the same step and the checkpoint they
        write together is consistent. It runs on a CPU (gloo) group: no GPU synchronisation.
        """
        import torch.distributed as dist

        got = 0
        if self._work is not None:
            self._work.wait()
            got = int(self._flag.item())
        self._flag.fill_(self.signum)
        self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=group, async_op=True)
        if got:
            if not self.signum:  # another rank got it: time the save from now
                self.signum, self.received_at = got, time.time()
            self.acknowledged.set()
        return got

    def agree_now(self, group: Any = None) -> int:
        """Blocking: the signal number if any rank has one now, else 0 (collective). For the
        edges of the loop: before the first step (a signal during start-up) and after the
        last (a signal in the final steps that the pipelined check has not delivered)."""
        import torch
        import torch.distributed as dist

        self.drain()
        flag = torch.tensor([self.signum], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        got = int(flag.item())
        if got:
            if not self.signum:
                self.signum, self.received_at = got, time.time()
            self.acknowledged.set()
        return got

    def drain(self) -> None:
        """Wait for the all-reduce in flight (before the group's next use or teardown)."""
        if self._work is not None:
            self._work.wait()
            self._work = None


def stop_check_every(target_s: float, step_time_s: float) -> int:
    """Steps between stop-signal agreements: about every `target_s` seconds (at most 100
    steps). From the step time averaged over ranks, so every rank gets the same number."""
    if target_s <= 0 or step_time_s <= 0:
        return 1
    # The check is pipelined: a signal waits up to one interval to be sent and one more to
    # be read, so agreeing every target/2 keeps signal-to-action within the target.
    return max(1, min(100, int(target_s / 2 / step_time_s)))
