"""The run's figures in the Prometheus text format (train/observe/): what the launcher leaves in
the run dir, what the trainer's exporter serves and writes, read back with the official
parser (prometheus_client's), and the failures that must not fail a run."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
from ddpkit.train import goodput, observe
from ddpkit.train.observe import exposition
from ddpkit.train.observe.live import Exporter
from prometheus_client.openmetrics.exposition import generate_latest as om_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse

RUN = "run1"


def _at(run_dir: Path, kind: str, t: float, attempt: int = 0, **f) -> None:
    assert goodput.record(run_dir, kind, time=t, launch="a", run="r-1", attempt=attempt, **f)


def _killed_run(run_dir: Path, trainer: bool = True) -> None:
    """Attempt 0: ready at 12, saves at 20 (1 s blocking) and 30, rank 1 killed at 34 (its
    peer down at 35); attempt 1: ready at 41 (1.5 s load), a save at 50, done at 60."""
    _at(run_dir, "attempt", 10, node_number=0, ranks=[0, 2])
    _at(run_dir, "ready", 12, step=0, load_s=2)
    _at(run_dir, "save", 20, step=10, blocking_s=1)
    _at(run_dir, "save", 30, step=20, blocking_s=0)
    _at(run_dir, "end", 34, rank=1, code=-signal.SIGKILL)
    _at(run_dir, "end", 35, rank=0, code=1)
    _at(run_dir, "attempt", 37, attempt=1, node_number=0, ranks=[0, 2])
    _at(run_dir, "ready", 41, attempt=1, step=20, load_s=1.5)
    _at(run_dir, "save", 50, attempt=1, step=30, blocking_s=0.5)
    _at(run_dir, "done", 60, attempt=1, step=40)
    if trainer:
        rec = {"step": 40, "loss": 0.5, "samples_per_s": 900.0, "step_time_s": 0.01,
               "total_steps": 40, "eta_s": 0.0, "slowest_rank": 1, "step_time_max_s": 0.02}  # fmt: skip
        (run_dir / "metrics.jsonl").write_text(json.dumps(rec) + "\n{torn")
        summary = {"steps": 40, "final_loss": 0.5, "samples_per_s": 1000.0, "world_size": 2,
                   "goodput": {"run": "r-1"}}  # fmt: skip
        (run_dir / "summary.json").write_text(json.dumps(summary))


def _read(path: Path) -> dict[str, dict[tuple, float]]:
    """family -> {labels without `run`: value}, through the official parser."""
    out: dict[str, dict[tuple, float]] = {}
    for name, fam in exposition.parse(path.read_text()).items():
        for s in fam.samples:
            assert s.labels.pop("run") == path.parent.name or path.name.startswith("ddpkit-")
            out.setdefault(name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _one(figs: dict, name: str) -> float:
    (value,) = figs[name].values()
    return value


def test_the_launcher_leaves_figures_that_agree_with_goodput_json_and_the_summary(tmp_path):
    run_dir = tmp_path / RUN
    _killed_run(run_dir)
    goodput.launcher_exit(run_dir, requeue=False, node_rank=0, finished=True, attempt=1)
    rep = json.loads((run_dir / goodput.REPORT_FILE).read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    figs = _read(run_dir / observe.METRICS_PROM)
    assert _one(figs, "ddpkit_goodput_ratio") == pytest.approx(rep["goodput"])
    assert _one(figs, "ddpkit_wall_seconds") == pytest.approx(rep["wall_s"])
    assert _one(figs, "ddpkit_productive_seconds") == pytest.approx(rep["productive_s"])
    assert _one(figs, "ddpkit_checkpoint_blocking_seconds") == pytest.approx(1.5)
    assert _one(figs, "ddpkit_restarts") == rep["attempts"] - 1 == 1
    assert figs["ddpkit_failures"][(("kind", "killed"),)] == 1
    assert sum(figs["ddpkit_failures"].values()) == len(rep["failures"]) == 1
    (kill,) = rep["failures"]
    assert figs["ddpkit_failure_lost_seconds"][(("kind", "killed"),)] == pytest.approx(
        kill["lost_s"], abs=1e-3
    )
    bad = {dict(k)["category"]: v for k, v in figs["ddpkit_badput_seconds"].items()}
    assert bad["detection"] == pytest.approx(kill["detect_s"])
    assert bad["restart"] == pytest.approx(kill["restart_s"])
    assert bad["reload"] == pytest.approx(kill["load_s"])
    assert bad["recompute"] == pytest.approx(kill["recompute_s"])
    assert bad["checkpoint"] == pytest.approx(rep["ckpt_blocking_s"])
    assert sum(bad.values()) + rep["productive_s"] == pytest.approx(rep["wall_s"])
    assert _one(figs, "ddpkit_step") == summary["steps"] == 40
    assert _one(figs, "ddpkit_loss") == summary["final_loss"]
    assert _one(figs, "ddpkit_samples_per_second") == summary["samples_per_s"]
    assert _one(figs, "ddpkit_checkpoint_step") == 30
    assert _one(figs, "ddpkit_checkpoint_timestamp_seconds") == 50
    assert _one(figs, "ddpkit_run_finished") == 1
    assert figs["ddpkit_run_info"] == {(("run_id", "r-1"),): 1.0}


def test_a_user_script_gets_the_figures_it_notes(tmp_path):
    """No metrics.jsonl, no summary: the step and the checkpoint from its own notes."""
    run_dir = tmp_path / RUN
    _killed_run(run_dir, trainer=False)
    goodput.launcher_exit(run_dir, requeue=False, node_rank=0, finished=True, attempt=1)
    figs = _read(run_dir / observe.METRICS_PROM)
    assert _one(figs, "ddpkit_step") == 40  # its `done`
    assert _one(figs, "ddpkit_checkpoint_step") == 30
    assert "ddpkit_loss" not in figs and "ddpkit_samples_per_second" not in figs
    assert figs["ddpkit_failures"][(("kind", "killed"),)] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_exporter_serves_each_rank_and_the_launcher_keeps_them(tmp_path, monkeypatch):
    run_dir = tmp_path / RUN
    _killed_run(run_dir)
    said: list[str] = []
    port = _free_port()
    exp = Exporter(run_dir, 40, 2, port, str(tmp_path / "textfiles"), said.append, goodput)
    try:
        rec = {"step": 40, "loss": 0.5, "samples_per_s": 900.0, "step_time_s": 0.01}
        exp.on_log(rec, [0.01, 0.03])
        with urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=10) as r:
            body = r.read().decode()
        fams = exposition.parse(body)
        per_rank = {s.labels["rank"]: s.value for s in fams["ddpkit_step_duration_seconds"].samples}
        assert per_rank == {"0": 0.01, "1": 0.03}
        assert fams["ddpkit_goodput_ratio"].samples[0].value > 0
        assert fams["ddpkit_steps_planned"].samples[0].value == 40
    finally:
        exp.close()
    assert said == []
    textfile = tmp_path / "textfiles" / f"ddpkit-{RUN}.prom"
    assert "ddpkit_step_duration_seconds" in _read(textfile)
    assert not [p for p in textfile.parent.iterdir() if p != textfile]  # renamed into place
    # The launcher's final file (a new report) keeps what only the trainer knew
    monkeypatch.setenv(observe.TEXTFILE_DIR_ENV, str(tmp_path / "textfiles"))
    goodput.launcher_exit(run_dir, requeue=False, node_rank=0, finished=True, attempt=1)
    for path in (run_dir / observe.METRICS_PROM, textfile):
        figs = _read(path)
        assert figs["ddpkit_step_duration_seconds"] == {(("rank", "0"),): 0.01,
                                                        (("rank", "1"),): 0.03}  # fmt: skip
        assert _one(figs, "ddpkit_steps_planned") == 40


def test_a_taken_port_and_an_unwritable_dir_are_one_warning_each(tmp_path):
    run_dir = tmp_path / RUN
    _killed_run(run_dir)
    (tmp_path / "afile").write_text("")
    said: list[str] = []
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        exp = Exporter(run_dir, 40, 2, port, str(tmp_path / "afile"), said.append, goodput)
        exp.on_log({"step": 1, "loss": 1.0}, None)
        exp.close()
    assert exp.port is None
    assert len(said) == 2 and all(s.startswith("warning: metrics: ") for s in said), said
    assert f"port {port}" in said[0] and "training goes on" in said[0]
    assert "afile" in said[1]
    assert (run_dir / observe.METRICS_PROM).is_file()  # the run dir's file all the same


def test_every_name_is_a_prometheus_name_and_both_parsers_read_it(tmp_path):
    run_dir = tmp_path / RUN
    _killed_run(run_dir)
    fig = observe.figures.from_run_dir(run_dir, goodput.report(run_dir), goodput.read(run_dir))
    fig.rank_step_s = {0: 0.01, 1: 0.02}
    fams = exposition.families(fig)
    assert {m.name for m in fams} == set(exposition.METRICS)  # every one listed is shown
    for m in fams:
        assert m.name.startswith("ddpkit_") and m.documentation
        unit = m.name.rsplit("_", 1)[-1]
        assert unit not in ("ms", "milliseconds", "percent", "bytes_total")
    text = exposition.text(fig)
    assert "ddpkit_failures_total{" in text and "_created" not in text
    om = {m.name: m for m in om_parse(om_latest(exposition.registry_of(lambda: fig)).decode())}
    assert set(om) == set(exposition.METRICS)
