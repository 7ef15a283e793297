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
claim outlives the pods), and a replica started more than `backoffLimit` + 1 times, or a
failure past that budget, exits 1 with its line: the job fails once, never loops.

Exit status: the node launcher's 0, 2 (bad input) and 3 (diverged) as they are; its requeue
(75: the pod's SIGTERM save) and a failure a restart may fix (a killed or crashed worker, a
peer gone, past torchrun's in-place budget) -> EXIT_RESTART_POD; the user's code failing
(failclass) or the budget spent -> 1.
torch-free at import: the node launcher is imported only to run it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from ddpkit.train import failclass
from ddpkit.train.contract import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REQUEUE,
    LAUNCH_ID_ENV,
)

# 128 and above: the operator recreates the pod (IsRetryableExitCode). Above every
# 128 + signal number, so it reads as the kit's request, not as a death by a signal.
EXIT_RESTART_POD = 200
STOPPED_BY_SIGTERM = 128 + signal.SIGTERM  # the node launcher's status for a stop without a save
ATTEMPTS_DIR = "k8s-attempts"  # <run dir>/k8s-attempts/<replica>.<pod uid>
LIMIT_ENV = "DDPKIT_POD_RESTART_LIMIT"  # the job's backoffLimit (k8s/render.py sets it)
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


def count_start(run_dir: str | Path, replica: str, pod_uid: str) -> int:
    """Note this pod's start and return how many pods of `replica` this job has started (1 on
    the first). Every replica fails together (a peer's failure breaks the others' collectives),
    so the counts stay in step and name the job's attempt on every pod alike."""
    folder = Path(run_dir) / ATTEMPTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{replica}.{pod_uid}").touch()
    return sum(1 for p in folder.iterdir() if p.name.startswith(f"{replica}."))


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
    again, _, line = failclass.requeue_verdict(run_dir, launch_id, rc, restarts, limit)
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
    replica = os.environ.get("POD_NAME", "pod")
    if run_dir is None:  # not rendered by the kit: the node launcher as it is
        from ddpkit.train import node

        return node.main(argv)
    started = count_start(run_dir, replica, os.environ.get("POD_UID") or f"{time.time_ns()}")
    restarts = started - 1
    # The same id on every pod of this attempt: the goodput records group by it, and a
    # requeue marker counts only with it (the controller sets no rendezvous id here).
    launch_id = f"k8s-{restarts}"
    os.environ[LAUNCH_ID_ENV] = launch_id
    os.environ["DDPKIT_POD_ATTEMPT"] = str(restarts)
    if restarts > limit:  # a pod lost outright (no exit of ours) past the budget
        print(
            f"{PREFIX}: {replica} started {started} times; the pod restart budget "
            f"(k8s.backoff_limit = {limit}) is spent: not restarted again",
            file=sys.stderr,
            flush=True,
        )
        forget_attempts(run_dir)
        return EXIT_FAILED
    from ddpkit.train import node
    from ddpkit.train.errors import run_cli

    rc = run_cli(lambda: node.main(argv))
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
    if code < EXIT_RESTART_POD and code != EXIT_OK:
        forget_attempts(run_dir)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
