"""How a Kubernetes job's pods announce the run's metrics endpoint (the job's metrics_port:
rank 0 of the kit's trainer serves its Prometheus figures there, train/observe/), the usual
way: a containerPort named `metrics` (what a PodMonitor selects) and the `prometheus.io/*`
annotations Prometheus' `kubernetes-pods` scrape job keys on. Nothing without metrics_port,
so a job without it renders as before."""

from __future__ import annotations

from typing import Any

from ddpkit.tools.jobspec import JobSpec

METRICS_PORT_NAME = "metrics"


def metrics_ports(spec: JobSpec) -> list[dict[str, Any]]:
    """The container's port of the metrics endpoint; none without metrics_port."""
    if not spec.metrics_port:
        return []
    return [{"name": METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"}]


def scrape_annotations(spec: JobSpec) -> dict[str, str]:
    """The annotations Prometheus' usual `kubernetes-pods` scrape job keys on."""
    if not spec.metrics_port:
        return {}
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(spec.metrics_port),
        "prometheus.io/path": "/metrics",
    }


def annotate(patch: Any, pod_labels: dict[str, str], notes: dict[str, str]) -> None:
    """The TrainJob's pod metadata (Trainer 2.1+: where its patch labels the pods) gets
    `notes`: every node's pod announces the endpoint, the one with rank 0 answers (Trainer
    2.0 takes no per-job pod metadata: its runtime's)."""
    if isinstance(patch, dict):
        if patch.get("labels") == pod_labels and notes:
            patch["annotations"] = dict(notes)
        for v in patch.values():
            annotate(v, pod_labels, notes)
    elif isinstance(patch, list):
        for v in patch:
            annotate(v, pod_labels, notes)
