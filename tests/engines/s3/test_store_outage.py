"""The object store goes away mid-run (a real versitygw process killed after the run's second
save, started again once the workers said so): the console gets one line naming the store
and what the kit does, not hundreds of lines of botocore tracebacks (they go to the run dir's
store-errors.log); the restart waits for the store and resumes from the last complete
checkpoint; goodput's report calls the failure "store lost", not "crashed rank 0". Driven as
a user runs it: a project in a temp dir, the installed `ddpkit run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import s3_fixtures
from tests.s3_fixtures import S3Server
from tests.trainrun import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.s3]

DDPKIT = Path(sys.executable).with_name("ddpkit")  # the console script of this install
JOB = """\
name = "outage"
nproc_per_node = 2
accelerator = "cpu"
ckpt_dir = "{url}"
[train]
steps = 30
ckpt_interval = 5
ckpt_keep = 2
log_interval = 5
eval = false
batch_size = 16
synthetic_samples = 4096
"""


def _serve_again(server: S3Server, log: Path) -> subprocess.Popen:
    """versitygw once more on the server's own port, over its own objects: the store back."""
    host, port = server.endpoint.removeprefix("http://").rsplit(":", 1)
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(s3_fixtures._binary()), "--port", f"{host}:{port}", "--region", "us-east-1",
             "posix", str(server.data)],
            env={**os.environ, "ROOT_ACCESS_KEY_ID": server.access,
                 "ROOT_SECRET_ACCESS_KEY": server.secret},
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def test_a_store_that_goes_away_mid_run_is_one_line_and_the_report_names_it(tmp_path):
    pytest.importorskip("s3fs", reason="s3fs is not installed (make setup installs it)")
    server, proc = s3_fixtures.start(tmp_path / "s3")
    procs = [proc]
    try:
        url = server.bucket("outage") + "/run"
        project = tmp_path / "project"
        project.mkdir()
        (project / "ddpkit.toml").write_text(JOB.format(url=url))
        env = clean_env(**{k: v for k, v in server.env().items() if k.startswith("AWS_")})
        # Paced steps: the run is still training when the store goes (and comes back).
        env |= {"DDPKIT_STEP_PACE_S": "0.3", "DDPKIT_CKPT_STAGE": str(tmp_path / "stage")}
        run = subprocess.Popen(
            [str(DDPKIT), "run"], cwd=project, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        killer = threading.Timer(240, run.kill)  # a hung run fails the test, not the lane
        killer.start()
        lines: list[str] = []
        assert run.stdout is not None
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if proc.poll() is None and f"checkpoint saved: {url}/step-10 " in line:
                proc.kill()  # the server goes away, between two saves
                proc.wait()
            elif "lost the checkpoint store" in line:
                time.sleep(2)  # the restart is waiting for it by now
                procs.append(_serve_again(server, tmp_path / "s3" / "server.log"))
        rc = run.wait()
        killer.cancel()
        print("\n".join(lines))  # shown with -s, and in a failure's report
    finally:
        for p in procs:
            if p.poll() is None:
                s3_fixtures.stop(p)
    out = "\n".join(lines)
    assert rc == 0, out[-3000:]
    [lost] = [x for x in lines if "lost the checkpoint store" in x]
    assert lost.startswith(
        f"error: lost the checkpoint store {url} during the save of step 15 ("
    ), lost
    assert f"restarting from the last complete checkpoint ({url}/step-10)" in lost, lost
    assert "tracebacks in runs/outage/store-errors.log" in lost, lost
    # Bounded: the run's own lines, the one line and the restart's (it printed ~560 lines of
    # botocore tracebacks from both ranks and the prune thread before).
    assert "Traceback" not in out and "botocore" not in out.replace(lost, ""), out[-3000:]
    assert len(lines) < 50, out
    assert server.secret not in out

    run_dir = project / "runs" / "outage"
    kept = (run_dir / "store-errors.log").read_text()
    assert "Traceback" in kept and "EndpointConnectionError" in kept
    assert server.secret not in kept and server.access not in kept
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == f"{url}/step-10" and summary["steps"] == 30
    report = json.loads((run_dir / "goodput.json").read_text())
    # Either rank may end first: both saw the store go (rank 0 said it).
    assert [(f["kind"], f["recovered"]) for f in report["failures"]] == [("store lost", True)], (
        report
    )
