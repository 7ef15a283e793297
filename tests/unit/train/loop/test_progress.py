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


def _fake_backend(states):
    """A backend whose job goes through `states`, (state, what happens before that poll)."""
    from ddpkit.tools.backends import Backend, JobState, JobStatus

    class Fake(Backend):
        name, file_ext = "fake", "sh"

        def render(self, spec):
            return ""

        def submit(self, spec, opts):
            return 0

        def poll(self, job):
            state, before = next(states)
            before()
            return JobStatus(job, getattr(JobState, state))

        def logs(self, job, opts):
            return 0

        def cancel(self, job, opts):
            return 0

    return Fake()


def test_wait_prints_the_step_and_eta_from_metrics_and_only_on_change(tmp_path, capsys):
    """`submit --wait` (WAIT=1): a line when the state changes, and while it runs a new step
    with the ETA the trainer wrote in metrics.jsonl, not a line per poll."""
    metrics_file = tmp_path / "metrics.jsonl"

    def write(step, eta=None):
        def go():
            rec = {"step": step, "loss": 1.0, **({"eta_s": eta} if eta is not None else {})}
            with metrics_file.open("a") as f:
                f.write(json.dumps(rec) + "\n")

        return go

    def nothing():
        return None

    states = iter(
        [
            ("PENDING", nothing),
            ("PENDING", nothing),  # unchanged: no line
            ("RUNNING", write(1)),  # no pace yet: the step only
            ("RUNNING", nothing),  # the same step: no line
            ("RUNNING", write(31, 69.0)),
            ("RUNNING", write(41, 59.0)),
            ("SUCCEEDED", nothing),
        ]
    )
    rc = _fake_backend(states).wait("7", poll_s=0, run_dir=tmp_path, every_s=0)
    assert rc == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "job 7: pending",
        "job 7: running step 1",
        "job 7: running step 31 eta 1m09s",
        "job 7: running step 41 eta 59s",
        "job 7: succeeded",
    ], lines


def test_wait_without_metrics_here_prints_the_state_alone(tmp_path, capsys):
    states = iter([("RUNNING", lambda: None), ("SUCCEEDED", lambda: None)])
    assert _fake_backend(states).wait("8", poll_s=0, run_dir=tmp_path / "elsewhere") == 0
    assert capsys.readouterr().err.splitlines() == ["job 8: running", "job 8: succeeded"]
