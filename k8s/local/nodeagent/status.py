"""What the API server is told: container and pod status (a PodRunner's reports), the
nodes' status, their registration and heartbeats (Lease renewals)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess

from kubernetes import client
from kubernetes.client.rest import ApiException

from .common import AgentView, iso, log, lost, now


class Container:
    """One container of a pod: its process and what the API is told about it."""

    def __init__(self, spec: client.V1Container):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.started: dt.datetime | None = None
        self.finished: dt.datetime | None = None
        self.exit_code: int | None = None
        self.restarts = 0
        self.reason = ""
        self.message = ""

    def state(self) -> dict:
        if self.proc is not None and self.exit_code is None:
            return {"running": {"startedAt": iso(self.started)}}
        if self.exit_code is not None:
            return {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason or ("Completed" if self.exit_code == 0 else "Error"),
                    "message": self.message or None,
                    "startedAt": iso(self.started) if self.started else None,
                    "finishedAt": iso(self.finished) if self.finished else None,
                }
            }
        return {
            "waiting": {"reason": self.reason or "PodInitializing", "message": self.message or None}
        }

    def status(self, image_id: str = "") -> dict:
        running = self.proc is not None and self.exit_code is None
        return {
            "name": self.spec.name,
            "image": self.spec.image or "",
            "imageID": image_id,
            "ready": running,
            "started": running,
            "restartCount": self.restarts,
            "state": self.state(),
        }


class PodStatus:
    """PodRunner's reports to the API (a mixin)."""

    agent: AgentView

    def finish(self, phase: str) -> None:
        self.phase = phase
        self.report()

    def report(self) -> None:
        if lost(self.agent.state, self.pod.spec.node_name):
            return  # its node is down: nobody tells the API server anything
        running = self.phase == "Running" and all(
            c.proc is not None and c.exit_code is None for c in self.main
        )
        initialized = self.phase != "Pending"
        t = iso(now())
        status = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": iso(self.start_time),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
                {"type": "Initialized", "status": str(initialized), "lastTransitionTime": t},
                {"type": "ContainersReady", "status": str(running), "lastTransitionTime": t},
                {"type": "Ready", "status": str(running), "lastTransitionTime": t},
            ],
            "initContainerStatuses": [c.status() for c in self.init] or None,
            "containerStatuses": [c.status() for c in self.main],
        }
        try:
            self.agent.core.patch_namespaced_pod_status(self.name, self.ns, {"status": status})
        except ApiException as e:
            if e.status != 404:
                log.warning("%s: status update failed: %s", self.name, e.reason)


class NodeStatus:
    """The agent's nodes: registration, status and heartbeats (a mixin)."""

    # ---- nodes ---------------------------------------------------------------
    def node_status(self) -> dict:
        t = iso(now())
        res = {
            "cpu": str(self.cpu),
            "memory": self.memory,
            "pods": "110",
            "nvidia.com/gpu": str(self.gpus),
            "ephemeral-storage": "100Gi",
        }
        return {
            "capacity": res,
            "allocatable": res,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "ddpkit-node-agent://0",
                "kernelVersion": os.uname().release,
                "osImage": "ddpkit local node",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ddpkit node agent",
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": t,
                },
                *(
                    {
                        "type": k,
                        "status": "False",
                        "reason": "KubeletHas" + r,
                        "lastHeartbeatTime": t,
                        "lastTransitionTime": t,
                    }
                    for k, r in (
                        ("MemoryPressure", "SufficientMemory"),
                        ("DiskPressure", "NoDiskPressure"),
                        ("PIDPressure", "SufficientPID"),
                    )
                ),
            ],
        }

    @staticmethod
    def node_labels(name: str) -> dict[str, str]:
        """The labels a node registers with (what nodeSelector and node affinity match)."""
        return {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64"}  # fmt: skip

    def register(self) -> None:
        for name in self.nodes:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": self.node_labels(name),
                },
            }
            try:
                self.core.create_node(body)
            except ApiException as e:
                if e.status != 409:
                    raise
            self.core.patch_node_status(name, {"status": self.node_status()})
            log.info("node %s registered", name)

    def heartbeat(self) -> None:
        """Node Lease renewals and Ready condition, so the node lifecycle
        controller never marks the nodes NotReady (and evicts their pods)."""
        while not self.stop.wait(10):
            for name in self.nodes:
                if lost(self.state, name):
                    continue  # a node that is down renews nothing: it goes NotReady
                try:
                    self.renew_lease(name)
                    self.core.patch_node_status(
                        name, {"status": {"conditions": self.node_status()["conditions"]}}
                    )
                except ApiException as e:
                    log.warning("heartbeat %s: %s", name, e.reason)

    def renew_lease(self, name: str) -> None:
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease(
                "kube-node-lease", {"metadata": {"name": name}, "spec": spec}
            )
