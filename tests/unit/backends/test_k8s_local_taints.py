"""The local node agent's scheduler (k8s/local/nodeagent/schedule.py) and a node that stopped
answering: no pod is bound to a node the node lifecycle controller tainted unreachable
(NoSchedule and NoExecute), unless it tolerates the taint, as kube-scheduler does; so a pod
recreated off a lost node is not bound straight back to it."""

from __future__ import annotations

import sys
from pathlib import Path

from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "k8s" / "local"))
from nodeagent import schedule  # noqa: E402


def _pod(tolerations: list[client.V1Toleration] | None = None) -> client.V1Pod:
    return client.V1Pod(spec=client.V1PodSpec(containers=[], tolerations=tolerations))


def test_the_local_scheduler_binds_no_pod_to_a_node_tainted_unreachable() -> None:
    nodes = {n: {"kubernetes.io/hostname": n} for n in ("n0", "n1", "n2")}
    # what the node lifecycle controller puts on a node that stopped answering
    gone = [client.V1Taint(key="node.kubernetes.io/unreachable", effect=e)
            for e in ("NoSchedule", "NoExecute")]  # fmt: skip
    taints = {"n1": gone}
    # n1 had the fewest pods: the lost node's pod would have gone straight back to it
    assert schedule.pick(_pod(), nodes, {"n0": 1, "n2": 1}, taints) == "n0"
    # the job's pods tolerate NoExecute for node_lost_s, not NoSchedule: kept off too
    rendered = [client.V1Toleration(key="node.kubernetes.io/unreachable", operator="Exists",
                                    effect="NoExecute", toleration_seconds=30)]  # fmt: skip
    assert schedule.pick(_pod(rendered), nodes, {"n0": 1, "n2": 1}, taints) == "n0"
    everything = [client.V1Toleration(operator="Exists")]  # as kube-scheduler: it may go there
    assert schedule.pick(_pod(everything), nodes, {"n0": 1, "n2": 1}, taints) == "n1"
    soft = {"n1": [client.V1Taint(key="x", effect="PreferNoSchedule")]}
    assert schedule.pick(_pod(), nodes, {"n0": 1, "n2": 1}, soft) == "n1"
    assert schedule.pick(_pod(), {"n1": nodes["n1"]}, {}, taints) is None
