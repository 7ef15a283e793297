"""Which failures a restart can fix, and which are the user's code (never retried).

A worker that dies by a signal (SIGKILL: the OOM killer, a lost node, a drill), fails in a
collective because a peer went away, or hits a hardware or network error is worth a restart:
the next attempt resumes from the newest complete checkpoint. A worker whose own code raised
(a bug, a missing file, a bad config: exit 2, a diverged loss: exit 3) fails the same way on
every attempt, so retrying it only burns the restart budget and the allocation: the node
launcher stops at once with its one line.

The worker says which it was in its torchrun error file (TORCHELASTIC_ERROR_FILE, the file
ddpkit.train.fault.tell_launcher writes too): {"ddpkit": {"cause": "code", "error": "..."}}.
Only an explicit "code" (or exit 2/3) stops the retries: an end the launcher cannot explain
is retried, since a restart loses at most the steps since the last save.
torch-free at import (the agent hook imports torchrun lazily).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_REQUEUE

CODE = "code"
INFRA = "infra"
# Text of an exception that comes from the machine or the network, not the user's code:
# collective and transport errors (a peer died), CUDA/ECC faults, timeouts.
_INFRA_WORDS = (
    "timed out", "timeout", "gloo", "nccl", "connection", "peer", "broken pipe",
    "cuda error", "ecc", "cudnn_status_execution_failed", "rendezvous", "tcpstore", "store",
)  # fmt: skip
_INFRA_TYPES = (
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "ConnectionError",
    "TimeoutError",
)


def cause_of(e: BaseException) -> str:
    """CODE for an exception of the user's code, INFRA for one a restart may cure."""
    names = {t.__name__ for t in type(e).__mro__}
    text = f"{type(e).__name__} {e}".lower()
    if names & set(_INFRA_TYPES) or any(w in text for w in _INFRA_WORDS):
        return INFRA
    return CODE


def note_cause(e: BaseException) -> None:
    """Leave the cause of this worker's exception where the launcher reads it (best effort;
    a diagnosis written already, e.g. a failed collective's, is kept)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    error = f"{type(e).__name__}: {e}".splitlines()[0][:300] if str(e) else type(e).__name__
    body = {"message": error, "timestamp": 0, "ddpkit": {"cause": cause_of(e), "error": error}}
    try:
        with open(path, "w") as f:
            json.dump(body, f)
    except OSError:
        pass


def is_code_failure(code: int, cause: str) -> bool:
    """A worker end no restart can fix: its own code raised, bad input, or a diverged loss."""
    return code in (EXIT_BAD_INPUT, EXIT_DIVERGED) or (code > 0 and cause == CODE)


# What stopped the retries of this launch (the culprit's rank and error), for the end line.
STOPPED: list[tuple[int, str]] = []


def stop_retrying_code_failures(culprit: Callable[[dict[int, Any]], tuple[int, Any]]) -> None:
    """Make torchrun's agent give up at once (no in-place restart) when the failure it sees
    is the user's code. `culprit`: {rank: ProcessFailure} -> (rank, outcome.Failure), the
    launcher's own rule for the rank to blame (train/outcome.py)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    monitor = LocalElasticAgent._monitor_workers
    if getattr(monitor, "classified", False):
        return

    def classified(self: Any, worker_group: Any) -> Any:
        result = monitor(self, worker_group)
        if result.is_failed() and result.failures and self._remaining_restarts > 0:
            # A worker that saved and asked for a requeue (a stop signal reached a peer's node:
            # a deleted pod) is never restarted in place: that peer is going away, and the
            # scheduler starts the next attempt on every node at once.
            if any(f.exitcode == EXIT_REQUEUE for f in result.failures.values()):
                self._remaining_restarts = 0
                return result
            rank, failure = culprit(result.failures)
            if is_code_failure(failure.code, failure.cause):
                self._remaining_restarts = 0
                STOPPED.append((rank, failure.error))
        return result

    classified.classified = True  # type: ignore[attr-defined]
    LocalElasticAgent._monitor_workers = classified  # type: ignore[method-assign]


# --- past the in-place budget: the scheduler's requeue (the SLURM batch shell asks here) ------


def requeue_verdict(
    run_dir: str, launch_id: str, rc: int, restarts: int, limit: int
) -> tuple[bool, list[str], str]:
    """(requeue?, nodes to exclude, the line saying why) for a job step that ended with `rc`
    (not 0, not 75: those the batch shell handles itself), from the run's goodput records:
    the user's code failing (in this attempt) is never requeued; a lost node, a killed or
    hung worker past the in-place budget is, `limit` times at most (SLURM_RESTART_COUNT
    survives the requeue, so the count does too). A node with two failures is excluded."""
    from ddpkit.train import goodput
    from ddpkit.train.contract import EXIT_INTERRUPTED

    if rc in (0, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED):
        return False, [], ""
    if rc == 128 + signal.SIGTERM:  # every node stopped by SIGTERM: a cancel (scancel), never
        return False, [], ""  # requeued; a lost node's step ended 247 on the local cluster
    ends = [r for r in goodput.read(run_dir) if r["kind"] == "end" and r.get("launch") == launch_id]
    code = next(
        (r for r in ends if is_code_failure(int(r.get("code") or 1), str(r.get("cause") or ""))),
        None,
    )
    if code is not None:
        return False, [], f"rank {code.get('rank')} failed in its own code: not requeued"
    if restarts >= limit:
        return False, [], f"step exit {rc}; the requeue limit ({limit}) is reached: not requeued"
    rep = goodput.report(run_dir, ended=True)  # this attempt's failure counts too
    bad = rep.failing_nodes() if rep else []
    why = f"step exit {rc} (a lost node, or workers past the in-place restart budget)"
    line = f"{why}; requeue {restarts + 1} of {limit}"
    if bad:
        line += (
            f", excluding {','.join(bad)} (failed {goodput.NODE_FAILURES_TO_EXCLUDE} times or more)"
        )
    return True, bad, line


def room_for(
    new: list[str], usable: set[str], excluded: list[str], need: int
) -> tuple[list[str], list[str]]:
    """(the failing nodes to exclude, those left in) so that the job keeps `need` usable nodes
    besides those `excluded` already: excluding past that leaves it pending for good, which
    only a person could undo (found by a drill on 3 SLURM nodes: a kill and a hang on one
    node, two node losses on another, and the 2-node job had one node left). A node that is
    not usable now costs no room. SLURM (slurm/room.py) and Kubernetes (k8s/exclude.py)."""
    room = max(0, len(usable - set(excluded)) - need)
    counted = [n for n in new if n in usable]
    added = [n for n in new if n not in usable or n in counted[:room]]
    return added, counted[room:]


def main(argv: list[str]) -> int:
    """`python -m ddpkit.train.failclass RUN_DIR LAUNCH_ID RC RESTARTS LIMIT`: prints
    `requeue [NODE,...]` or `stop` on stdout, the reason on stderr."""
    run_dir, launch_id, rc, restarts, limit = argv
    again, bad, line = requeue_verdict(run_dir, launch_id, int(rc), int(restarts), int(limit))
    if line:
        print(f"ddpkit: {line}", file=sys.stderr, flush=True)
    print(f"requeue {','.join(bad)}".rstrip() if again else "stop")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
