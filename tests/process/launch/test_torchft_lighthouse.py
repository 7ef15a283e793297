"""Losing torchft's lighthouse (issue 54 item 16): it was the one process whose death stopped
the whole job without a save (both groups exit 143, the rerun from step 0). The supervisor
starts it again at the same address; the job goes on, losing at most the steps since the last
save."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DDPKIT = Path(sys.executable).with_name("ddpkit")
pytestmark = pytest.mark.slow
pytest.importorskip("torchft")


def lighthouses(project: Path) -> list[int]:
    """This job's lighthouse: it runs as a script (train/launch/lighthouse.py, see its main),
    in the project's directory (other jobs on the machine run theirs)."""
    out = subprocess.run(
        ["pgrep", "-f", "train/launch/lighthouse.py"], capture_output=True, text=True
    )
    mine = []
    for pid in out.stdout.split():
        try:
            if os.readlink(f"/proc/{pid}/cwd") == str(project):
                mine.append(int(pid))
        except OSError:
            pass
    return mine


def test_a_killed_lighthouse_is_started_again_and_the_groups_go_on_from_the_last_save(tmp_path):
    log = tmp_path / "run.log"
    env = {**os.environ, "DDPKIT_STEP_PACE_S": "0.1"}
    argv = [str(DDPKIT), "run", "--set", "fault_tolerance=torchft", "--",
            "--steps", "300", "--ckpt-interval", "50", "--log-interval", "50"]  # fmt: skip
    with log.open("w") as sink:
        job = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        saved = [f"group-{g}/checkpoints/step-100" for g in (0, 1)]  # both saved step 100
        while not all(x in log.read_text() for x in saved) and time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        before = lighthouses(tmp_path)
        assert len(before) == 1, before
        os.kill(before[0], signal.SIGKILL)
        rc = job.wait(timeout=400)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGINT)
            job.wait(timeout=60)
    text = log.read_text()
    assert rc == 0, text[-4000:]
    assert re.search(r"the lighthouse exited \(-9\); started again on port \d+ \(1 of \d+\)", text)
    assert "stopping" not in text.split("started again")[1], text[-4000:]
    for g in (0, 1):
        assert f"[group {g}] done: 300 steps" in text, text[-4000:]
        # a restart, if the group had one, resumed from a save made at or after step 100
        resumed = [
            int(s) for s in re.findall(rf"\[group {g}\] resumed from .* at step (\d+)", text)
        ]
        assert all(s >= 100 for s in resumed), resumed
