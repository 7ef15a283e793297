"""fault_tolerance = "torchft" on the real 2-node SLURM cluster: one replica group per node,
the lighthouse on node 0. Group 1's torchrun is SIGKILLed mid-run: its node's supervisor
restarts it in place while group 0 trains on, it heals from group 0, and the job ends
COMPLETED (never requeued) with both groups at the same parameters.
Budget: about 2-3 min on 2 cores (cold starts of torch dominate)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.backends.test_slurm_e2e import free_port, scontrol
from tests.launch.test_torchft import NET_PY
from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DDPKIT = Path(sys.executable).with_name("ddpkit")
# >= 80 s: the survivor is still training when group 1 is back. Each step lasts at least
# PACE_S, mostly asleep (DDPKIT_STEP_PACE_S, train/fault.py), not 1200 steps burning the cores
# at 50 ms: the same window for about a third of the steps' CPU.
STEPS, PACE_S = 400, 0.2
STEP = re.compile(r"^\[group (\d)\] step\s+(\d+)/", re.M)


def project(root: Path) -> Path:
    (root / "mymodels").mkdir(parents=True)
    (root / "mymodels" / "__init__.py").write_text("")
    (root / "mymodels" / "net.py").write_text(NET_PY)
    (root / "ddpkit.toml").write_text(
        f'name = "ftslurm"\nnodes = 2\nnproc_per_node = 1\naccelerator = "cpu"\n'
        f'fault_tolerance = "torchft"\nrdzv_port = {free_port()}\ntime = "00:15:00"\n'
        f'[env]\nTORCHFT_QUORUM_TIMEOUT_SEC = "20"\nDDPKIT_STEP_PACE_S = "{PACE_S}"\n'
        '[train]\nmodel = "mymodels.net:build"\ndataset = "mymodels.net:data"\n'
        f"batch_size = 8\nsteps = {STEPS}\nlog_interval = 10\nckpt_interval = 400\neval = false\n"
        f'run_dir = "{root / "run"}"\n'
    )
    return root


def node_log(run: Path, job: str, node: int) -> str:
    path = run / "slurm" / f"{job}_{node}_log.out"
    return path.read_text(errors="replace") if path.exists() else ""


def steps_of(text: str, group: int) -> list[int]:
    return [int(m.group(2)) for m in STEP.finditer(text) if int(m.group(1)) == group]


def wait_until(what: str, cond, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {scontrol(job)}"
        assert scontrol(job)["JobState"] in ("PENDING", "RUNNING"), scontrol(job)
        time.sleep(0.5)


def test_a_killed_group_restarts_in_place_and_rejoins_while_the_other_trains(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    proj = project(tmp_path / "proj")
    run = proj / "run"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    sub = subprocess.run(
        [str(DDPKIT), "submit", "slurm"], cwd=proj, env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stdout + sub.stderr
    job = sub.stdout.split("submitted job ", 1)[1].split()[0]
    try:
        wait_until(
            "group 1 at step 30",
            lambda: max(steps_of(node_log(run, job, 1), 1), default=0) >= 30,
            job,
            timeout=400,
        )
        status = json.loads((run / "replica_groups.node-1.json").read_text())
        assert [g["group"] for g in status["groups"]] == [1]
        survivor_at_kill = max(steps_of(node_log(run, job, 0), 0))
        os.kill(status["groups"][0]["pid"], signal.SIGKILL)  # group 1's torchrun, on node 1
        wait_until(
            "group 1 healed",
            lambda: "torchft: replica group 1 healed" in node_log(run, job, 1),
            job,
            timeout=240,
        )
        survivor_at_heal = max(steps_of(node_log(run, job, 0), 0))
        deadline = time.monotonic() + 400
        while (info := scontrol(job))["JobState"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, info
            time.sleep(1)
    finally:
        subprocess.run(["scancel", job], check=False)
    logs = node_log(run, job, 0) + node_log(run, job, 1)
    assert info["JobState"] == "COMPLETED" and info.get("Restarts", "0") == "0", (
        info,
        logs[-4000:],
    )
    survivor = steps_of(node_log(run, job, 0), 0)
    assert survivor == sorted(survivor) and survivor[-1] == STEPS  # never went back
    assert survivor_at_heal > survivor_at_kill, (survivor_at_kill, survivor_at_heal)
    status = json.loads((run / "replica_groups.node-1.json").read_text())
    assert status["groups"][0]["restarts"] == 1
    assert status["groups"][0]["exits"][0] == -signal.SIGKILL
    node0 = json.loads((run / "replica_groups.node-0.json").read_text())
    assert node0["groups"][0]["restarts"] == 0
    summaries = [json.loads((run / f"group-{g}/summary.json").read_text()) for g in (0, 1)]
    assert [s["steps"] for s in summaries] == [STEPS, STEPS]
    assert summaries[0]["param_digest"] == summaries[1]["param_digest"]
