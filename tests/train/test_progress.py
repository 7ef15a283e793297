"""The plain progress line (logs under SLURM, Kubernetes, Docker: no terminal, no bar) shows
the step and an ETA, and metrics.jsonl carries the ETA for a launcher's status line."""

from __future__ import annotations

import json

import pytest
from ddpkit.train import metrics
from ddpkit.train.metrics import Reporter, format_duration


def _rec(step: int) -> dict:
    return {
        "step": step, "loss": 1.0, "lr": 1e-3, "grad_norm": 0.5, "throughput": 100.0,
        "throughput_unit": "samples/s", "step_time_s": 0.5, "mem_bytes": 2**20,
    }  # fmt: skip


def test_the_plain_line_shows_the_step_and_an_eta_from_the_pace_so_far(
    tmp_path, capsys, monkeypatch
):
    clock = iter([100.0, 110.0, 130.0])
    monkeypatch.setattr(metrics.time, "monotonic", lambda: next(clock))
    reporter = Reporter(tmp_path, True, 100, "plain")
    for step in (1, 11, 31):
        reporter.log(_rec(step))
    reporter.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step      1/100 ") and "eta" not in lines[0]  # no pace yet
    assert lines[1].endswith(" eta 1m29s"), lines[1]  # 1 s a step, 89 steps left
    assert lines[2].endswith(" eta 1m09s"), lines[2]
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "eta_s" not in recs[0] and [r["eta_s"] for r in recs[1:]] == [89.0, 69.0]


@pytest.mark.parametrize(
    ("seconds", "shown"), [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (7620, "2h07m")]
)
def test_durations_read_at_a_glance(seconds, shown):
    assert format_duration(seconds) == shown
