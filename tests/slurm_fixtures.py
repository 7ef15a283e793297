"""The `slurm_cluster` fixture: a real local SLURM (slurm/local/up.sh), reused when up; and
the job helpers the SLURM tests share (`scontrol`, `until_done`).

Skips only where SLURM cannot be installed here (not root, no apt-get, or the install
fails); a cluster that installs but does not come up fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NODES = 2
REQUEUE_SETTLE_S = 10  # a requeued job stays held this long before the test releases it
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


def _ready_nodes() -> int:
    if shutil.which("sinfo") is None:
        return 0
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "idle,mixed,alloc,completing", "-o", "%N %t"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    if out.returncode != 0:
        return 0
    return len({ln.split()[0] for ln in out.stdout.splitlines() if ln and "*" not in ln})


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[int]:
    """Number of ready nodes (>= 2). Stops the cluster at the end only if it started it."""
    yield from _cluster(NODES)


@pytest.fixture(scope="session")
def slurm_cluster3() -> Iterator[int]:
    """A cluster of 3 ready nodes or more (2 that train + 1 spare): a running cluster of 2 is
    grown in place (slurm/local/up.sh 3: its running jobs go on, and every 2-node test still
    finds its 2 nodes). Stops the cluster at the end only if it started it."""
    yield from _cluster(3)


def _cluster(nodes: int) -> Iterator[int]:
    if _ready_nodes() >= nodes:
        yield _ready_nodes()
        return
    started = _ready_nodes() == 0
    if os.geteuid() != 0:
        pytest.skip("SLURM cannot be installed here: not root (run `make slurm-up` as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM cannot be installed here: no slurmctld and no apt-get")
    up = subprocess.run(
        ["bash", str(REPO / "slurm/local/up.sh"), str(nodes)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if up.returncode != 0 and "apt-get install" in up.stderr:
        pytest.skip(f"SLURM cannot be installed here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, f"slurm/local/up.sh failed:\n{up.stdout}\n{up.stderr}"
    assert _ready_nodes() >= nodes, f"local SLURM came up without {nodes} ready nodes"
    yield _ready_nodes()
    if started:  # grown from a running cluster: others' tests may still use it
        subprocess.run(["bash", str(REPO / "slurm/local/down.sh")], check=False, timeout=120)


def scontrol(job: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True
    )
    return dict(tok.split("=", 1) for tok in out.stdout.split() if "=" in tok)


def until_done(job: str, timeout_s: float = 400) -> dict[str, str]:
    """Wait for the job to end; once it is requeued, lift its BeginTime hold (about 2 min)
    after REQUEUE_SETTLE_S to keep the test short. Not at once: slurmd revokes the old
    attempt's credential as the requeue lands, and a start within that moment is killed
    ("Job credential revoked", seen in CI: the job ends FAILED). Returns scontrol's view."""
    deadline = time.monotonic() + timeout_s
    released, requeued_at = False, None
    while (info := scontrol(job))["JobState"] not in ENDED:
        assert time.monotonic() < deadline, info
        if info["JobState"] == "PENDING" and info.get("Restarts", "0") != "0" and not released:
            requeued_at = requeued_at or time.monotonic()
            if time.monotonic() - requeued_at >= REQUEUE_SETTLE_S:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
                released = True
        time.sleep(1)
    return info


def started(run: Path, timeout_s: float = 300) -> Path:
    """`run` once the job made it (its batch script's setup does, on starting): what `ddpkit chaos
    --attach` needs (a run dir that does not exist is refused, not waited for)."""
    deadline = time.monotonic() + timeout_s
    while not run.is_dir():
        assert time.monotonic() < deadline, (
            f"{run} not made in {timeout_s:.0f} s: the job never started"
        )
        time.sleep(0.5)
    return run
