"""tools.plot on metrics.jsonl files in the trainer's record format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.trainrun import run_module
from tools.plot import load_run

ROOT = Path(__file__).resolve().parents[1]


def record(step: int, loss: float, **extra) -> dict:
    # The keys train/trainer.py logs per step.
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
    return run_module("tools.plot", *args)


def is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_run_writes_charts_into_the_run_dir(tmp_path):
    run = write_run(
        tmp_path / "mlp",
        [record(s, 2.3 / s) for s in range(1, 21)],
        summary={"eval_loss": 0.2},
    )
    r = plot(str(run))
    assert r.returncode == 0, r.stderr
    for chart in ("loss", "lr", "throughput", "memory", "grad_norm"):
        assert is_png(run / f"{chart}.png"), chart
    assert "mlp: steps 1..20, loss 2.3000 -> 0.1150" in r.stdout


def test_resumed_run_keeps_the_newest_record_and_skips_a_torn_line(tmp_path):
    # Preempted after step 3 with a checkpoint at step 2: steps 3.. are logged again.
    recs = [record(1, 3.0), record(2, 2.0), record(3, 1.5), record(3, 1.4), record(4, 1.2)]
    run = load_run(write_run(tmp_path / "r", recs, tail='{"step": 5, "lo'))
    assert [r["step"] for r in run.records] == [1, 2, 3, 4]
    assert run.records[2]["loss"] == 1.4
    assert run.skipped == 1


def test_several_runs_on_one_chart(tmp_path):
    a = write_run(tmp_path / "runs" / "ddp", [record(s, 2.0 / s) for s in range(1, 6)])
    b = write_run(tmp_path / "runs" / "fsdp", [record(s, 2.1 / s) for s in range(1, 9)])
    r = plot(str(a), str(b), "--x", "time")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "runs" / "compare"
    assert is_png(out / "loss.png") and is_png(out / "throughput.png")
    assert not (a / "loss.png").exists()  # the comparison does not touch the runs
    assert "ddp:" in r.stdout and "fsdp:" in r.stdout


def test_missing_metric_skips_its_chart(tmp_path):
    recs = [{k: v for k, v in record(s, 1.0).items() if k != "mem_bytes"} for s in range(1, 4)]
    run = write_run(tmp_path / "nomem", recs)
    r = plot(str(run), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert is_png(tmp_path / "o" / "loss.png")
    assert not (tmp_path / "o" / "memory.png").exists()


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
