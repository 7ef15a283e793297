"""The requeue's node exclusion, held to what leaves the job room to run.

    python -m ddpkit.slurm.room OWN BAD      (the batch shell, teardown.sh.j2, before a requeue)

OWN is the job's ExcNodeList now (the user's --exclude, earlier attempts'; "(null)" or empty
when none), BAD the nodes that failed twice (ddpkit.train.launch.verdicts). Prints the ExcNodeList to
set: OWN and the BAD nodes that still leave at least the job's node count (SLURM_JOB_NUM_NODES)
of the partition's usable nodes; nothing when no node is added. A node left in is named on
stderr: excluding it would leave the job pending for good (SLURM: BadConstraints), which no
one but a person could undo. Where sinfo or scontrol cannot say, BAD is added as it is.
torch-free.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ddpkit.train.launch.verdicts import room_for

UNUSABLE = ("down", "drain", "drng", "fail", "maint", "unk", "futr", "inval", "boot")


def _run(*cmd: str) -> str | None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def hostnames(hostlist: str) -> list[str] | None:
    """SLURM's hostlist expression (node[1-3],gpu7) as names, by scontrol."""
    if not hostlist or hostlist == "(null)":
        return []
    out = _run("scontrol", "show", "hostnames", hostlist)
    return None if out is None else out.split()


def usable_nodes(partition: str | None) -> set[str] | None:
    """The partition's nodes that can run jobs (not down, drained, failing, not responding)."""
    out = _run("sinfo", "-h", "-N", "-o", "%N %t", *(["-p", partition] if partition else []))
    if out is None:
        return None
    nodes = set()
    for line in out.splitlines():
        name, _, state = line.strip().partition(" ")
        if name and not state.endswith("*") and not state.startswith(UNUSABLE):
            nodes.add(name)
    return nodes


def exclusion(own: str, bad: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the job's exclusions now, the bad nodes to add, the bad nodes left in for room)."""
    mine = hostnames(own)
    if mine is None:  # cannot expand it: keep the text as it is
        mine = [own] if own and own != "(null)" else []
    new = [n for n in bad if n not in mine]
    need = int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 0)
    usable = usable_nodes(os.environ.get("SLURM_JOB_PARTITION"))
    if not need or usable is None:
        return mine, new, []
    added, left = room_for(new, usable, mine, need)
    return mine, added, left


def main(argv: list[str]) -> int:
    own, bad = argv[0], [n for n in argv[1].split(",") if n]
    mine, added, left = exclusion(own, bad)
    if left:
        print(
            f"ddpkit: not excluding {','.join(left)} (failed twice): the partition would have "
            f"fewer usable nodes than the job's {os.environ.get('SLURM_JOB_NUM_NODES')}",
            file=sys.stderr,
            flush=True,
        )
    if added:  # the job's own list as written (a hostlist stays one), then the new nodes
        print(",".join(([own] if mine else []) + added))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
