"""Bad input is one line on stderr naming the problem and the fix, exit 2, no traceback, and
nothing lost or half-written: out-of-range seeds and durations at parse time; user datasets
whose samples do not stack (named with the item and the shapes, up front where a probe finds
it, else when the batch forms, on any rank, with or without DataLoader workers); a checkpoint
dir that is read-only from the start or turns read-only mid-run (a read-only bind mount: we
run as root, for whom chmod 555 changes nothing); `ckpt export` onto an existing output or a
leftover OUT.tmp; a SLURM job the partition can never run, refused at submit (fake sinfo
here; the real local cluster below).

Here the tests on a real SLURM cluster; the in-process ones in
tests/unit/launch/test_bad_input.py, those that start processes in
tests/process/launch/test_bad_input.py. Helpers both use are in
tests/unit/launch/test_bad_input.py."""

from __future__ import annotations

import pytest

from tests.slurm_fixtures import slurm_cluster  # noqa: F401 (a fixture)
from tests.unit.launch.test_bad_input import JOB


@pytest.mark.slurm
@pytest.mark.slow
def test_the_local_cluster_refuses_more_gpus_than_its_nodes_have(
    slurm_cluster,  # noqa: F811
    tmp_path,
    launcher,
    one_line_error,
):
    """Against the real sinfo of slurm/local/up.sh (2+ nodes of 4 placeholder GPUs)."""
    job = tmp_path / "job.toml"
    job.write_text(JOB.replace('time = "02:00:00"', 'time = "00:05:00"'))
    p = launcher("submit", "slurm", "--config", str(job), "--nodes", "2", "--gpus", "8",
                 cwd=tmp_path, timeout=120)  # fmt: skip
    assert "GPU(s) each (sinfo gres), the job asks 2 node(s) x 8" in one_line_error(p)
    p = launcher("submit", "slurm", "--config", str(job), "--nodes", str(slurm_cluster + 1),
                 "--gpus", "1", cwd=tmp_path, timeout=120)  # fmt: skip
    assert f"the job asks {slurm_cluster + 1} (--nodes" in one_line_error(p)
    assert not (tmp_path / "runs").exists()
