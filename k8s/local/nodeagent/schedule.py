"""Which node a pending pod goes to: the scheduler's two jobs that the kit's jobs rely on.

Filter: the pod's nodeSelector and the required terms of its node affinity against each
node's labels (a kit job keeps a node that failed twice out this way, `kubernetes.io/hostname
NotIn [...]`, see ddpkit.k8s.exclude); a pod no node fits stays Pending, as with a real
scheduler. Score: the node with the fewest live pods, the first by name on a tie (a real
scheduler's least-allocated spread; deterministic, so a recreated pod of an idle cluster
goes where its predecessor was). Preferred terms, taints and resources are not looked at.
"""

from __future__ import annotations

from typing import Any


def _matches(expr: Any, labels: dict[str, str]) -> bool:
    """One matchExpression (In, NotIn, Exists, DoesNotExist, Gt, Lt) against node labels."""
    have = labels.get(expr.key)
    values = list(expr.values or [])
    op = expr.operator
    if op == "In":
        return have is not None and have in values
    if op == "NotIn":
        return have is None or have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and values:
        try:
            a, b = int(have), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def fits(pod: Any, labels: dict[str, str]) -> bool:
    """Whether a node with `labels` passes the pod's nodeSelector and required node affinity
    (its terms ORed, each term's expressions ANDed; an empty term matches nothing)."""
    spec = pod.spec
    if any(labels.get(k) != v for k, v in (spec.node_selector or {}).items()):
        return False
    aff = spec.affinity and spec.affinity.node_affinity
    required = aff and aff.required_during_scheduling_ignored_during_execution
    if not required:
        return True
    for term in required.node_selector_terms or []:
        exprs = list(term.match_expressions or [])
        if exprs and all(_matches(e, labels) for e in exprs):
            return True
    return False


def pick(pod: Any, nodes: dict[str, dict[str, str]], load: dict[str, int]) -> str | None:
    """The node (name -> labels) for `pod`: among those it fits, the one with the fewest live
    pods (`load`), the first by name on a tie; None when none fits."""
    able = [n for n in sorted(nodes) if fits(pod, nodes[n])]
    return min(able, key=lambda n: load.get(n, 0)) if able else None


def live_load(pods: list[Any]) -> dict[str, int]:
    """Pods per node that hold it: bound, not ended, not being deleted."""
    load: dict[str, int] = {}
    for p in pods:
        node = p.spec.node_name
        if not node or p.metadata.deletion_timestamp is not None:
            continue
        if p.status is not None and p.status.phase in ("Succeeded", "Failed"):
            continue
        load[node] = load.get(node, 0) + 1
    return load
