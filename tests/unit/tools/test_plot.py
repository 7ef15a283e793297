"""ddpkit.tools.plot on metrics.jsonl files in the trainer's record format.

Here the tests that run in this process; those that start processes in
tests/process/tools/test_plot.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ddpkit.tools.plot import load_run

from tests.badjson import cases, damaged
from tests.trainrun import run_module

ROOT = Path(__file__).resolve().parents[3]


def record(step: int, loss: float, **extra) -> dict:
    # The keys train/loop/trainer.py logs per step.
    rec = {
        "step": step,
        "loss": loss,
        "lr": 1e-3 * min(1.0, step / 5),
        "grad_norm": 1.0 / step,
        "throughput": 1000.0 + step,
        "throughput_unit": "samples/s",
        "samples_per_s": 1000.0 + step,
        "step_time_s": 0.01,
        "mem_bytes": 700 * 2**20 + step,
        "epoch": 0,
        "time_s": 0.01 * step,
    }
    rec.update(extra)
    return rec


def write_run(path: Path, records: list[dict], tail: str = "", summary: dict | None = None) -> Path:
    path.mkdir(parents=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (path / "metrics.jsonl").write_text(lines + tail)
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def plot(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("ddpkit.tools.plot", *args)


def test_resumed_run_keeps_the_newest_record_and_skips_a_torn_line(tmp_path):
    # Preempted after step 3 with a checkpoint at step 2: steps 3.. are logged again.
    recs = [record(1, 3.0), record(2, 2.0), record(3, 1.5), record(3, 1.4), record(4, 1.2)]
    run = load_run(write_run(tmp_path / "r", recs, tail='{"step": 5, "lo'))
    assert [r["step"] for r in run.records] == [1, 2, 3, 4]
    assert run.records[2]["loss"] == 1.4
    assert run.skipped == 1


@pytest.mark.parametrize("content", [None, "", "not json\n"])
def test_bad_run_dir_one_line_exit_2(tmp_path, content):
    d = tmp_path / "run"
    d.mkdir()
    if content is not None:
        (d / "metrics.jsonl").write_text(content)
    r = plot(str(d))
    assert r.returncode == 2
    assert "metrics.jsonl" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not list(d.glob("*.png"))


# --- what the charts show (matplotlib objects, not only files) ---------------------------


def _axes(fig):
    return fig.get_axes()


SUMMARIES = cases(damaged({"steps": 3, "eval_loss": 1.5}, {"eval_loss": ("number", "null")}))


@pytest.mark.parametrize("label", list(SUMMARIES))
def test_a_damaged_summary_is_one_warning_and_the_charts_without_it(tmp_path, capsys, label):
    path = write_run(tmp_path / "r", [record(s, 2.0 / s) for s in (1, 2, 3)])
    (path / "summary.json").write_bytes(SUMMARIES[label])
    run = load_run(path)
    assert run.summary is None and len(run.records) == 3
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: ignoring {path / 'summary.json'} (")


LINES = cases(damaged(record(2, 1.0), {"step": ("integer",), "throughput_unit": ("string",)},
                      required={"step"}))  # fmt: skip


@pytest.mark.parametrize("label", [lb for lb in LINES if lb not in ("empty", "blank")])
def test_a_damaged_metrics_line_is_skipped_and_counted(tmp_path, label):
    path = write_run(tmp_path / "r", [record(1, 2.0)], tail=LINES[label].decode(errors="replace"))
    run = load_run(path)
    assert [r["step"] for r in run.records] == [1] and run.skipped == 1
    assert run.throughput_unit == "samples/s"
