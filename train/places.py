"""Where each rank runs, for every line that names one: `rank 1 (node 1, host node2)`.

The node launcher learns it at each rendezvous (ddpkit.train.launch.hooks.learn_places): before torchrun assigns the ranks,
each node's agent writes its node number, host and worker count into the rendezvous store;
the assignment is a barrier (every agent writes before any gets its ranks), so afterwards
every agent reads every node's entry without waiting, and the ranks follow in torchrun's own
order (node by node, by rendezvous rank). The launcher of the node whose worker noticed a
failure can then place a rank that ran elsewhere, which its own workers' ends do not tell.

The node number is the scheduler's (contract.NODE_NUMBER_ENV, which SLURM's node script binds to
the task number of the SLURM logs), else the rendezvous' node rank; the host is the node's name
as the scheduler knows it (contract.NODE_NAME_ENV: SLURM's node name, Kubernetes' node), else
the host name. Both are given, always: the local SLURM
cluster's two nodes share one host name, and so may pods on one machine.

torch-free; a torch without the launcher's hook leaves the places of this node's own
workers (note) and every other rank named alone (`rank 3`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

from ddpkit.train import contract

PLACES: dict[int, tuple[int, str]] = {}  # rank -> (node, host), from the last rendezvous
PLACE_KEY = "ddpkit/place/"  # + node rank: the node's entry (ddpkit.train.launch.hooks)


def host() -> str:
    """This node's name as its scheduler knows it (goodput records use the same name)."""
    return contract.node_name()


def node_number(group_rank: int) -> int:
    """The node's number as the user sees it: the scheduler's, else the rendezvous' node rank."""
    number = contract.node_number()
    return group_rank if number is None else number


def name(rank: int, node: int | None = None, host_: str | None = None) -> str:
    """The one way a rank is named: `rank 1 (node 1, host h)`; what is known of it else."""
    if node is None and not host_:
        node, host_ = PLACES.get(rank, (None, None))  # type: ignore[assignment]
    if node is None:
        return f"rank {rank} (host {host_})" if host_ else f"rank {rank}"
    if not host_:
        return f"rank {rank} (node {node})"
    return f"rank {rank} (node {node}, host {host_})"


def names(ranks: list[int] | tuple[int, ...]) -> str:
    """`rank 1 (node 1, host h)`, or `ranks 1 (...), 2 (...)` for several."""
    if len(ranks) == 1:
        return name(ranks[0])
    return "ranks " + ", ".join(name(r)[len("rank ") :] for r in ranks)


def placed(text: str) -> str:
    """Every bare `rank N` in a worker's sentence, placed (the launcher knows where N ran)."""
    return re.sub(r"\brank (\d+)\b(?! \()", lambda m: name(int(m.group(1))), text)


_WORKER_KEY = "ddpkit/where/"


def publish(store: Any, rank: int) -> None:
    """A worker records its own place in its process group's store at start (best effort),
    so a worker's collective diagnosis can place the ranks that never reached it."""
    group_rank = int(os.environ.get("GROUP_RANK", "0") or 0)
    with contextlib.suppress(Exception):
        store.set(f"{_WORKER_KEY}{rank}", json.dumps([node_number(group_rank), host()]))


def published(store: Any, ranks: list[int]) -> str:
    """`rank 1 (node 1, host h), rank 3 (...)` for the ranks that published a place; ""
    when none did (never waits: only keys already there are read)."""
    found = []
    for r in ranks:
        with contextlib.suppress(Exception):
            if store.check([f"{_WORKER_KEY}{r}"]):
                node, host_ = json.loads(store.get(f"{_WORKER_KEY}{r}"))
                found.append(name(r, int(node), str(host_)))
    return ", ".join(found)


def note(rank: int, group_rank: int) -> None:
    """A worker of this node starts (the launcher's Popen): its place, whatever the hook."""
    PLACES.setdefault(rank, (node_number(group_rank), host()))
