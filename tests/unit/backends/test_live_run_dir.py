"""One rule for every backend (issue 54 item 7): a run dir that the last job of ANY backend
submitted from this workspace still trains into is refused before anything starts; only a
record naming the same run dir is asked about its job's state."""

from __future__ import annotations

import pytest
from ddpkit.tools import backends
from ddpkit.tools.backends import JobState, JobStatus, record_job, refuse_a_live_run_dir
from ddpkit.tools.jobspec import SpecError, load_spec


class Engine:
    """An engine's poll, as the real ones answer it (local: the launcher's pid; SLURM:
    scontrol), recorded."""

    def __init__(self, state: JobState, asked: list[tuple[str, str]], name: str) -> None:
        self.state, self.asked, self.name = state, asked, name

    def poll(self, job: str) -> JobStatus:
        self.asked.append((self.name, job))
        return JobStatus(job, self.state)


@pytest.fixture
def engines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the workspace: .ddpkit/jobs/<backend>/
    asked: list[tuple[str, str]] = []
    states = {"local": JobState.RUNNING, "slurm": JobState.SUCCEEDED}
    monkeypatch.setattr(backends, "load_backend", lambda name: Engine(states[name], asked, name))
    return asked


def spec(tmp_path, run: str):
    return load_spec(None, [f"train.run_dir={tmp_path / 'runs' / run}"])


def test_a_local_job_that_still_runs_holds_its_run_dir_for_every_backend(tmp_path, engines):
    record_job("local", "4242", run_dir=str(tmp_path / "runs" / "a"))
    record_job("slurm", "41", run_dir=str(tmp_path / "runs" / "b"))
    refuse_a_live_run_dir(spec(tmp_path, "c"))  # nobody's: nobody asked
    assert engines == []
    with pytest.raises(SpecError) as e:
        refuse_a_live_run_dir(spec(tmp_path, "a"))
    assert "is in use by job 4242 (running), the local job submitted from here" in str(e.value)
    assert "ddpkit cancel local 4242" in str(e.value)
    refuse_a_live_run_dir(spec(tmp_path, "b"))  # SLURM's job there ended: free
    assert engines == [("local", "4242"), ("slurm", "41")]


def test_an_engine_that_cannot_be_asked_does_not_hold_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def unreachable(name):
        raise RuntimeError("no cluster here")

    monkeypatch.setattr(backends, "load_backend", unreachable)
    record_job("k8s", "job-x", run_dir=str(tmp_path / "runs" / "a"))
    refuse_a_live_run_dir(spec(tmp_path, "a"))


def test_a_killed_launcher_not_yet_reaped_does_not_hold_its_run_dir(tmp_path, monkeypatch):
    """A SIGKILLed `ddpkit run` leaves its node launcher to PID 1, which reaps it late under
    load: a zombie for a while. It runs nothing, so its run dir is free (CI of 20fb997: a
    torchft job killed whole and run again was refused, "in use by job ... (running)")."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])  # exits; not reaped until wait()
    try:
        stat = Path(f"/proc/{child.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.05)
        record_job("local", str(child.pid), run_dir=str(tmp_path / "runs" / "a"), log="x.log")
        assert backends.load_backend("local").poll(str(child.pid)).state is JobState.UNKNOWN
        refuse_a_live_run_dir(spec(tmp_path, "a"))
    finally:
        child.wait()
