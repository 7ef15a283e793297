"""A small node agent for the local control plane, in place of a kubelet: the command line.

usage: python k8s/local/node_agent.py --kubeconfig K [--nodes 2] [--gpus 8] [--state DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal

from .agent import Agent
from .sandbox import Image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument(
        "--state",
        default=os.path.join(os.environ.get("DDPKIT_K8S_STATE", "/tmp/ddpkit-k8s"), "node"),
    )
    ap.add_argument(
        "--nodes", type=int, default=2, help="how many nodes to register (all on this host)"
    )
    ap.add_argument("--prefix", default="ddpkit-node-")
    ap.add_argument("--cpu", default=os.cpu_count() or 2)
    ap.add_argument("--memory", default="16Gi")
    ap.add_argument(
        "--gpus",
        type=int,
        default=8,
        help="nvidia.com/gpu advertised per node (pods run on the CPU)",
    )
    ap.add_argument("--port", type=int, default=10250, help="kubelet port for `kubectl logs`")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument(
        "--image",
        action="append",
        type=Image.parse,
        default=[],
        metavar="PATTERN=VENV[:WORKSPACE]",
        help="what stands in for images matching PATTERN (fnmatch): the Python environment "
        "VENV (its bin/ first on PATH) and the directory copied to /workspace (a derived "
        "image's code); repeatable, first match wins; default ddpkit:*=this agent's venv",
    )
    ap.add_argument(
        "--network",
        choices=("netns", "host"),
        default="netns",
        help="netns: one network namespace per pod on a bridge; host: all pods on 127.0.0.1",
    )
    ap.add_argument("--bridge", default="ddpkit0", help="bridge name (<= 8 chars: netns names)")
    ap.add_argument("--pod-cidr", default="10.244.0.0/24")
    ap.add_argument(
        "--hosts-file", help="keep pod names -> 127.0.0.1 in this hosts file (e.g. /etc/hosts)"
    )
    ap.add_argument(
        "--host-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a name pods reach this host by, as they reach the API server (a controller's "
        "Service served here: Trainer's status server); repeatable",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    agent = Agent(args)
    agent.host_names = tuple(args.host_name)
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    agent.run(args.tls_cert, args.tls_key)
