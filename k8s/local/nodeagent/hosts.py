"""The hosts file that stands in for cluster DNS: pod and Service names -> pod IPs."""

from __future__ import annotations

import contextlib
import os

HOSTS_BEGIN = "# BEGIN ddpkit-node-agent"
HOSTS_END = "# END ddpkit-node-agent"


class HostsFile:
    """The Agent's hosts files (a mixin)."""

    def write_hosts(self, pods, services=()) -> None:
        """Names that pods reach each other by (the operator's headless Services
        `<job>-master-0`, JobSet's `<pod-hostname>.<subdomain>`, a Service's name) -> the pods'
        addresses: in the agent's own hosts file, every pod's /etc/hosts, and, if asked, the
        host's. A Service with a selector stands for its first running pod, as kube-proxy's
        virtual IP would (a torchft job's lighthouse, `<job>-lighthouse`); its port is taken
        to be the pod's own (targetPort equal to port)."""
        entries: dict[str, str] = dict(self.api_hosts())  # the API server (incluster.py)
        for r in list(self.runners.values()):
            if not r.addressed or r.done.is_set() or r.stopping.is_set():
                continue
            p, ns = r.pod, r.ns
            host = p.spec.hostname or p.metadata.name
            names = [p.metadata.name, host]
            if p.spec.subdomain:
                names.append(f"{host}.{p.spec.subdomain}")
            for n in list(names):
                names += [f"{n}.{ns}", f"{n}.{ns}.svc", f"{n}.{ns}.svc.cluster.local"]
            entries.update({n: r.ip for n in names})
        live = sorted(
            (
                (
                    str(r.pod.metadata.creation_timestamp or ""),
                    r.ns,
                    r.pod.metadata.labels or {},
                    r.ip,
                )
                for r in list(self.runners.values())
                if r.addressed and not r.done.is_set() and not r.stopping.is_set()
            ),
            key=lambda t: t[:2],
        )  # oldest first: a Service's name keeps its pod while a newer one starts
        for svc in services:
            sel, ns, name = svc.spec.selector, svc.metadata.namespace, svc.metadata.name
            ip = next(
                (a for _, n, lab, a in live if sel and n == ns and sel.items() <= lab.items()), None
            )
            if ip is None or name in entries:
                continue
            for n in (name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
                entries.setdefault(n, ip)
        block = [f"{ip} {n}" for n, ip in sorted(entries.items())]
        text = "\n".join(["127.0.0.1 localhost", "::1 localhost ip6-localhost", *block]) + "\n"
        old = None
        with contextlib.suppress(FileNotFoundError), open(self.hosts) as f:
            old = f.read()
        if old != text:
            with open(self.hosts, "w") as f:  # in place: pods bind-mount this inode
                f.write(text)
        if not self.hosts_file:
            return
        block = [HOSTS_BEGIN, *block, HOSTS_END]
        try:
            with open(self.hosts_file) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        if HOSTS_BEGIN in lines and HOSTS_END in lines:
            i, j = lines.index(HOSTS_BEGIN), lines.index(HOSTS_END)
            if lines[i : j + 1] == block:
                return
            lines = lines[:i] + lines[j + 1 :]
        with open(self.hosts_file, "w") as f:
            f.write("\n".join(lines + block) + "\n")

    def clear_hosts(self) -> None:
        if not self.hosts_file or not os.path.exists(self.hosts_file):
            return
        with open(self.hosts_file) as f:
            lines = f.read().splitlines()
        if HOSTS_BEGIN in lines and HOSTS_END in lines:
            i, j = lines.index(HOSTS_BEGIN), lines.index(HOSTS_END)
            with open(self.hosts_file, "w") as f:
                f.write("\n".join(lines[:i] + lines[j + 1 :]) + "\n")
