"""A worker's interpreter exits only after gloo's worker threads have let go of their last work.

The abort this prevents: `terminate called without an active exception` (SIGABRT) at the
exit of a rank whose run had finished. What happens (forced in
tests/process/launch/test_teardown.py, whose LD_PRELOAD holds a gloo thread before it takes the
GIL):
  1. torch 2.14's backward (torch/autograd/graph.py, _engine_run_backward) stashes a
     `contextvars.Context` in the thread-local Python objects for the whole pass.
  2. A gloo collective launched in backward (DDP's gradient buckets, FSDP's reduce-scatter)
     is an AsyncWork that captures the caller's at::ThreadLocalState, that Context included.
  3. The gloo thread that runs it (`pt_gloo_runloop`) completes the work's future first and
     drops its own reference after. Dropping the last one decrefs the Context, which takes
     the GIL.
  4. Under CPU contention that thread can be preempted between the two for longer than the
     main thread needs to return from the last step and start finalizing the interpreter.
     CPython 3.11 ends a thread that asks for the GIL during finalization with pthread_exit;
     its forced unwind reaches AsyncWork's noexcept destructor, and the C++ runtime calls
     std::terminate.
destroy_process_group does not join these threads (gloo's shutdown is not a join), and a
DDP module sits in a reference cycle, so its process group lives into finalization.

The fix: an atexit handler, which CPython runs before it starts finalizing, waits with the
GIL released until every `pt_gloo_runloop` thread of this process is parked. That means
asleep, and not woken once (no context switch) for QUIET_S. A thread that still needs the
GIL cannot look parked that long: the waiter in take_gil wakes every 5 ms, and our sleep
leaves the GIL free. A thread preempted mid-work is runnable, so it does not look parked
either. The wait is bounded (WAIT_S); past it the exit goes on as before, and the launcher's
one forgiven case (train/outcome.py: summary.json written, then SIGABRT) still applies.

Linux only (/proc), torch-free and import-light: installed first thing by the kit's trainer
(train/__main__.py) and by run_entry for a user's script (train/node.py). A process without
gloo threads pays one directory listing.
"""

from __future__ import annotations

import atexit
import os
import time

GLOO_WORKER = "pt_gloo_runloop"  # c10::setThreadName in ProcessGroupGloo::runLoop
QUIET_S = 0.05  # parked for this long, with the GIL free, without a single wake-up
POLL_S = 0.01
WAIT_S = 10.0  # a generous bound: a preempted thread on a loaded node waits its turn

_TASKS = "/proc/self/task"
_installed = False


def gloo_workers() -> list[str]:
    """The task ids of this process's gloo worker threads."""
    found = []
    try:
        tids = os.listdir(_TASKS)
    except OSError:  # not Linux: nothing to wait for
        return []
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                if f.read().strip() == GLOO_WORKER:
                    found.append(tid)
        except OSError:  # the thread ended while we looked
            continue
    return found


def _sample(tid: str) -> tuple[str, int, int] | None:
    """(scheduler state, voluntary and involuntary context switches), or None once gone:
    all three from /proc/self/task/TID/status."""
    try:
        with open(f"{_TASKS}/{tid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return (
            fields["State"].split()[0],
            int(fields["voluntary_ctxt_switches"]),
            int(fields["nonvoluntary_ctxt_switches"]),
        )
    except (OSError, KeyError, IndexError, ValueError):
        return None


def wait_for_idle_gloo_workers(
    wait_s: float = WAIT_S, quiet_s: float = QUIET_S, poll_s: float = POLL_S
) -> bool:
    """True once every gloo worker thread is parked (or there is none); False after wait_s.
    Each poll sleeps, so the GIL is free for any thread that still needs it. The threads are
    listed once: a process group started at exit is not one this wait could help."""
    deadline = time.monotonic() + wait_s
    tids = gloo_workers()
    last: dict[str, tuple[str, int, int]] = {}
    quiet_since = None
    while True:
        now = {tid: s for tid in tids if (s := _sample(tid)) is not None}
        if not now:
            return True
        if now == last and all(s[0] == "S" for s in now.values()):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return True
        else:
            quiet_since = None
        if time.monotonic() >= deadline:
            return False
        last = now
        time.sleep(poll_s)


def install() -> None:
    """Register the wait to run at interpreter exit (once per process). atexit handlers run
    last-registered first, so a user's own handlers registered later (a collective, a log
    flush) run before it."""
    global _installed
    if not _installed:
        atexit.register(wait_for_idle_gloo_workers)
        _installed = True
