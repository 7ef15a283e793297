"""A Kubernetes job's metrics endpoint, announced the usual way (k8s/scrape.py): a containerPort
named `metrics` and the prometheus.io annotations on the pods where rank 0 runs, and
DDPKIT_METRICS_PORT for the trainer; nothing of it without metrics_port (the goldens)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ddpkit.k8s import backend as k8s
from ddpkit.tools.jobspec import SpecError, load_spec

REPO = Path(__file__).resolve().parents[3]
NOTES = {"prometheus.io/scrape": "true", "prometheus.io/port": "9400",
         "prometheus.io/path": "/metrics"}  # fmt: skip


def _job(*sets: str, nodes: int = 2) -> dict:
    spec = load_spec(REPO / "configs/default.toml", list(sets), nodes, 2)
    (job,) = [d for d in yaml.safe_load_all(k8s.K8sBackend().render(spec)) if d]
    return job


def _pods(job: dict) -> dict[str, dict]:
    return {role: r["template"] for role, r in job["spec"]["pytorchReplicaSpecs"].items()}


def _ports_and_env(template: dict) -> tuple[dict[str, int], dict[str, str]]:
    (c,) = template["spec"]["containers"]
    return ({p["name"]: p["containerPort"] for p in c["ports"]},
            {e["name"]: e.get("value") for e in c["env"]})  # fmt: skip


def test_the_master_announces_the_endpoint_and_every_pod_opens_the_port():
    pods = _pods(_job("metrics_port=9400"))
    assert pods["Master"]["metadata"]["annotations"] == NOTES
    assert "annotations" not in pods["Worker"]["metadata"]  # rank 0 is the master's
    for template in pods.values():
        ports, env = _ports_and_env(template)
        assert ports["metrics"] == 9400 and env["DDPKIT_METRICS_PORT"] == "9400"


def test_an_elastic_job_announces_every_worker():
    pods = _pods(_job("metrics_port=9400", "k8s.elastic.min=1", "k8s.elastic.max=2"))
    assert list(pods) == ["Worker"] and pods["Worker"]["metadata"]["annotations"] == NOTES


def test_a_trainjob_s_pods_are_annotated():
    job = _job("metrics_port=9400", "k8s.api=trainjob")
    found: list[dict] = []

    def walk(v):
        if isinstance(v, dict):
            if "annotations" in v:
                found.append(v)
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(job["spec"])
    (meta,) = found
    assert meta["annotations"] == NOTES and meta["labels"]["app.kubernetes.io/instance"]


def test_without_metrics_port_nothing_is_announced():
    job = _job()
    text = yaml.safe_dump(job)
    assert "prometheus.io" not in text and "DDPKIT_METRICS" not in text
    ports, _ = _ports_and_env(_pods(job)["Master"])
    assert "metrics" not in ports


@pytest.mark.parametrize("value", ["70000", "-1"])
def test_a_bad_metrics_port_is_refused_with_the_fix(value):
    with pytest.raises(SpecError, match=r"metrics_port .* or 0 for no endpoint"):
        load_spec(REPO / "configs/default.toml", [f"metrics_port={value}"], 1, 1)
