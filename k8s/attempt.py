"""A fixed-size PyTorchJob's pod attempt: the restart budget kept on the job's claim, and the
pod's exit status in the words of the operator's `restartPolicy: ExitCode`.

    python -m ddpkit.k8s.attempt [node launcher flags] -- <entry point>    (k8s/launch.sh)

ExitCode is the one restart policy of training-operator v1.9 that can tell the two failures
apart: an exit status of 128 or more recreates the pod (on any node: a lost node's pod comes
back elsewhere, and a killed worker's whole job restarts from the newest checkpoint), one
below 128 fails the job at once (the user's code, bad input: never retried). But v1.9.4 holds
only the restarts of *running* pods to `backoffLimit` (pkg/core/job.go PastBackoffLimit), and
an ExitCode restart recreates the pod, so the operator alone would restart forever. The kit
counts instead: every pod start of the job leaves a file under <run dir>/k8s-attempts/ (the
claim outlives the pods), and a job attempt past `backoffLimit`, or a failure past that budget,
exits 1 with its line: the job fails once, never loops.

One attempt number for the whole job, not one per pod. A static rendezvous meets only agents
that start together: a pod recreated alone (its node lost, every process of it killed) starts
torchrun's count at 0 while a surviving peer restarted in place waits at its own count's store
keys, and the two never meet (found by a drill: the recreated pod's ranks crashed three times
and the job lost 401 s). So a pod whose replica already started in the newest attempt opens
the next one, a pod that has not joins it, the others' pods see a newer attempt and exit
EXIT_RESTART_POD to join it, and a non-host pod starts its launcher only once the host pod
(node rank 0, whose launcher holds the store) started in the same attempt.

Exit status: the node launcher's 0, 2 (bad input) and 3 (diverged) as they are; its requeue
(75: the pod's SIGTERM save) and a failure a restart may fix (a killed or crashed worker, a
peer gone, past torchrun's in-place budget) -> EXIT_RESTART_POD; the user's code failing
(ddpkit.train.launch.verdicts) or the budget spent -> 1.
torch-free at import: the node launcher is imported only to run it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from ddpkit.train.contract import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REQUEUE,
    LAUNCH_ID_ENV,
    RUN_ID_ENV,
    SCHEDULER_ATTEMPT_ENV,
)
from ddpkit.train.launch import verdicts

# 128 and above: the operator recreates the pod (IsRetryableExitCode). Above every
# 128 + signal number, so it reads as the kit's request, not as a death by a signal.
EXIT_RESTART_POD = 200
STOPPED_BY_SIGTERM = 128 + signal.SIGTERM  # the node launcher's status for a stop without a save
ATTEMPTS_DIR = "k8s-attempts"  # <run dir>/k8s-attempts/<replica>.<pod uid>
LIMIT_ENV = "DDPKIT_POD_RESTART_LIMIT"  # the job's backoffLimit (k8s/render.py sets it)
WAIT_ENV = "DDPKIT_RDZV_WAIT_S"  # launch.sh's wait for the rendezvous host, in seconds
HOST_REPLICA = "node0"  # replica_name() of the pod whose launcher hosts the static store
PREFIX = "ddpkit"


def run_dir_of(argv: list[str]) -> str | None:
    """The node launcher's --run-dir (the renderer always passes it, before `--`)."""
    flags = argv[: argv.index("--")] if "--" in argv else argv
    for i, a in enumerate(flags):
        if a == "--run-dir" and i + 1 < len(flags):
            return flags[i + 1]
        if a.startswith("--run-dir="):
            return a.split("=", 1)[1]
    return None


def _starts(folder: Path) -> list[tuple[int, str, str]]:
    """(attempt, replica, pod uid) of every pod start noted in `folder`."""
    out = []
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            head, _, rest = p.name.partition(".")
            replica, _, uid = rest.rpartition(".")
            if head.isdigit() and replica and uid:
                out.append((int(head), replica, uid))
    return out


def join_attempt(run_dir: str | Path, replica: str, pod_uid: str) -> int:
    """Note this pod's start and return the job attempt it belongs to (0 = the first): the
    newest one, or the one after it when this replica already started in the newest (this
    pod is a recreated one). The same pod's container again keeps its attempt. Two pods that
    decide at once agree: both see the same newest attempt and whether their replica is in it."""
    folder = Path(run_dir) / ATTEMPTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    starts = _starts(folder)
    if mine := [a for a, _, uid in starts if uid == pod_uid]:
        return mine[0]
    top = max((a for a, _, _ in starts), default=0)
    attempt = top + 1 if any(a == top and r == replica for a, r, _ in starts) else top
    (folder / f"{attempt}.{replica}.{pod_uid}").touch()
    return attempt


def run_id(run_dir: str | Path) -> str | None:
    """The job's run id (contract.RUN_ID_ENV): its host pod's first start on the claim, the
    same on every pod of every attempt of this job; the next job of this name on the claim
    starts with none (forget_attempts) and gets its own. None before the host pod started."""
    firsts = sorted(
        uid for a, r, uid in _starts(Path(run_dir) / ATTEMPTS_DIR) if a == 0 and r == HOST_REPLICA
    )
    return f"k8s-{firsts[0][:13]}" if firsts else None


def newest_attempt(run_dir: str | Path) -> int:
    return max((a for a, _, _ in _starts(Path(run_dir) / ATTEMPTS_DIR)), default=0)


def started_in(run_dir: str | Path, attempt: int, replica: str) -> bool:
    return any(a == attempt and r == replica for a, r, _ in _starts(Path(run_dir) / ATTEMPTS_DIR))


def _rejoin_line(replica: str, attempt: int, newer: int) -> str:
    return (
        f"{PREFIX}: {replica}: another pod of the job started attempt {newer} (this pod is in "
        f"{attempt}); this pod is recreated to join it (exit {EXIT_RESTART_POD})"
    )


def wait_for_host(
    run_dir: str, attempt: int, replica: str, wait_s: float, every: float = 1.0
) -> int | None:
    """A non-host pod: wait until the host pod started in this attempt, so that the
    launcher does not meet the store of a host about to be replaced. None when it did; else
    the exit status: EXIT_RESTART_POD when a newer attempt began meanwhile, EXIT_FAILED
    after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while not started_in(run_dir, attempt, HOST_REPLICA):
        if (newer := newest_attempt(run_dir)) > attempt:
            print(_rejoin_line(replica, attempt, newer), file=sys.stderr, flush=True)
            return EXIT_RESTART_POD
        if time.monotonic() >= deadline:
            print(
                f"{PREFIX}: the host pod (node rank 0) did not start attempt {attempt} within "
                f"{wait_s:.0f} s: not restarted",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_FAILED
        time.sleep(every)
    # The host's new pod may not resolve or listen yet, and torch fails at once on a name
    # that does not resolve (launch.sh waited for the pod it replaced).
    addr, port = os.environ.get("PET_MASTER_ADDR"), os.environ.get("PET_MASTER_PORT")
    while addr and port and port.isdigit():
        with contextlib.suppress(OSError):
            socket.create_connection((addr, int(port)), timeout=5).close()
            break
        if time.monotonic() >= deadline:
            break  # the launcher's own rendezvous says what is wrong, in its words
        time.sleep(every)
    return None


def watch_for_newer(
    run_dir: str, attempt: int, replica: str, every: float = 2.0
) -> threading.Event:
    """While the launcher runs: when another pod opens a newer attempt, end this pod (its
    workers go with it: node.workers_die_with_launcher) so that it is recreated into that
    attempt. Set the returned event once the launcher returned: its own exit decides then."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every):
            if (newer := newest_attempt(run_dir)) > attempt and not done.is_set():
                print(_rejoin_line(replica, attempt, newer), file=sys.stderr, flush=True)
                os._exit(EXIT_RESTART_POD)

    threading.Thread(target=watch, name="ddpkit-attempt-watch", daemon=True).start()
    return done


def replica_name() -> str:
    """This pod's replica: its node rank (the controller's PET_NODE_RANK; one per replica in a
    fixed-size job), else the pod's name."""
    rank = os.environ.get("PET_NODE_RANK")
    return f"node{rank}" if rank else os.environ.get("POD_NAME", "pod")


def forget_attempts(run_dir: str | Path) -> None:
    """The job ended for good (done, or failed): the next job of this name on the claim starts
    with the whole budget."""
    folder = Path(run_dir) / ATTEMPTS_DIR
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            p.unlink(missing_ok=True)


def verdict(run_dir: str, launch_id: str, rc: int, restarts: int, limit: int) -> tuple[int, str]:
    """(exit status, its line) for the node launcher's `rc` in the job's attempt `restarts`
    (0 = the first) under the budget `limit` (backoffLimit)."""
    if rc in (EXIT_OK, EXIT_BAD_INPUT, EXIT_DIVERGED):
        return rc, ""
    if rc in (EXIT_REQUEUE, STOPPED_BY_SIGTERM):
        # The pod's SIGTERM (deleted, evicted, its node drained), saved or not (its ranks may
        # have been between attempts). Not a cancel, unlike SLURM's: deleting the job takes
        # its pods with it, so a restart asked for then is never made (found by a drill: a
        # worker pod stopped without a save exited 1 and failed the whole job).
        how = "saved on SIGTERM" if rc == EXIT_REQUEUE else "stopped by SIGTERM without a save"
        if restarts >= limit:
            return EXIT_FAILED, f"{how}; the pod restart budget ({limit}) is spent"
        return EXIT_RESTART_POD, f"{how}: pod restart {restarts + 1} of {limit}"
    again, _, line = verdicts.requeue_verdict(run_dir, launch_id, rc, restarts, limit)
    line = line.replace("not requeued", "not restarted").replace("requeue", "pod restart")
    return (EXIT_RESTART_POD if again else EXIT_FAILED), line


def failing_nodes(run_dir: str) -> list[str]:
    """The nodes with two failures or more in the run's goodput records (the SLURM requeue
    excludes the same ones)."""
    from ddpkit.train import goodput

    rep = goodput.report(run_dir, ended=True)
    return rep.failing_nodes() if rep else []


def failure_lines(run_dir: str) -> list[str]:
    """The run's failures so far, one line each, for the host pod's log: `ddpkit status k8s`
    shows them (the client cannot read the claim; the launcher's goodput line comes first)."""
    from ddpkit.train import goodput

    lines = goodput.status_lines(run_dir)[1:]  # [0]: the goodput line the launcher says
    return [f"{PREFIX}: {t.strip()}" for t in lines if t.strip().startswith("failure:")]


def main(argv: list[str]) -> int:
    run_dir = run_dir_of(argv)
    limit = int(os.environ.get(LIMIT_ENV, "3"))
    replica = replica_name()
    if run_dir is None:  # not rendered by the kit: the node launcher as it is
        from ddpkit.train.launch import node

        return node.main(argv)
    restarts = join_attempt(run_dir, replica, os.environ.get("POD_UID") or f"{time.time_ns()}")
    # The same id on every pod of this attempt: the goodput records group by it, and a
    # requeue marker counts only with it (the controller sets no rendezvous id here).
    launch_id = f"k8s-{restarts}"
    os.environ[LAUNCH_ID_ENV] = launch_id
    os.environ[SCHEDULER_ATTEMPT_ENV] = str(restarts)  # the recreated pods: the job's attempts
    if restarts > limit:  # a pod lost outright (no exit of ours) past the budget
        print(
            f"{PREFIX}: the job's pods started {restarts + 1} times; the pod restart budget "
            f"(k8s.backoff_limit = {limit}) is spent: not restarted again",
            file=sys.stderr,
            flush=True,
        )
        forget_attempts(run_dir)
        return EXIT_FAILED
    if replica != HOST_REPLICA:
        wait_s = float(os.environ.get(WAIT_ENV) or 600)
        if (code := wait_for_host(run_dir, restarts, replica, wait_s)) is not None:
            if code == EXIT_FAILED:
                forget_attempts(run_dir)
            return code
    if run := run_id(run_dir):
        os.environ[RUN_ID_ENV] = run
    watching = watch_for_newer(run_dir, restarts, replica)
    from ddpkit.train.errors import run_cli
    from ddpkit.train.launch import node

    try:
        rc = run_cli(lambda: node.main(argv))
    finally:
        watching.set()
    code, line = verdict(run_dir, launch_id, rc, restarts, limit)
    if os.environ.get("PET_NODE_RANK") == "0":
        for text in failure_lines(run_dir):
            print(text, file=sys.stderr, flush=True)
    if line:
        print(f"{PREFIX}: {line} (exit {code})", file=sys.stderr, flush=True)
    if code == EXIT_RESTART_POD and (bad := failing_nodes(run_dir)):
        # Before the exit: the operator recreates the pods from the job's templates then.
        from ddpkit.k8s import exclude

        if os.environ.get(exclude.JOB_ENV) or os.environ.get("PET_NODE_RANK") == "0":
            print(f"{PREFIX}: {exclude.keep_off(bad)}", file=sys.stderr, flush=True)
    # Ended for good: failed, or done (the host pod, the last to need them): the next job of this
    # name on the claim is a new run with the whole budget. Kept after a done of the host pod,
    # the next job read as attempt N+1 of this one and its goodput report as this run's.
    if code < EXIT_RESTART_POD and (code != EXIT_OK or replica == HOST_REPLICA):
        forget_attempts(run_dir)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
