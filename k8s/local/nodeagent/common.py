"""What every part of the node agent uses: time stamps, $(VAR) expansion, quantities."""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from typing import Any, Protocol

log = logging.getLogger("node-agent")


class AgentView(Protocol):
    """What a pod's runner, its sandbox and its status need of the agent that runs them
    (agent.Agent is the one): declared here, at the bottom, so that pod.py, sandbox.py and
    status.py import nothing above them."""

    core: Any  # kubernetes.client.CoreV1Api
    state: str  # the agent's state dir
    hosts: str  # the /etc/hosts file every pod mounts
    resolv: str  # the resolv.conf every pod mounts
    images: list[Any]  # sandbox.Image mappings, first match wins
    network: Any  # network.Network, or None without pod networking

    def can_run(self, img: Any, uid: int, gid: int) -> bool: ...

    def resource_value(self, c: Any, resource: str) -> str: ...

    def api_env(self) -> dict[str, str]: ...


LOST_DIR = "lost"  # <state>/lost/<node>: the node is down (`ddpkit chaos --inject lose-node`)


def lost(state: str, node: str | None) -> bool:
    """The node is down: its kubelet (this agent, for that node) says nothing and does
    nothing, as when a machine loses power, until the file is gone (a reboot)."""
    return bool(node) and os.path.exists(os.path.join(state, LOST_DIR, str(node)))


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(s: str, env: dict) -> str:
    """$(VAR) references as a kubelet expands them; $$(VAR) stays literal."""

    def sub(m: re.Match) -> str:
        if m.group(0).startswith("$$"):
            return m.group(0)[1:]
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$?\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


def parse_quantity(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    for u, f in units.items():
        if q.endswith(u):
            return int(float(q[: -len(u)]) * f)
    return int(q)
