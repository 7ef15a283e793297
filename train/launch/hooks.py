"""Every patch the node launcher makes to torchrun's private API, in one place: what a torch
upgrade (the supported range is in pyproject.toml) must check again, one read.

torchrun (torch.distributed.run, its elastic agent and its process contexts) is run in the
launcher's own process (ddpkit.train.launch.node); these hooks add what its public flags do
not offer: each worker's end timed as it happens (`_watch_end`, ENDS), workers that die with
their launcher, the rendezvous round every node shares, the stop of an attempt timed and
held to the job's shutdown budget, a second stop signal ignored, torchelastic's banners
quieted, the user's code failing never retried (`stop_retrying_code_failures`) and every
rank's place learnt at the rank assignment (`learn_places`). Each checks that the thing it
patches is still what it expects, and leaves a torch that changed alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpkit.train import failure, goodput, places
from ddpkit.train.contract import EXIT_INTERRUPTED, EXIT_REQUEUE, RDZV_ROUND_ENV
from ddpkit.train.launch import entry
from ddpkit.train.launch.outcome import WorkerEnd, left_early


def workers_die_with_launcher() -> bool:
    """Every worker torchrun starts gets SIGKILL when this process dies (Linux
    PR_SET_PDEATHSIG, set in the child between fork and exec, kept across exec).

    torchrun starts each worker in a session of its own (start_new_session), so nothing
    else reaches them when the launcher is SIGKILLed (an OOM kill, SLURM's final KILL, a
    `kill -9`): a user script would live on holding its port and GPU. The kit's trainer
    sets the same signal on itself (ddpkit.train.signals); this covers every entry
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
                    env.get(failure.ERROR_FILE_ENV, ""),
                )
            except (KeyError, ValueError):
                return
            places.note(who[0], int(env.get("GROUP_RANK", 0)))
            ENVS[who[0]] = dict(env)
            goodput.launcher_attempt(who[1], int(env.get("LOCAL_RANK", 0)), env)
            LAST_ATTEMPT[:] = [who[1]]
            watcher = threading.Thread(
                target=_watch_end, args=(self.pid, *who, dict(env), self), daemon=True
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
LAST_ATTEMPT: list[int] = []  # the attempt this node's workers last started in (goodput's)


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
ENVS: dict[int, dict[str, str]] = {}  # rank -> the environment its worker was started with
_WATCHERS: list[threading.Thread] = []
# The other nodes' workers that left of their own accord ({rank: when}), as their launchers
# wrote them into the rendezvous store (left_ranks); kept for the launcher's last word, when
# the store may be gone.
REMOTE_LEFT: dict[int, float] = {}
_LEFT_KEY = "ddpkit/left/"  # + round/node: {rank: when} of a node whose workers all finished
_FAILED_KEY = "ddpkit/failed/"  # + round: a node's workers failed (set by its launcher)
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
    pid: int,
    rank: int,
    attempt: int,
    error_file: str,
    env: dict[str, str] | None = None,
    proc: Any = None,  # its subprocess.Popen
) -> None:
    """Wait for the worker's end without reaping it (torchrun's poll reaps), and note it; a
    failed end also goes to the attempt's store (`env`: the worker's), where peers waiting
    for its report of a failed collective stop waiting (fault.publish_end)."""
    code = None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        if info is not None:
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
    except ChildProcessError:
        # Reaped by torchrun's poll between the exit waking this thread and the thread
        # running (a loaded node): the code is in the Popen that reaped it. Before, that end
        # went unnoted, and a SIGKILLed rank's peer that gave up waiting for it was reported
        # as the failure ("hang rank 1" for a killed rank 1, 3 local runs in 11 under load).
        code = _reaped_code(proc)
    returned = entry.returned_at(error_file)
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
        from ddpkit.train import diagnosis

        threading.Thread(target=diagnosis.publish_end, args=(env, rank, code), daemon=True).start()
    ENDS[pid] = end = WorkerEnd(rank, code, time.time(), attempt, returned)
    goodput.launcher_end(rank, code, end.when, attempt, error_file, returned, stopped)


def _reaped_code(proc: Any, wait_s: float = 1.0) -> int | None:
    """The exit status torchrun's poll read (Popen.returncode: -N for signal N), once set."""
    deadline = time.monotonic() + wait_s
    while proc is not None:
        code = proc.returncode
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(0.01)
    return None


def _multi_node(env: dict[str, str] | None) -> bool:
    try:
        return int((env or {})["WORLD_SIZE"]) > int((env or {})["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return False


def left_ranks(store: Any = None, nodes: int = 0) -> dict[int, float]:
    """{rank: when} of the last attempt's workers that left of their own accord: this node's
    (ENDS) and the other nodes' (what their launchers wrote into the rendezvous store, read
    from `store`, the agent's own connection to it, when given; else as last read)."""
    from ddpkit.train.launch.outcome import last_attempt_exits_0

    if store is not None:
        for node in range(nodes):
            key = f"{_LEFT_KEY}{_round()}/{node}"
            with contextlib.suppress(Exception):
                if store.check([key]):
                    REMOTE_LEFT.update(
                        {int(r): float(t) for r, t in json.loads(store.get(key)).items()}
                    )
    return {**REMOTE_LEFT, **last_attempt_exits_0(ENDS)}


def _round() -> int:
    return _RDZV_ROUND[-1] if _RDZV_ROUND else 0


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


# What stopped the retries of this launch (the culprit's rank and error), for the end line.
STOPPED: list[tuple[int, str]] = []  # (rank, why not retried), for the launcher's last line


def timed(failed: dict[Any, Any]) -> dict[int, failure.Failure]:
    """{rank: Failure} from torchrun's {rank: ProcessFailure}, each timed by this launcher's
    watch of the worker's end when it saw it (ENDS, by pid)."""
    out = {}
    for rank, f in failed.items():
        end = ENDS.get(f.pid)
        out[int(rank)] = failure.Failure.of(f, end.when if end is not None else None)
    return out


def _say_restart(failures: dict[int, failure.Failure], remaining: int) -> None:
    """One line before torchrun restarts the workers in place: what failed, and from where the
    next attempt goes on (the surviving ranks' tracebacks are cut to a line each)."""
    rank, first = failure.culprit(failures)
    if first.missing:
        what = (
            f"{places.names(list(first.missing))} never reached the collective "
            f"{first.phase or ''} (a hang; {places.name(rank)} timed out waiting)"
        ).replace("  ", " ")
    else:
        plain = first.kind in (failure.CRASHED.name, failure.KILLED.name) or first.code < 0
        kind = "" if plain else f"{first.kind}, "  # e.g. the checkpoint store went away
        what = f"{places.name(rank)} failed ({kind}{failure.how(first.code)})"
    step = _newest_step()
    where = f"from the newest checkpoint (step {step})" if step else "from the newest checkpoint"
    left = f"{remaining - 1} restart{'s' if remaining - 1 != 1 else ''} left after this one"
    print(f"ddpkit node: {what}; restarting in place {where}, {left}", file=sys.stderr, flush=True)


def _newest_step() -> int | None:
    """The newest complete checkpoint's step in the job's checkpoint dir, when it is a local
    dir of the kit's layout (a user's own snapshot, or a store, says nothing here)."""
    from ddpkit.train.contract import CKPT_DIR_ENV, CKPT_MARKER, CKPT_STEP_PREFIX, is_remote

    ckpt_dir = os.environ.get(CKPT_DIR_ENV)
    if not ckpt_dir or is_remote(ckpt_dir):
        return None
    steps = []
    with contextlib.suppress(OSError):
        for d in os.scandir(ckpt_dir):
            n = d.name.removeprefix(CKPT_STEP_PREFIX)
            complete = os.path.exists(os.path.join(d.path, CKPT_MARKER))
            if d.name.startswith(CKPT_STEP_PREFIX) and n.isdigit() and complete:
                steps.append(int(n))
    return max(steps, default=None)


def stop_retrying_code_failures(culprit: Callable[[dict[int, Any]], tuple[int, Any]]) -> None:
    """Make torchrun's agent give up at once (no in-place restart) when the failure it sees
    is the user's code. `culprit`: {rank: ProcessFailure} -> (rank, failure.Failure), the
    launcher's own rule for the rank to blame (ddpkit.train.failure.culprit)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers
    if getattr(monitor, "classified", False):
        return

    def classified(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.is_failed() and _multi_node(next(iter(ENVS.values()), None)):
            # The other nodes learn it at once: one whose workers all finished waits in the
            # exit barrier for this node, which will not come (leave_a_failed_job).
            with contextlib.suppress(Exception):
                self._store.set(f"{_FAILED_KEY}{_round()}", "1")
        if result.is_failed() and result.failures and self._remaining_restarts > 0:
            # A worker that saved and asked for a requeue (a stop signal reached a peer's node:
            # a deleted pod) is never restarted in place: that peer is going away, and the
            # scheduler starts the next attempt on every node at once.
            if any(f.exitcode == EXIT_REQUEUE for f in result.failures.values()):
                self._remaining_restarts = 0
                return result
            rank, first = culprit(result.failures)
            if failure.is_code_failure(first.code, first.cause):
                self._remaining_restarts = 0
                err = first.error or "an exception"
                STOPPED.append(
                    (
                        rank,
                        f"its own code raised {err}: not retried (a restart would fail the same way)",
                    )
                )
                return result
            failures = {int(r): f for r, f in timed(result.failures).items()}
            nodes = int(getattr(worker_group, "group_world_size", 0) or 0)
            if early := left_early(failures, left_ranks(self._store, nodes), stopped_at()):
                # The same on every attempt (a shorter data shard, a rank-dependent return).
                self._remaining_restarts = 0
                STOPPED.append((early[0], "not retried (a rank that leaves early does so again)"))
                return result
            _say_restart(failures, self._remaining_restarts)
        return result

    classified.classified = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = classified  # type: ignore[method-assign]


def _learn(store: Any, group_rank: int, group_world_size: int, workers: list[Any]) -> None:
    keys = [f"{places.PLACE_KEY}{i}" for i in range(group_world_size)]
    if not all(store.check([k]) for k in keys):
        return  # a rendezvous without the barrier (TORCH_ELASTIC_WORKER_IDENTICAL): ours only
    entries = [json.loads(v) for v in store.multi_get(keys)]
    places.PLACES.clear()
    first = 0
    for place in entries:
        for r in range(first, first + int(place["n"])):
            places.PLACES[r] = (int(place["node"]), str(place["host"]))
        first += int(place["n"])


def learn_places() -> bool:
    """Learn every rank's place at each rendezvous (torchrun's rank assignment). True when
    installed; best effort, never in the way of the assignment itself."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    except ImportError:
        return False
    original = SimpleElasticAgent._assign_worker_ranks
    if getattr(original, "_ddpkit", False):
        return True

    def assign(self: Any, store: Any, group_rank: int, group_world_size: int, spec: Any) -> Any:
        mine = {
            "node": places.node_number(group_rank),
            "host": places.host(),
            "n": spec.local_world_size,
        }
        with contextlib.suppress(Exception):
            store.set(f"{places.PLACE_KEY}{group_rank}", json.dumps(mine))
        workers = original(self, store, group_rank, group_world_size, spec)
        places.PLACES.clear()
        for w in workers:
            places.PLACES[w.global_rank] = (mine["node"], mine["host"])
        with contextlib.suppress(Exception):
            _learn(store, group_rank, group_world_size, workers)
        return workers

    assign._ddpkit = True  # type: ignore[attr-defined]
    SimpleElasticAgent._assign_worker_ranks = assign  # type: ignore[method-assign]
    return True


def leave_a_failed_job() -> None:
    """A node whose workers all finished waits in torchrun's exit barrier for the other nodes
    (300 s). When a worker on another node failed meanwhile (the peers of a rank that left
    early fail in their next collective), the others never come, and both launchers sat with
    no workers until the job was cancelled (a SLURM drill: 4 min, twice). The barrier is
    torchrun's own, joined without blocking and polled on the agent's own connection to the
    rendezvous store (no new connection at a job's end: one to a store whose host had just
    exited printed C++ stack traces after a clean run): it ends when every node arrived, or
    when another node's launcher said its workers failed. Before joining, this node says
    which of its workers left of their own accord, for the failed node's launcher to name."""
    from torch.distributed.elastic.agent.server import api

    original = api.SimpleElasticAgent._exit_barrier
    if getattr(original, "_ddpkit", False):
        return
    try:
        from torch.distributed.elastic.utils.store import _barrier_nonblocking
    except ImportError:
        return  # another torch: its own barrier, as it is
    sync_key = getattr(api, "_TERMINAL_STATE_SYNC_ID", None)
    if sync_key is None:
        return

    def exit_barrier(self: Any) -> None:
        group = self._worker_group
        if not _multi_node(next(iter(ENVS.values()), None)):
            return original(self)
        store = self._store
        from ddpkit.train.launch.outcome import last_attempt_exits_0

        try:
            if left := last_attempt_exits_0(ENDS):
                store.set(f"{_LEFT_KEY}{_round()}/{group.group_rank}", json.dumps(left))
            last = _barrier_nonblocking(
                store=store, world_size=group.group_world_size, key_prefix=sync_key
            )
            deadline = time.monotonic() + self._exit_barrier_timeout
            while time.monotonic() < deadline:
                if store.check([last]):
                    return None
                if store.check([f"{_FAILED_KEY}{_round()}"]):
                    print(
                        "ddpkit node: a worker on another node failed after this node's "
                        "workers had finished; not waiting for the other nodes",
                        file=sys.stderr,
                        flush=True,
                    )
                    return None
                time.sleep(0.5)
        except Exception as e:  # noqa: BLE001 - torch's barrier logs and goes on, as here
            if type(e).__name__ == "SignalException":
                raise
        return None

    exit_barrier._ddpkit = True  # type: ignore[attr-defined]
    api.SimpleElasticAgent._exit_barrier = exit_barrier  # type: ignore[method-assign]


SHUTDOWN_WAIT_S = 15.0  # how long the rendezvous host waits for the other nodes to leave it


def close_the_rendezvous_last(rdzv_port: int | None) -> None:
    """The node that hosts the rendezvous store closes it last. After a clean run every agent
    shuts its rendezvous down through that store (marks it closed); the host's agent did so
    and exited at once, and another node's agent, still at it, printed torch's C++ stack
    traces (`recvValue failed ... Connection was likely closed`) after a run that succeeded.
    Now each node says it is done in the store and stops using it; the host waits (at most
    SHUTDOWN_WAIT_S) until every other node has said so."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    original = dr.DynamicRendezvousHandler.shutdown
    if getattr(original, "_ddpkit", False) or not rdzv_port:
        return

    def shutdown(self: Any) -> bool:
        ok = original(self)
        env = next(iter(ENVS.values()), None)
        store = getattr(self, "_store", None)
        if store is None or not _multi_node(env):
            return ok
        assert env is not None
        nodes = int(env["WORLD_SIZE"]) // max(1, int(env["LOCAL_WORLD_SIZE"]))
        key = f"ddpkit/shut/{_round()}"
        with contextlib.suppress(Exception):
            if not _listening_here(rdzv_port):
                store.add(key, 1)  # then leave: the host may close the store any time now
                return ok
            deadline = time.monotonic() + SHUTDOWN_WAIT_S
            while store.add(key, 0) < nodes - 1 and time.monotonic() < deadline:
                time.sleep(0.2)
        return ok

    shutdown._ddpkit = True  # type: ignore[attr-defined]
    dr.DynamicRendezvousHandler.shutdown = shutdown  # type: ignore[method-assign]


def _listening_here(port: int) -> bool:
    """This process holds a listening TCP socket on `port` (it hosts the rendezvous store):
    /proc/net/tcp{,6} LISTEN entries on the port whose inode is one of this process's fds."""
    inodes = set()
    for net in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(net).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
    return False


def install(
    budget_s: int,
    blame: Callable[[dict[int, Any]], tuple[int, Any]],
    rdzv_port: int | None = None,
) -> None:
    """Every hook, before torchrun runs: `budget_s` the job's shutdown budget (whole seconds),
    `blame` the launcher's rule for the rank to blame among torchrun's failures."""
    _quiet_torch_logs()
    workers_die_with_launcher()
    learn_places()
    note_first_stop()
    stops_keep_the_shutdown_budget(budget_s)
    one_stop_signal()
    stop_retrying_code_failures(blame)
    leave_a_failed_job()
    close_the_rendezvous_last(rdzv_port)


def stopped_at() -> float | None:
    """When torchrun began stopping the last attempt's workers, if it did."""
    return min(_STOP_AT, default=None)
