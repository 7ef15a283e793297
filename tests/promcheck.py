"""A run's Prometheus figures (train/observe/) read back with the official parser
(prometheus_client's) and held to what the run's own files say: goodput.json (the launcher's
report) and summary.json (the trainer's). The local, SLURM and Kubernetes tests share it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict[str, Any]:
    """family name -> Metric (a counter's name without _total)."""
    return {m.name: m for m in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str, **labels: str) -> float:
    (s,) = [s for s in fams[name].samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return s.value


def assert_agrees(fams: dict[str, Any], run_dir: Path, ranks: int | None = None) -> None:
    """The final figures equal the run's goodput.json and summary.json (when it has one);
    `ranks`: each rank's step time is there too."""
    rep = json.loads((run_dir / "goodput.json").read_text())
    assert value(fams, "ddpkit_goodput_ratio") == pytest.approx(rep["goodput"])
    assert value(fams, "ddpkit_wall_seconds") == pytest.approx(rep["wall_s"])
    assert value(fams, "ddpkit_productive_seconds") == pytest.approx(rep["productive_s"])
    assert value(fams, "ddpkit_restarts") == rep["attempts"] - 1
    assert value(fams, "ddpkit_checkpoint_blocking_seconds") == pytest.approx(
        rep["ckpt_blocking_s"]
    )
    kinds: dict[str, int] = {}
    for f in rep["failures"]:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    shown = {s.labels["kind"]: s.value for s in fams["ddpkit_failures"].samples if s.value}
    assert shown == kinds, (shown, rep["failures"])
    for kind in kinds:
        lost = sum(f["lost_s"] for f in rep["failures"] if f["kind"] == kind)
        assert value(fams, "ddpkit_failure_lost_seconds", kind=kind) == pytest.approx(
            lost, abs=0.01
        )
    assert value(fams, "ddpkit_run_finished") == (1 if rep["finished"] else 0)
    if (run_dir / "summary.json").is_file():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert value(fams, "ddpkit_step") == summary["steps"]
        assert value(fams, "ddpkit_loss") == pytest.approx(summary["final_loss"])
        assert value(fams, "ddpkit_samples_per_second") == pytest.approx(summary["samples_per_s"])
    if ranks is not None:
        got = {s.labels["rank"] for s in fams["ddpkit_step_duration_seconds"].samples}
        assert got == {str(r) for r in range(ranks)}
