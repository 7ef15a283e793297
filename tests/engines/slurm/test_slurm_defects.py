"""Issue 31 items 14 and 19 tried on the real 2-node SLURM cluster, as a user meets them: a
project of their own in a temporary directory (shared by the nodes), a plain DDP script that
knows nothing of ddpkit, the installed `ddpkit` command run from the project.

- item 14: rank 1 (on the second node) is SIGKILLed, or hangs in its own code. The launcher's
  line names rank 1 and where it ran, `rank 1 (node N, host H)`, as the script itself saw it
  (SLURM_NODEID, SLURMD_NODENAME: the local cluster's nodes share one host name), not rank 0,
  the first to notice;
- item 19: a second `submit slurm` of the same run dir while the first job runs is refused
  in one line before sbatch, and `ddpkit status` / `cancel` still find the first job.
Budget: about 1 min per job on 2 cores (a few seconds of training each), when the cluster is
free; no requeue (requeue_limit = 0, max_restarts = 0).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engines.slurm.test_slurm_e2e import free_port, scontrol
from tests.slurm_fixtures import slurm_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
DDPKIT = Path(sys.executable).with_name("ddpkit")

SCRIPT = """\
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist

MODE = sys.argv[1]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
rank = dist.get_rank()
print(f"PLACE rank {rank} node {os.environ['SLURM_NODEID']} host "
      f"{os.environ['SLURMD_NODENAME']}", flush=True)
for step in range(100000):
    if step == 30 and rank == 1 and MODE == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    if step == 30 and rank == 1 and MODE == "hang":
        time.sleep(100000)  # hung in its own code: it never calls the next all_reduce
    if step == 30 and rank == 1 and MODE == "early":
        sys.exit(0)  # a rank-dependent return: its peer's next all_reduce finds nobody
    dist.all_reduce(torch.ones(4))
    time.sleep(0.5 if MODE == "long" else 0.02)
dist.destroy_process_group()
"""


def project(tmp_path: Path, name: str, mode: str, budget: int = 0) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "ddpkit.toml").write_text(
        f'name = "{name}"\nnproc_per_node = 1\naccelerator = "cpu"\nscript = "train.py"\n'
        f'args = ["{mode}"]\nmax_restarts = {budget}\nrdzv_port = {free_port()}\n'
        f'time = "00:10:00"\n[slurm]\nrequeue_limit = {budget}\n'
    )
    return proj


def ddpkit(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing set by hand
    return subprocess.run(
        [str(DDPKIT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def job_id(out: str) -> str:
    m = re.search(r"submitted job (\d+)", out)
    assert m, out
    return m.group(1)


@pytest.mark.parametrize("mode", ["kill", "hang"])
def test_the_rank_that_stopped_is_named_with_its_node_and_host(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
    mode: str,
) -> None:
    proj = project(tmp_path, f"defects-{mode}", mode)
    r = ddpkit("submit", "slurm", "--nodes", "2", "--gpus", "1", "--wait", cwd=proj)
    job = job_id(r.stdout)
    logs = {
        p.name: p.read_text() for p in (proj / f"runs/defects-{mode}/slurm").glob(f"{job}_*_log.*")
    }
    text = "\n".join(logs.values())
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:] + text[-3000:]
    places = dict(re.findall(r"PLACE rank (\d) (node \d+ host \S+)", text))
    assert set(places) == {"0", "1"}, text[-3000:]
    node, host = places["1"].split(" host ")
    one = f"rank 1 ({node}, host {host})"
    assert places["0"].split(" host ")[0] != node  # one rank per node
    lines = [x for x in text.splitlines() if x.startswith("ddpkit node: ")]
    if mode == "kill":  # said by rank 1's own node, which saw the SIGKILL
        assert f"ddpkit node: {one} failed (signal SIGKILL); see its output above" in lines, (
            lines,
            text[-3000:],
        )
    else:  # said by rank 0's node: its collective timed out waiting for rank 1
        assert any(
            x.startswith(
                f"ddpkit node: {one} never reached the collective all_reduce() at train.py:"
            )
            for x in lines
        ), (lines, text[-3000:])
    # no line blames rank 0, the first to notice
    assert not [x for x in lines if re.match(r"ddpkit node: rank 0 \(.*\) (failed|never)", x)]
    st = ddpkit("status", "slurm", cwd=proj, timeout=60)
    assert f"job {job}: failed" in st.stdout, st.stdout + st.stderr


def test_a_second_submit_of_a_running_run_dir_is_refused_and_the_first_stays_found(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    proj = project(tmp_path, "defects-twice", "long")
    first = ddpkit("submit", "slurm", "--nodes", "2", "--gpus", "1", cwd=proj)
    assert first.returncode == 0, first.stdout + first.stderr
    job = job_id(first.stdout)
    record_path = proj / ".ddpkit/jobs/slurm/last_job.json"
    try:
        deadline = time.monotonic() + 400
        while scontrol(job)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, scontrol(job)
            time.sleep(1)
        record = record_path.read_text()
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        second = ddpkit("submit", "slurm", "--nodes", "2", "--gpus", "1", cwd=proj)
        out = second.stdout + second.stderr
        assert second.returncode == 2, out
        assert f"run dir runs/defects-twice is in use by job {job} (running)" in out, out
        assert f"ddpkit cancel slurm {job}" in out and "Traceback" not in out, out
        after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
        assert set(after.stdout.split()) <= set(queued.stdout.split()), "a job was queued"
        assert record_path.read_text() == record  # the record still names the first job
        st = ddpkit("status", "slurm", cwd=proj, timeout=60)
        assert f"job {job}: running" in st.stdout, st.stdout + st.stderr
        assert ddpkit("cancel", "slurm", cwd=proj, timeout=120).returncode == 0
        deadline = time.monotonic() + 180
        while scontrol(job)["JobState"] not in ("CANCELLED", "COMPLETED", "FAILED"):
            assert time.monotonic() < deadline, scontrol(job)
            time.sleep(1)
        assert json.loads(record_path.read_text())["job"] == job
    finally:
        subprocess.run(["scancel", job], check=False)


def test_a_rank_that_leaves_early_ends_the_job_named_and_not_requeued(
    slurm_cluster: int,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Issue 54 item 15: rank 1 (node 1) exits 0 at step 30 while rank 0 (node 0) trains on.
    Before: rank 0's all_reduce failed, then both node launchers stayed alive with no workers
    and printed nothing until the job was cancelled (4 min, twice). Now node 1's launcher leaves
    torchrun's exit barrier once node 0's worker failed, node 0's launcher names the rank that
    left, nothing is restarted or requeued though both budgets allow it, and the job fails."""
    proj = project(tmp_path, "defects-early", "early", budget=1)
    t0 = time.monotonic()
    r = ddpkit("submit", "slurm", "--nodes", "2", "--gpus", "1", "--wait", cwd=proj, timeout=400)
    took = time.monotonic() - t0
    job = job_id(r.stdout)
    text = "\n".join(
        p.read_text() for p in (proj / "runs/defects-early/slurm").glob(f"{job}_*_log.*")
    )
    assert r.returncode != 0, r.stderr[-2000:] + text[-3000:]
    places = dict(re.findall(r"PLACE rank (\d) (node \d+ host \S+)", text))
    node, host = places["1"].split(" host ")
    lines = [x for x in text.splitlines() if x.startswith("ddpkit node: ")]
    assert any(
        x.startswith(f"ddpkit node: rank 1 ({node}, host {host}) left first (exit 0)")
        for x in lines
    ), (lines, text[-3000:])
    assert not any("restarting in place" in x for x in lines), lines
    info = scontrol(job)
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", info
    assert took < 240, (took, text[-3000:])  # not the 300 s exit barrier, not a cancel
