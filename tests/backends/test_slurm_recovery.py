"""Recovery on the real 2-node SLURM cluster: every process of one node SIGKILLed (the
node lost, by `ddpkit chaos --attach`) -> the batch shell requeues the job (the attempt
count is SLURM's Restarts), it resumes from the newest complete checkpoint, ends with the
parameters of a failure-free run, and the goodput report names the lost node.
Budget: about 3 min on 2 cores (two jobs; the requeue's BeginTime hold is released early)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.backends.test_slurm_e2e import REQUEUE_SETTLE_S, job_file, scontrol, submit
from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DDPKIT = Path(sys.executable).with_name("ddpkit")


def test_a_lost_node_requeues_the_job_which_resumes_and_matches(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    submit(job_file(tmp_path, "rec-reference"), "--wait")
    run = tmp_path / "rec-node"
    job = submit(job_file(tmp_path, "rec-node"))
    try:
        # kill-node fires once the run logged step 40 (a checkpoint is due at 100)
        drill = subprocess.run(
            [str(DDPKIT), "chaos", "--attach", str(run), "--inject", "kill-node@step=120:node=1"],
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert "chaos: kill-node: SIGKILL to node rank 1" in drill.stdout, (
            drill.stdout + drill.stderr
        )
        deadline = time.monotonic() + 400
        released, requeued_at = False, None
        while (info := scontrol(job))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, info
            if info["JobState"] == "PENDING" and info.get("Restarts", "0") != "0" and not released:
                requeued_at = requeued_at or time.monotonic()
                if time.monotonic() - requeued_at >= REQUEUE_SETTLE_S:
                    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
                    released = True
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = "".join(p.read_text() for p in sorted((run / "slurm").glob(f"{job}_*_log.*")))
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, logs[-3000:])
    assert "(a lost node, or workers past the in-place restart budget); requeue 1 of 3" in logs
    summary = json.loads((run / "summary.json").read_text())
    reference = json.loads((tmp_path / "rec-reference" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-100"), summary["resumed_from"]
    assert summary["param_digest"] == reference["param_digest"]
    lost = [f for f in summary["goodput"]["failures"] if f["kind"] == "node lost"]
    assert lost and lost[0]["node"] and lost[0]["recovered"], summary["goodput"]
