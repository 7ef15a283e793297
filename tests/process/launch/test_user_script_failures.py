"""A user's own plain torchrun script under the installed `ddpkit run`, in a workspace used more
than once: what each of its failures ends as (issue 54: goodput of one run only, a cancel that
is no failure, a hung rank ended within the job's timeout and named, a deliberate `sys.exit(1)`
never retried, a rank that leaves early named and not retried, one line per restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install

pytestmark = pytest.mark.slow

# The user's script knows nothing of ddpkit. MODE picks the failure, on rank 1 at step 5 of the
# first attempt only (a restarted attempt trains to the end).
SCRIPT = """\
import os, sys, time
import torch, torch.distributed as dist

mode = os.environ.get("MODE", "")
dist.init_process_group("gloo")
rank = dist.get_rank()
first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
for step in range(int(os.environ.get("STEPS", "40"))):
    if rank == 1 and step == 5 and first:
        if mode == "hang":
            print("rank 1 hangs in its own code", flush=True)
            time.sleep(3600)
        elif mode == "exit1":
            sys.exit(1)
        elif mode == "early":
            print("rank 1 leaves", flush=True)
            sys.exit(0)
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(float(os.environ.get("PACE", "0.05")))
if rank == 0:
    print("done", flush=True)
dist.destroy_process_group()
"""
JOB = """\
name = "user"
nproc_per_node = 2
accelerator = "cpu"
script = "train.py"
max_restarts = 1
[train]
timeout_s = 8
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "ddpkit.toml").write_text(JOB)
    return tmp_path


def run(proj: Path, *args: str, timeout: int = 240, **env: str) -> subprocess.CompletedProcess:
    """`ddpkit ARGS` from the project; its output (the job's and the launcher's lines, which
    `ddpkit run` passes on together) in `stdout`."""
    return subprocess.run(
        [str(DDPKIT), *args],
        cwd=proj,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def report(proj: Path) -> dict:
    return json.loads((proj / "runs" / "user" / "goodput.json").read_text())


def test_a_hung_rank_is_ended_within_the_jobs_timeout_named_and_restarted_in_place(project):
    """Rank 1 sleeps in its own code; rank 0 waits in all_reduce. The job's timeout_s (8 s)
    bounds the wait (torch's default would be 30 min): the attempt ends, the line names rank 1
    (the one that never came), not rank 0 (the one that noticed), the restart is one line, and
    the run finishes. No traceback from the waiting rank."""
    t0 = time.monotonic()
    r = run(project, "run", MODE="hang")
    took = time.monotonic() - t0
    err = r.stdout
    assert r.returncode == 0, err
    assert "done" in err
    assert "rank 1 (node 0, host" in err and "never reached the collective all_reduce()" in err
    restart = [x for x in err.splitlines() if "restarting in place" in x]
    assert len(restart) == 1 and restart[0].startswith("ddpkit node: rank 1 "), err
    assert "Traceback" not in err, err
    assert took < 120, took  # 8 s to notice, then a restart: not torch's 30 minutes
    failures = report(project)["failures"]
    assert [(f["kind"], f["rank"]) for f in failures] == [("hang", 1)]


def test_a_deliberate_sys_exit_is_the_codes_failure_and_is_never_retried(project):
    r = run(project, "run", MODE="exit1")
    assert r.returncode == 1, r.stdout
    last = next(x for x in r.stdout.splitlines() if x.startswith("ddpkit node:"))
    assert last.startswith("ddpkit node: rank 1 (node 0, host"), r.stdout
    assert "sys.exit(1)" in last and "not retried" in last, last
    assert "restarting in place" not in r.stdout
    attempts = [p for p in (project / "runs" / "user" / "goodput").iterdir() if "attempt" in p.name]
    assert len(attempts) == 1  # one attempt: the restart budget was not spent on it


def test_a_rank_that_leaves_early_is_named_and_not_retried(project):
    r = run(project, "run", MODE="early")
    assert r.returncode == 1, r.stdout
    last = next(x for x in r.stdout.splitlines() if x.startswith("ddpkit node:"))
    assert "rank 1 (node 0, host" in last and "left first (exit 0)" in last, last
    assert "not retried" in last and "restarting in place" not in r.stdout
    assert "Traceback" not in r.stdout, r.stdout
    assert [f["kind"] for f in report(project)["failures"]] == ["left early"]


def test_a_second_run_reports_only_itself_and_a_cancel_is_no_failure(project):
    """The same workspace used again: a run with a failure, then a clean run, then one cancelled
    by the user. Each report is of its own run: the second has no failure and a wall time of
    its own (not the first's plus the idle time between), the third says cancelled, and
    `ddpkit status local` speaks of the last run only."""
    first = run(project, "run", MODE="hang")
    assert first.returncode == 0, first.stdout
    assert len(report(project)["failures"]) == 1
    time.sleep(3)  # idle time between the runs: nobody's
    second = run(project, "run", STEPS="20")
    assert second.returncode == 0, second.stdout
    rep = report(project)
    assert rep["failures"] == [] and rep["attempts"] == 1, rep
    assert rep["wall_s"] < 60 and rep["run"], rep
    status = run(project, "status", "local")
    assert "(0 failures, 0 s lost" in status.stdout and "failure:" not in status.stdout, (
        status.stdout
    )

    job = subprocess.Popen(
        [str(DDPKIT), "run"],
        cwd=project,
        env={**os.environ, "STEPS": "2000", "PACE": "0.05"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    attempts = project / "runs" / "user" / "goodput"
    before = len(list(attempts.glob("*-attempt.json")))  # the two runs before: 2 + 1
    while time.monotonic() < deadline and len(list(attempts.glob("*-attempt.json"))) == before:
        time.sleep(0.5)  # this run's attempt record: its workers run
    time.sleep(2)
    job.send_signal(signal.SIGTERM)  # the user's own stop (what `ddpkit cancel local` sends)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGTERM, out
    rep = report(project)
    assert rep["failures"] == [] and rep["cancelled"] == "SIGTERM", rep
    status = run(project, "status", "local")
    assert "cancelled" in status.stdout and "failure:" not in status.stdout, status.stdout


def test_a_killed_node_launcher_is_said_in_one_line(project):
    """`kill -9` of the node launcher (an OOM kill): `ddpkit run` says which process died and
    what to do, and exits 128 + 9, not 247 with nothing said."""
    job = subprocess.Popen(
        [str(DDPKIT), "run"],
        cwd=project,
        env={**os.environ, "STEPS": "2000"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    record = project / ".ddpkit"
    deadline = time.monotonic() + 120
    goodput = project / "runs" / "user" / "goodput"
    while time.monotonic() < deadline and not list(goodput.glob("*-attempt.json")):
        time.sleep(0.5)
    launcher = job.pid  # `ddpkit run`'s child is the launcher: find it by its parent
    children = subprocess.run(
        ["pgrep", "-P", str(launcher)], capture_output=True, text=True
    ).stdout.split()
    assert children, "no node launcher under ddpkit run"
    os.kill(int(children[0]), signal.SIGKILL)
    out, _ = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGKILL, out
    line = out.strip().splitlines()[-1]
    assert line.startswith(f"ddpkit: the node launcher (pid {children[0]}) was killed by SIGKILL")
    assert "resumes from the newest checkpoint" in line and record.is_dir()
