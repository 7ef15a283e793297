"""The Agent: the API client, binding pods to the nodes, the pod sync loop, graceful
deletion, and the main loop that ties the parts together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import schedule
from .common import log, lost, parse_quantity
from .hosts import HostsFile
from .incluster import ApiAccess
from .logs import LogServer
from .network import Network
from .pod import PodRunner
from .sandbox import Image
from .status import NodeStatus


class Agent(NodeStatus, HostsFile, LogServer, ApiAccess):
    def __init__(self, args):
        config.load_kube_config(args.kubeconfig)
        self.core = client.CoreV1Api()
        self.coord = client.CoordinationV1Api()
        self.nodes = [f"{args.prefix}{i}" for i in range(args.nodes)]
        self.cpu, self.memory, self.gpus = args.cpu, args.memory, args.gpus
        self.state = args.state
        self.port = args.port
        self.hosts_file = args.hosts_file
        # Mounted as every pod's /etc/hosts (rewritten in place: a bind mount keeps the inode).
        self.hosts = os.path.join(self.state, "hosts")
        self.images = list(args.image) or [Image("ddpkit:*", os.path.dirname(os.path.dirname(
            os.path.abspath(sys.executable))))]  # fmt: skip
        self.runnable: dict[tuple, bool] = {}
        os.makedirs(os.path.join(self.state, "pods"), exist_ok=True)
        self.resolv = os.path.join(self.state, "resolv.conf")
        with open(self.resolv, "w") as f:
            f.write("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self.network = Network(args.network, args.bridge, args.pod_cidr)
        self.runners: dict[str, PodRunner] = {}
        self.unschedulable: set[str] = set()  # pods said to fit no node (said once)
        self.stop = threading.Event()
        os.makedirs(os.path.join(self.state, "pods"), exist_ok=True)

    def can_run(self, img: Image, uid: int, gid: int) -> bool:
        """Whether uid can start the image's Python (cached): a venv whose interpreter
        links into root's home cannot run as the pods' non-root user."""
        key = (img.venv, uid, gid)
        if key not in self.runnable:
            probe = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all"]
            r = subprocess.run(
                # Through a shell, as the pod does: setpriv's own exec still has root's
                # capabilities, the shell's exec of python no longer has them.
                ["setpriv", *probe, "bash", "-c", 'exec python -c "import ddpkit"'],
                env={"PATH": img.path(), "HOME": "/"},
                capture_output=True,
                cwd="/",
            )
            self.runnable[key] = r.returncode == 0
        return self.runnable[key]

    def resource_value(self, c, resource: str) -> str:
        if resource.endswith("cpu"):
            return str(self.cpu)
        if resource.endswith("memory"):
            return str(parse_quantity(self.memory))
        return "0"

    # ---- pods ------------------------------------------------------------------
    def bind(self, pod: client.V1Pod, load: dict[str, int], taints: dict[str, list]) -> None:
        """Bind a pending pod to the node schedule.pick chooses (`load`: live pods per node,
        counted up here so that pods bound in one pass spread)."""
        if pod.spec.scheduling_gates:
            return
        node = schedule.pick(pod, {n: self.node_labels(n) for n in self.nodes}, load, taints)
        if node is None:
            if pod.metadata.uid not in self.unschedulable:
                self.unschedulable.add(pod.metadata.uid)
                log.info("%s/%s fits no node (nodeSelector, node affinity): left Pending",
                         pod.metadata.namespace, pod.metadata.name)  # fmt: skip
            return
        load[node] = load.get(node, 0) + 1
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name),
            target=client.V1ObjectReference(kind="Node", name=node, api_version="v1"),
        )
        try:
            # _preload_content=False: the client cannot decode the Binding it gets back.
            self.core.create_namespaced_binding(
                pod.metadata.namespace, body, _preload_content=False
            )
            log.info("bound %s/%s to %s", pod.metadata.namespace, pod.metadata.name, node)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("bind %s: %s", pod.metadata.name, e.reason)

    def sync(self) -> None:
        pods = self.core.list_pod_for_all_namespaces().items
        load = schedule.live_load(pods)
        taints: dict[str, list] | None = None  # the nodes' (read when a pod waits for one)
        seen = set()
        for pod in pods:
            uid = pod.metadata.uid
            if not pod.spec.node_name:
                if pod.metadata.deletion_timestamp is None and pod.status.phase == "Pending":
                    if taints is None:
                        nodes = self.core.list_node().items
                        taints = {n.metadata.name: list(n.spec.taints or []) for n in nodes}
                    self.bind(pod, load, taints)
                continue
            if pod.spec.node_name not in self.nodes:
                continue
            seen.add(uid)
            if lost(self.state, pod.spec.node_name):
                continue  # its node is down: nothing of it is served (k8s/local/README.md)
            runner = self.runners.get(uid)
            if runner is not None and runner.died_with_node and runner.done.is_set():
                runner.died_with_node = False  # said once: its node is back, as after a reboot
                if pod.metadata.deletion_timestamp is None:
                    runner.finish("Failed")
            if pod.metadata.deletion_timestamp is not None:
                self.delete(pod, runner)
                continue
            if runner is None and pod.status.phase in (None, "Pending"):
                runner = self.runners[uid] = PodRunner(self, pod)
                runner.start()
            elif runner is None and pod.status.phase == "Running":
                # Its process belonged to an earlier agent and is gone.
                self.core.patch_namespaced_pod_status(
                    pod.metadata.name,
                    pod.metadata.namespace,
                    {
                        "status": {
                            "phase": "Failed",
                            "reason": "NodeAgentRestarted",
                            "message": "the node agent restarted",
                        }
                    },
                )
        for uid in list(self.runners):
            if uid not in seen:
                r = self.runners.pop(uid)
                if not r.done.is_set():
                    threading.Thread(target=r.terminate, args=(0,), daemon=True).start()
        self.write_hosts(pods, self.core.list_service_for_all_namespaces().items)

    def delete(self, pod: client.V1Pod, runner: PodRunner | None) -> None:
        """Graceful deletion: stop the processes, then remove the pod for good."""
        if runner is not None and not runner.stopping.is_set():
            grace = pod.metadata.deletion_grace_period_seconds
            if grace is None:
                grace = pod.spec.termination_grace_period_seconds or 30

            def stop_then_remove():
                runner.terminate(grace)
                runner.done.wait(5)
                self.remove(pod)

            threading.Thread(target=stop_then_remove, daemon=True).start()
        elif runner is None or runner.done.is_set():
            self.remove(pod)

    def remove(self, pod: client.V1Pod) -> None:
        try:
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("delete %s: %s", pod.metadata.name, e.reason)

    # ---- main loop ------------------------------------------------------------------
    def run(self, cert: str | None, key: str | None) -> None:
        self.network.up()
        self.serve_api()
        self.write_hosts([])
        self.register()
        if cert and key:
            self.serve_logs(cert, key)
        threading.Thread(target=self.heartbeat, daemon=True).start()
        while not self.stop.is_set():
            try:
                self.sync()
            except Exception:  # the API server may be restarting: try again
                log.exception("sync failed")
            self.stop.wait(1)
        # Stop every pod at once (SIGTERM, 5 s, SIGKILL): down.sh waits 15 s.
        runners = list(self.runners.values())
        for r in runners:
            r.stopping.set()
            r.signal_all(signal.SIGTERM)
        end = time.monotonic() + 5
        while time.monotonic() < end and not all(r.done.is_set() for r in runners):
            time.sleep(0.1)
        for r in runners:
            r.signal_all(signal.SIGKILL)
            r.done.wait(2)
        self.clear_hosts()
        self.network.down()
