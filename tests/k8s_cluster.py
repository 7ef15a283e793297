"""A private local Kubernetes control plane (k8s/local/up.sh) for a test module or a
benchmark: its own state dir, bridge, pod range and (where asked) port range, so it runs
beside a developer's `make k8s-up` and beside other modules' clusters.

    env = cluster_env(state_dir, images="myimg:*=VENV:PROJECT", tag="dkb", net=247)
    for running in running_cluster(env):   # up.sh; down.sh --purge after
        kubectl ... with running["KUBECONFIG"]
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "k8s" / "local"
VENV = Path(sys.executable).parent.parent  # what `ddpkit:*` (and a user's image) stand for
# Every port up.sh binds, before DDPKIT_K8S_PORT_OFFSET moves them.
PORT_BASES = (2379, 2380, 6443, 10257, 10250, 9443, 9444, 9445, 18081, 18082, 18083, 10443)


def binaries_missing() -> str | None:
    """Why no control plane can start here (a binary k8s/local/build.sh makes is absent)."""
    probe = subprocess.run(
        ["bash", "-c", f'source {LOCAL}/versions.sh; for b in "$ETCD_BIN" "$APISERVER_BIN" '
         '"$KCM_BIN" "$TRAINING_OPERATOR_BIN" "$JOBSET_BIN" "$TRAINER_BIN"; do '
         '[ -x "$b" ] || echo "$b"; done'],
        capture_output=True, text=True,
    )  # fmt: skip
    missing = probe.stdout.split()
    return (
        f"control plane not built ({missing[0]} missing): k8s/local/build.sh" if missing else None
    )


def free_port_offset() -> int:
    """A port offset at which every port up.sh binds is free (another cluster, e.g. a
    developer's `make k8s-up` or another test module's, may hold the defaults)."""
    for off in range(1000 + os.getpid() % 50 * 100, 30000, 100):
        try:
            for b in PORT_BASES:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", b + off))
        except OSError:
            continue
        return off
    raise AssertionError("no free port range for a second cluster")


def cluster_env(
    state: Path, images: str, tag: str, net: int, nodes: int = 2, offset: bool = True
) -> dict[str, str]:
    """up.sh's environment for a cluster of `nodes` in `state`: a bridge named `tag` + a
    number of this process, pods in 10.`net`.N.0/24, ports moved to a free range (`offset`)."""
    n = os.getpid() % 10000
    env = {**os.environ, "DDPKIT_K8S_STATE": str(state), "DDPKIT_K8S_NODES": str(nodes),
           "DDPKIT_K8S_BRIDGE": f"{tag}{n}", "DDPKIT_K8S_POD_CIDR": f"10.{net}.{n % 250}.0/24",
           "DDPKIT_K8S_IMAGES": images}  # fmt: skip
    if offset:
        env["DDPKIT_K8S_PORT_OFFSET"] = str(free_port_offset())
    return env


def running_cluster(env: dict) -> Iterator[dict]:
    """A control plane: k8s/local/up.sh with `env` (DDPKIT_K8S_STATE and its own bridge, pod
    range, images), yielding env with KUBECONFIG; down.sh --purge after."""
    up = subprocess.run(["bash", str(LOCAL / "up.sh")], env=env, capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    try:
        if up.returncode != 0:
            raise AssertionError(up.stdout[-3000:] + up.stderr[-3000:])
        yield {**env, "KUBECONFIG": str(Path(env["DDPKIT_K8S_STATE"]) / "kubeconfig")}
    finally:
        subprocess.run(["bash", str(LOCAL / "down.sh"), "--purge"], env=env,
                       capture_output=True, timeout=120)  # fmt: skip
