"""Pod addresses: a bridge and one network namespace per pod, or the host's network."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import subprocess
import threading

from .common import log


class Network:
    """Pod addresses. netns: a bridge on the host and one network namespace per pod
    (veth pair, an address from the pod CIDR), so pods of one node may listen on one
    port; host: every pod on the host's network at 127.0.0.1."""

    def __init__(self, mode: str, bridge: str, cidr: str):
        self.mode, self.bridge = mode, bridge
        self.net = ipaddress.ip_network(cidr)
        hosts = [str(h) for h in self.net.hosts()]
        self.gateway, self.free = hosts[0], hosts[1:]
        self.lock = threading.Lock()

    @staticmethod
    def ip(*args: str, check: bool = True) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check and r.returncode:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def up(self) -> None:
        if self.mode != "netns":
            return
        self.down()
        self.ip("link", "add", self.bridge, "type", "bridge")
        # An address of its own, set once: a bridge left to the kernel takes the lowest MAC of
        # its ports, so a pod's veth coming or going changes the gateway's MAC under every
        # other pod, whose ARP entry then points at nobody for up to a minute (seen: a pod's
        # S3 uploads to the host stalled past torchrun's shutdown timeout when another job's
        # pods ended). Locally administered, derived from the name: one per bridge.
        self.ip("link", "set", self.bridge, "address", bridge_mac(self.bridge))
        self.ip("addr", "add", f"{self.gateway}/{self.net.prefixlen}", "dev", self.bridge)
        self.ip("link", "set", self.bridge, "up")
        log.info("pod network %s on bridge %s (one netns per pod)", self.net, self.bridge)

    def down(self) -> None:
        """The bridge and every pod namespace of this bridge (also a crashed agent's)."""
        if self.mode != "netns":
            return
        with contextlib.suppress(FileNotFoundError):
            for ns in os.listdir("/run/netns"):
                if ns.startswith(self.bridge + "-"):
                    self.ip("netns", "del", ns, check=False)
        self.ip("link", "del", self.bridge, check=False)

    def attach(self, uid: str) -> tuple[str | None, str]:
        """(netns name or None, pod IP)."""
        if self.mode != "netns":
            return None, "127.0.0.1"
        with self.lock:
            addr = self.free.pop(0)
        key = uid.replace("-", "")[:10]
        ns, veth = f"{self.bridge}-{key}", f"dk{key}"
        try:
            self.ip("netns", "add", ns)
            self.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self.ip("link", "set", veth, "master", self.bridge, "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/{self.net.prefixlen}", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", ns, "route", "add", "default", "via", self.gateway)
        except RuntimeError:
            self.detach(ns, addr)
            raise
        return ns, addr

    def detach(self, ns: str | None, addr: str) -> None:
        if ns is None:
            return
        self.ip("netns", "del", ns, check=False)  # takes its end of the veth pair along
        with self.lock:
            self.free.append(addr)


def bridge_mac(bridge: str) -> str:
    """A fixed, locally administered unicast MAC for the bridge `bridge` (02:xx:..)."""
    tail = hashlib.sha1(bridge.encode()).digest()[:5]
    return ":".join(f"{b:02x}" for b in (0x02, *tail))
