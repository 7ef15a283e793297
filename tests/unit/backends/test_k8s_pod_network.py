"""The local cluster's pod network (k8s/local/nodeagent/network.py) on real namespaces and
veths: the gateway's MAC, the host's side of every pod's default route, stays the same while
pods come and go. Left to the kernel, a bridge takes the lowest MAC of its ports; a pod's veth
removed then moved the gateway's MAC under the other pods, whose ARP entries pointed at nobody
for up to a minute: a pod's S3 uploads to the host stalled past torchrun's shutdown timeout
(tests/engines/k8s/test_k8s_s3.py lost its SIGTERM save that way). Needs root and `ip netns`;
a bridge and address range of its own, so it runs beside the k8s chunk."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCAL = Path(__file__).resolve().parents[3] / "k8s" / "local"


def _cannot() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"no `ip netns` here: {probe.stderr.strip()}"


_WHY_NOT = _cannot()  # probed once
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


@pytest.fixture
def network() -> Iterator[object]:
    sys.path.insert(0, str(LOCAL))
    try:
        from nodeagent.network import Network
    finally:
        sys.path.remove(str(LOCAL))
    net = Network("netns", f"dkn{os.getpid() % 0xFFFF:04x}", f"10.251.{os.getpid() % 250}.0/24")
    net.up()
    try:
        yield net
    finally:
        net.down()


def mac(link: str, ns: str | None = None) -> str:
    where = ["-n", ns] if ns else []
    out = subprocess.run(["ip", *where, "-o", "link", "show", link], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return out.split("link/ether ", 1)[1].split()[0]


def test_the_gateway_keeps_its_mac_while_pods_come_and_go(network) -> None:
    from nodeagent.network import bridge_mac  # on sys.modules since the fixture

    bridge = network.bridge
    first = mac(bridge)
    pods = [network.attach(f"pod-{i}-0000-0000") for i in range(4)]
    ports = [mac(f"dk{ns.rsplit('-', 1)[1]}") for ns, _ in pods]  # the bridge's side of each
    assert len(set(ports)) == 4 and first not in ports
    assert mac(bridge) == first  # the lowest port MAC did not take over when ports came
    for (ns, addr), _ in sorted(zip(pods, ports, strict=True), key=lambda p: p[1]):
        network.detach(ns, addr)  # the lowest first: the case that moved it before
        assert mac(bridge) == first
    # its own address: locally administered, unicast, one per bridge name
    assert first == bridge_mac(bridge) and int(first.split(":")[0], 16) & 0b11 == 0b10
    assert bridge_mac(bridge) != bridge_mac(bridge + "x")  # a bridge of each test its own
