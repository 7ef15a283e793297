"""The seam every backend shares (ddpkit.tools.backends): the one wait loop, and what it reads
back (job records, the last metrics line) checked for shape.

Here the tests that run in this process; those that start processes in
tests/process/backends/test_backends.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.backends import progress, record_job
from ddpkit.tools.jobspec import SpecError

from tests.badjson import cases, damaged
from tests.trainrun import clean_env


def test_the_wait_loop_prints_on_a_state_change_not_every_poll(capsys):
    """WAIT=1 used to print an unchanged `job N: running` line (its run time ticking) every
    poll; now one line per state."""
    from ddpkit.tools.backends import Backend, JobState, JobStatus

    states = [JobState.PENDING, *[JobState.RUNNING] * 5, JobState.SUCCEEDED]
    polls = iter(
        JobStatus("7", s, 0 if s.terminal else None, f"RunTime=00:00:0{i}")
        for i, s in enumerate(states)
    )

    class Fake(Backend):
        name, file_ext = "fake", "txt"
        render = submit = logs = cancel = None  # type: ignore[assignment]

        def poll(self, job):
            return next(polls)

    Fake.__abstractmethods__ = frozenset()
    assert Fake().wait("7", poll_s=0) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split(":")[1].split()[0] for ln in lines] == ["pending", "running", "succeeded"]


# --- what the backends read back: job records and the last metrics line -----------------------

JOB = ("string", "integer")
RECORDS = {  # backend -> (a record as its submit writes it, its keys' types, the required keys)
    "local": (
        {"job": "4242", "run_dir": "runs/x", "log": "runs/x/local/node-0.log", "exit_code": 0},
        {"job": JOB, "run_dir": ("string",), "log": ("string",), "exit_code": ("integer",)},
        {"job", "run_dir", "log"},
    ),
    "docker": (
        {"job": "x", "engine": "podman", "image": "i", "run_dir": "runs/x", "exit_code": 75},
        {"job": JOB, "engine": ("string", "null"), "exit_code": ("integer",)},
        {"job"},
    ),
    "k8s": (
        {"job": "x", "namespace": "default", "api": "pytorchjob"},
        {"job": JOB, "namespace": ("string",), "api": ("string",)},
        {"job", "namespace", "api"},
    ),
}
RECORD_CASES = [
    (backend, label, body)
    for backend, (doc, types, required) in RECORDS.items()
    for label, body in damaged(doc, types, required)
]


def _read_record(backend: str) -> object:
    """What `ddpkit status BACKEND` (no job id) reads the record with."""
    import argparse

    if backend == "local":
        from ddpkit.tools.backends.local import LocalBackend

        return LocalBackend().poll("4242")
    if backend == "docker":
        from ddpkit.docker.run import job_and_engine

        return job_and_engine(None, argparse.Namespace(engine="podman"))
    from ddpkit.k8s.api import _target

    return _target(None, argparse.Namespace())


@pytest.mark.parametrize(
    "backend,label,body", RECORD_CASES, ids=[f"{b}-{lb}" for b, lb, _ in RECORD_CASES]
)
def test_a_damaged_job_record_is_one_line_naming_it(tmp_path, monkeypatch, backend, label, body):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / ".ddpkit" / "jobs" / backend / "last_job.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    with pytest.raises(SpecError) as e:
        _read_record(backend)
    line = str(e.value)
    assert line.startswith(f"{path} is not a job record this kit wrote (") and "\n" not in line
    assert f"ddpkit status {backend} JOB" in line


@pytest.mark.parametrize("backend", list(RECORDS))
def test_the_job_record_as_written_is_read(tmp_path, monkeypatch, backend):
    """The counterpart of the damages: the record a submit writes passes the same reader."""
    monkeypatch.chdir(tmp_path)
    doc = RECORDS[backend][0]
    record_job(backend, doc["job"], **{k: v for k, v in doc.items() if k != "job"})
    if backend == "local":  # its pid is no process of ours: the record's exit code decides
        assert _read_record(backend).exit_code == 0
    elif backend == "docker":
        assert _read_record(backend) == ("x", "podman")
    else:
        assert _read_record(backend) == ("x", "default", "pytorchjob")


METRICS = {"step": 12, "loss": 2.3, "eta_s": 75.0}
METRICS_CASES = cases(damaged(METRICS, {"step": ("integer",)}, required={"step"}))


@pytest.mark.parametrize("label", list(METRICS_CASES))
def test_a_damaged_metrics_line_shows_no_progress(tmp_path, label):
    """`submit --wait` reads the last metrics line each poll: one of another shape adds
    nothing to the status line, never a traceback in the wait loop."""
    (tmp_path / "metrics.jsonl").write_bytes(METRICS_CASES[label])
    assert progress(tmp_path) == ""


@pytest.mark.parametrize(
    "eta,shown", [(75.0, " step 12 eta 1m15s"), ("NaN", " step 12"), ("Infinity", " step 12"),
                  (-3, " step 12"), ('"soon"', " step 12"), ("null", " step 12")],
)  # fmt: skip
def test_an_eta_that_is_no_duration_shows_the_step_alone(tmp_path, eta, shown):
    (tmp_path / "metrics.jsonl").write_text(f'{{"step": 12, "eta_s": {eta}}}\n')
    assert progress(tmp_path) == shown


def test_ddpkit_status_with_a_damaged_record_is_one_line(tmp_path, one_line_error):
    """As a user meets it: the installed command in the workspace, the record's jobs cut to
    a number; one line naming the file and the way out, exit 2."""
    path = tmp_path / ".ddpkit" / "jobs" / "local" / "last_job.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"job": "4242", "run_dir": 3, "log": "x.log"}')
    ddpkit = Path(sys.executable).with_name("ddpkit")
    p = subprocess.run(
        [str(ddpkit), "status", "local"], cwd=tmp_path, env=clean_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert one_line_error(p) == (
        f"error: {path} is not a job record this kit wrote (run_dir: an integer (3), not a "
        "string); pass a job id (ddpkit status local JOB), or delete it and submit again"
    )
