"""Where each rank runs, for every line that names one: `rank 1 (node 1, host node2)`.

The node launcher learns it at each rendezvous (install): before torchrun assigns the ranks,
each node's agent writes its node number, host and worker count into the rendezvous store;
the assignment is a barrier (every agent writes before any gets its ranks), so afterwards
every agent reads every node's entry without waiting, and the ranks follow in torchrun's own
order (node by node, by rendezvous rank). The launcher of the node whose worker noticed a
failure can then place a rank that ran elsewhere, which its own workers' ends do not tell.

The node number is the scheduler's (SLURM_NODEID: the task number of the SLURM logs), else
the rendezvous' node rank; the host is the node's name as the scheduler knows it (SLURM's
node name, Kubernetes' node), else the host name. Both are given, always: the local SLURM
cluster's two nodes share one host name, and so may pods on one machine.

torch-free but for install(); a torch without the hook leaves the places of this node's own
workers (note) and every other rank named alone (`rank 3`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
from typing import Any

PLACES: dict[int, tuple[int, str]] = {}  # rank -> (node, host), from the last rendezvous
_KEY = "ddpkit/place/"


def host() -> str:
    """This node's name as its scheduler knows it (goodput records use the same name)."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("NODE_NAME") or socket.gethostname()


def node_number(group_rank: int) -> int:
    """The node's number as the user sees it: SLURM's, else the rendezvous' node rank."""
    with contextlib.suppress(ValueError):
        return int(os.environ.get("SLURM_NODEID", ""))
    return group_rank


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


def _learn(store: Any, group_rank: int, group_world_size: int, workers: list[Any]) -> None:
    keys = [f"{_KEY}{i}" for i in range(group_world_size)]
    if not all(store.check([k]) for k in keys):
        return  # a rendezvous without the barrier (TORCH_ELASTIC_WORKER_IDENTICAL): ours only
    entries = [json.loads(v) for v in store.multi_get(keys)]
    PLACES.clear()
    first = 0
    for entry in entries:
        for r in range(first, first + int(entry["n"])):
            PLACES[r] = (int(entry["node"]), str(entry["host"]))
        first += int(entry["n"])


def install() -> bool:
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
        mine = {"node": node_number(group_rank), "host": host(), "n": spec.local_world_size}
        with contextlib.suppress(Exception):
            store.set(f"{_KEY}{group_rank}", json.dumps(mine))
        workers = original(self, store, group_rank, group_world_size, spec)
        PLACES.clear()
        for w in workers:
            PLACES[w.global_rank] = (mine["node"], mine["host"])
        with contextlib.suppress(Exception):
            _learn(store, group_rank, group_world_size, workers)
        return workers

    assign._ddpkit = True  # type: ignore[attr-defined]
    SimpleElasticAgent._assign_worker_ranks = assign  # type: ignore[method-assign]
    return True
