"""Past a launch: whether the scheduler should start the job again, and without which nodes.

The SLURM batch shell asks here when a job step ended (`python -m ddpkit.train.failclass RUN_DIR
LAUNCH_ID RC RESTARTS LIMIT`, the command name its rendered script keeps); Kubernetes' pod
attempts (ddpkit.k8s.attempt) and both engines' exclusion lists read `room_for`. The failure
kinds and the code-or-machine rule are ddpkit.train.failure's: the user's code failing is never
requeued, a lost node, a killed or hung worker past the in-place budget is.
torch-free.
"""

from __future__ import annotations

import signal
import sys

from ddpkit.train import failure
from ddpkit.train.contract import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED

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

    if rc in (0, EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_INTERRUPTED):
        return False, [], ""
    if rc == 128 + signal.SIGTERM:  # every node stopped by SIGTERM: a cancel (scancel), never
        return False, [], ""  # requeued; a lost node's step ended 247 on the local cluster
    ends = [r for r in goodput.read(run_dir) if r["kind"] == "end" and r.get("launch") == launch_id]
    code = next(
        (
            r
            for r in ends
            if failure.is_code_failure(int(r.get("code") or 1), str(r.get("cause") or ""))
        ),
        None,
    )
    if code is not None:
        return False, [], f"rank {code.get('rank')} failed in its own code: not requeued"
    if restarts >= limit:
        return False, [], f"step exit {rc}; the requeue limit ({limit}) is reached: not requeued"
    rep = goodput.report(run_dir, ended=True)  # this attempt's failure counts too
    last = rep.failures[-1] if rep and rep.failures else None
    if last is not None and not failure.kind(last.kind).retried:
        return (
            False,
            [],
            f"{last.kind} (rank {last.rank}): not requeued (the same on every attempt)",
        )
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
