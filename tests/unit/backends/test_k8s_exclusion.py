"""A node that failed twice kept out of a PyTorchJob's recreated pods (k8s.exclude_failed_nodes),
in process: the patch the pod makes to its own job (ddpkit.k8s.exclude), the objects and env
the renderer adds for it, and the local node agent's scheduling that honours it
(k8s/local/nodeagent/schedule.py). The real cluster's run is in test_k8s_recovery.py.

The tests of this file that start processes or take longer:
tests/process/backends/test_k8s_exclusion.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ddpkit.k8s import backend as k8s
from ddpkit.k8s import exclude
from ddpkit.tools.jobspec import SpecError, load_spec
from kubernetes import client

REPO = Path(__file__).resolve().parents[3]


sys.path.insert(0, str(REPO / "k8s" / "local"))
from nodeagent import schedule  # noqa: E402

sys.path.remove(str(REPO / "k8s" / "local"))
HOST = exclude.HOSTNAME_LABEL


def job(**template_spec) -> dict:
    rs = {"replicas": 1, "template": {"spec": {"containers": [], **template_spec}}}
    return {"metadata": {"resourceVersion": "7"},
            "spec": {"pytorchReplicaSpecs": {"Master": rs, "Worker": dict(rs)}}}  # fmt: skip


def test_the_patch_keeps_the_nodes_out_of_every_replica_and_every_term() -> None:
    plain = job()
    body = exclude.patch_for(plain, ["n2"])
    assert body["metadata"] == {"resourceVersion": "7"}  # a concurrent change fails it (409)
    for r in ("Master", "Worker"):
        aff = body["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["affinity"]
        terms = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n2"]}]}]}  # fmt: skip
    # the user's own terms are ORed: the NotIn joins each one, their expressions stay
    users = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
            {"matchExpressions": [{"key": HOST, "operator": "NotIn", "values": ["n1"]}]},
        ]}}, "podAffinity": {"x": 1}}  # fmt: skip
    mine = job(affinity=users)
    body = exclude.patch_for(mine, ["n2"])
    aff = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["affinity"]
    assert aff["podAffinity"] == {"x": 1}
    t1, t2 = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]  # fmt: skip
    assert t1["matchExpressions"] == [
        {"key": "gpu", "operator": "In", "values": ["h100"]},
        {"key": HOST, "operator": "NotIn", "values": ["n2"]},
    ]
    assert t2["matchExpressions"] == [{"key": HOST, "operator": "NotIn", "values": ["n1", "n2"]}]
    assert users["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][1]["matchExpressions"][0]["values"] == ["n1"]  # not mutated  # fmt: skip
    # applied, the job keeps both out, and the same nodes again need no patch
    patched = job(affinity=aff)
    assert exclude.excluded(patched) == ["n1", "n2"]
    assert exclude.patch_for(patched, ["n2"]) is None
    assert exclude.patch_for(patched, ["n1"]) is not None  # the first term still lets n1 in
    assert exclude.excluded(plain) == []


def test_without_the_option_the_pod_says_how_to_turn_it_on(monkeypatch) -> None:
    monkeypatch.delenv(exclude.JOB_ENV, raising=False)
    line = exclude.keep_off(["n2"])
    assert "node n2 failed twice" in line and "k8s.exclude_failed_nodes = true" in line


def test_without_api_access_the_pod_says_what_it_needs(monkeypatch) -> None:
    monkeypatch.setenv(exclude.JOB_ENV, "j")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    line = exclude.keep_off(["n2"])  # no in-cluster config here: one line, no raise
    assert line.startswith("node n2 failed twice but could not be kept out of PyTorchJob j (")
    assert "needs get and patch on its job" in line and "\n" not in line


@pytest.mark.parametrize(
    "sets",
    [[], ["k8s.elastic.min=1", "k8s.elastic.max=2"], ["fault_tolerance=torchft"],
     ["k8s.api=trainjob"]],
)  # fmt: skip
def test_the_option_is_refused_where_no_pod_is_recreated(sets) -> None:
    base = [] if not sets else ["k8s.pvc_size=1Gi"]
    spec = load_spec(REPO / "configs/default.toml", [*base, *sets, "k8s.exclude_failed_nodes=true"],
                     2, 2)  # fmt: skip
    with pytest.raises(SpecError, match="k8s.exclude_failed_nodes works where the operator"):
        k8s.render(spec)


# --- the local node agent's scheduling ---------------------------------------------------------

NODES = {n: {HOST: n, "kubernetes.io/os": "linux"} for n in ("node-0", "node-1", "node-2")}


def pod(selector=None, terms=None) -> client.V1Pod:
    affinity = None
    if terms is not None:
        affinity = client.V1Affinity(node_affinity=client.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=[
                    client.V1NodeSelectorRequirement(key=k, operator=op, values=v)
                    for k, op, v in term]) for term in terms])))  # fmt: skip
    return client.V1Pod(spec=client.V1PodSpec(containers=[], node_selector=selector,
                                              affinity=affinity))  # fmt: skip


def test_the_agent_places_a_pod_on_the_least_loaded_node_it_fits() -> None:
    assert schedule.pick(pod(), NODES, {}) == "node-0"  # a tie: the first by name
    assert schedule.pick(pod(), NODES, {"node-0": 2, "node-1": 1}) == "node-2"
    out = pod(terms=[[(HOST, "NotIn", ["node-0", "node-2"])]])
    assert schedule.pick(out, NODES, {"node-1": 5}) == "node-1"
    assert schedule.pick(pod(terms=[[(HOST, "NotIn", list(NODES))]]), NODES, {}) is None
    # terms ORed, expressions ANDed; nodeSelector on top
    either = pod(terms=[[(HOST, "In", ["node-2"])], [(HOST, "In", ["node-1"])]])
    assert schedule.pick(either, NODES, {"node-1": 1}) == "node-2"
    both = pod(terms=[[(HOST, "In", ["node-1", "node-2"]), (HOST, "NotIn", ["node-2"])]])
    assert schedule.pick(both, NODES, {}) == "node-1"
    assert schedule.pick(pod(selector={HOST: "node-2"}), NODES, {}) == "node-2"
    assert schedule.pick(pod(selector={"gpu": "h100"}), NODES, {}) is None
    assert schedule.pick(pod(terms=[[("gpu", "DoesNotExist", None)]]), NODES, {}) == "node-0"
    assert schedule.pick(pod(terms=[[("kubernetes.io/os", "Exists", None)]]), NODES, {}) == "node-0"


def test_the_agent_counts_only_the_pods_that_hold_a_node() -> None:
    def p(node, phase, deleting=False):
        meta = client.V1ObjectMeta(deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None)
        return client.V1Pod(metadata=meta, spec=client.V1PodSpec(containers=[], node_name=node),
                            status=client.V1PodStatus(phase=phase))  # fmt: skip

    pods = [p("node-0", "Running"), p("node-0", "Pending"), p("node-0", "Succeeded"),
            p("node-1", "Failed"), p("node-1", "Running", deleting=True), p(None, "Pending")]  # fmt: skip
    assert schedule.live_load(pods) == {"node-0": 2}
