"""Which node a pending pod goes to: the scheduler's two jobs that the kit's jobs rely on.

Filter: the pod's nodeSelector and the required terms of its node affinity against each
node's labels (a kit job keeps a node that failed twice out this way, `kubernetes.io/hostname
NotIn [...]`, see ddpkit.k8s.exclude); a pod no node fits stays Pending, as with a real
scheduler; and the node's NoSchedule and NoExecute taints the pod does not tolerate (the node
lifecycle controller taints a node that stopped answering unreachable: a pod recreated off
it must not be bound back to it). Score: the node with the fewest live pods, the first by
name on a tie (a real scheduler's least-allocated spread; deterministic, so a recreated pod
of an idle cluster goes where its predecessor was). Preferred terms, PreferNoSchedule and
resources are not looked at.
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


def tolerates(pod: Any, taint: Any) -> bool:
    """The pod tolerates the taint (the scheduler's rule: the key matches, or the toleration's
    key is empty with Exists; Equal compares the value; an empty effect matches every one)."""
    for t in pod.spec.tolerations or []:
        if t.effect and t.effect != taint.effect:
            continue
        if t.key and t.key != taint.key:
            continue
        if (t.operator or "Equal") == "Exists" or (t.value or "") == (taint.value or ""):
            return True
    return False


def untolerated(pod: Any, taints: list[Any]) -> bool:
    """A NoSchedule or NoExecute taint of the node that the pod does not tolerate."""
    return any(t.effect in ("NoSchedule", "NoExecute") and not tolerates(pod, t) for t in taints)


def pick(
    pod: Any,
    nodes: dict[str, dict[str, str]],
    load: dict[str, int],
    taints: dict[str, list[Any]] | None = None,
) -> str | None:
    """The node (name -> labels) for `pod`: among those it fits (labels, and `taints`: name ->
    the node's taints), the one with the fewest live pods (`load`), the first by name on a
    tie; None when none fits."""
    taints = taints or {}
    able = [
        n for n in sorted(nodes) if fits(pod, nodes[n]) and not untolerated(pod, taints.get(n, []))
    ]
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
