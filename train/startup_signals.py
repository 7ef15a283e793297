"""What `python -m ddpkit.train` does before anything heavy: stop-signal handlers and parent death.

Imported and installed first thing (torch-free, a few ms), so a stop signal that arrives
while torch imports, the process group forms or the data loads is recorded rather than
killing the worker silently; the trainer's StopRequest adopts it and acts at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from ddpkit.train.contract import STOP_SIGNALS

_received: list[tuple[int, float]] = []
_PR_SET_PDEATHSIG = 1


def _record(signum: int, frame: object) -> None:
    if not _received:  # the first one counts; torchrun may forward a second
        _received.append((signum, time.time()))


def install() -> None:
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _record)
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
