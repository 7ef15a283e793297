"""SLURM job management against fake scontrol/sacct/squeue on PATH (the process boundary):
status falls back to sacct when slurmctld forgot the job, list shows this kit's jobs only,
logs prefixes every node's lines. The real cluster covers submit/--wait/--follow
(tests/engines/slurm/test_slurm_e2e.py).

Here the tests that run in this process; those that start processes in
tests/process/backends/test_slurm_jobs.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import FakeBin
from tests.trainrun import ROOT, clean_env


def fake(bin_dir: Path, name: str, stdout: str, rc: int = 0) -> None:
    """A fake `name` in bin_dir that prints `stdout` and exits `rc`."""
    FakeBin(bin_dir).add(name, f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {rc}\n")


def launch(bin_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(PATH=f"{bin_dir}:/usr/bin:/bin", USER="alice")
    return subprocess.run([sys.executable, "-m", "ddpkit.tools.submit", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_list_shows_only_ddpkit_jobs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake(bin_dir, "squeue", "11|train-a|RUNNING|1:02|2|ddpkit\n12|other|PENDING|0:00|1|(null)")
    p = launch(bin_dir, "list", "slurm")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "JOBID\tNAME\tSTATE\tTIME\tNODES",
        "11\ttrain-a\tRUNNING\t1:02\t2",
    ]


def test_logs_name_each_node_by_its_host_in_slurms_order(tmp_path: Path) -> None:
    """Not `[node 1] rank 0: ...` (SLURM's task number, while torchrun's rendezvous put
    rank 0 on that node): the host name squeue shows, task t on the t-th node."""
    bin_dir = tmp_path / "bin"
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "78_0_log.out").write_text("rank 1: up\n")
    (logs / "78_1_log.out").write_text("rank 0: world size 2\n")
    FakeBin(bin_dir).add(
        "scontrol",
        "#!/bin/sh\n"
        'if [ "$2" = hostnames ]; then [ "$3" = "gpu-[07,12]" ] && printf "gpu-07\\ngpu-12\\n"; exit; fi\n'
        f"echo 'JobId=78 JobState=RUNNING NodeList=gpu-[07,12] StdErr={logs}/78_0_log.err'\n",
    )
    p = launch(bin_dir, "logs", "slurm", "78")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["[gpu-07] rank 1: up", "[gpu-12] rank 0: world size 2"]
