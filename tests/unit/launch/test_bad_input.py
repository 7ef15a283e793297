"""Bad input is one line on stderr naming the problem and the fix, exit 2, no traceback, and
nothing lost or half-written: out-of-range seeds and durations at parse time; user datasets
whose samples do not stack (named with the item and the shapes, up front where a probe finds
it, else when the batch forms, on any rank, with or without DataLoader workers); a checkpoint
dir that is read-only from the start or turns read-only mid-run (a read-only bind mount: we
run as root, for whom chmod 555 changes nothing); `ckpt export` onto an existing output or a
leftover OUT.tmp; a SLURM job the partition can never run, refused at submit (fake sinfo
here; the real local cluster below).

Here the tests that run in this process; those that start processes in
tests/process/launch/test_bad_input.py, those on a real SLURM cluster in
tests/engines/slurm/test_bad_input.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401 (a fixture)
from tests.trainrun import PY, ROOT, clean_env


def _train_cmd(run_dir: Path, *args: str) -> list[str]:
    return [PY, "-m", "ddpkit.train", "--run-dir", str(run_dir), "--progress", "plain", *args]


def _run(cmd: list[str], timeout: float = 180, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=ROOT, env=clean_env(**env), capture_output=True, text=True, timeout=timeout
    )


def _can_unshare() -> str | None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return "needs root and unshare(1) for a read-only bind mount (chmod 555 binds no root)"
    p = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, check=False)
    return None if p.returncode == 0 else f"unshare -m fails here: {p.stderr.strip()}"


needs_mounts = pytest.mark.skipif(_can_unshare() is not None, reason=str(_can_unshare()))

# In a private mount namespace: a read-only view of DIR is prepared first, then (at once, or
# when FLAG appears) bind-mounted over DIR, so later opens of DIR's files are refused while the
# ones open already (the run's lock) stay as they were: a filesystem that turns read-only.
READ_ONLY = """
set -eu
dir=$1; view=$2; flag=$3; shift 3
mount --bind "$dir" "$view"
mount -o remount,bind,ro "$view"
if [ "$flag" = now ]; then mount --bind "$view" "$dir"; exec "$@"; fi
"$@" &
pid=$!
i=0
while [ ! -e "$flag" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
mount --bind "$view" "$dir"
wait $pid
"""


def _read_only(
    tmp_path: Path, ckpt: Path, when: str, cmd: list[str]
) -> subprocess.CompletedProcess[str]:
    view = tmp_path / "ro-view"
    view.mkdir()
    script = tmp_path / "ro.sh"
    script.write_text(READ_ONLY)
    return _run(["unshare", "-m", "sh", str(script), str(ckpt), str(view), when, *cmd], 300)


@needs_mounts
def test_a_read_only_checkpoint_dir_is_one_line_and_writes_nothing(tmp_path, one_line_error):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    p = _read_only(tmp_path, ckpt, "now", _train_cmd(tmp_path / "r", "--ckpt-dir", str(ckpt),
                                                      "--steps", "2"))  # fmt: skip
    line = one_line_error(p)
    assert line == (
        f"error: --ckpt-dir {ckpt}: cannot create directories in {ckpt} (Read-only file "
        "system); pass a writable path"
    )
    assert not (tmp_path / "r").exists() and not list(ckpt.iterdir())


JOB = 'name = "p18"\ntime = "02:00:00"\n[train]\nsteps = 2\n'
# sinfo -h -o '%P|%D|%G|%l|%s' of a cluster: two 4-GPU nodes and one 8-GPU node in gpu (the
# default), a 1-day limit there; a CPU partition with a 30-minute limit and 2-node jobs.
SINFO = (
    "gpu*|2|gpu:a100:4(S:0-1)|1-00:00:00|1-infinite\n"
    "gpu*|1|gpu:h100:8|1-00:00:00|1-infinite\n"
    "short|6|(null)|30:00|1-2\n"
)


def test_the_partition_limits_parse_from_sinfo():
    from ddpkit.slurm.backend import parse_sinfo

    gpu = parse_sinfo(SINFO, None)
    assert gpu is not None and (gpu.name, gpu.nodes, gpu.time_minutes) == ("gpu", 3, 1440)
    assert sorted(gpu.gpus_per_node) == [4, 4, 8] and gpu.max_job_nodes is None
    short = parse_sinfo(SINFO, "short")
    assert short is not None and (short.nodes, short.max_job_nodes) == (6, 2)
    assert short.gpus_per_node == [0] * 6 and short.time_minutes == 30
    both = parse_sinfo("p|1|gpu:2,gpu:v100:2,mps:100|infinite|1-infinite\n", "p")
    assert both is not None and both.gpus_per_node == [4] and both.time_minutes is None
    assert parse_sinfo(SINFO, "other") is None


def test_without_sinfo_the_check_is_skipped(tmp_path, monkeypatch):
    from ddpkit.slurm import backend as slurm
    from ddpkit.tools.jobspec import load_spec

    monkeypatch.setenv("PATH", str(tmp_path))  # no sinfo here
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    spec = load_spec(str(job), nodes=99, gpus=99)
    slurm.check_partition(spec)  # nothing to check against: sbatch has the last word
