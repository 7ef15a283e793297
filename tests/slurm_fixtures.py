"""The `slurm_cluster` fixture: a real local SLURM (slurm/local/up.sh), reused when up.

Skips only where SLURM cannot be installed here (not root, no apt-get, or the install
fails); a cluster that installs but does not come up fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NODES = 2


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
    if _ready_nodes() >= NODES:
        yield _ready_nodes()
        return
    if os.geteuid() != 0:
        pytest.skip("SLURM cannot be installed here: not root (run `make slurm-up` as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM cannot be installed here: no slurmctld and no apt-get")
    up = subprocess.run(
        ["bash", str(REPO / "slurm/local/up.sh"), str(NODES)],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if up.returncode != 0 and "apt-get install" in up.stderr:
        pytest.skip(f"SLURM cannot be installed here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, f"slurm/local/up.sh failed:\n{up.stdout}\n{up.stderr}"
    assert _ready_nodes() >= NODES, "local SLURM came up without 2 ready nodes"
    yield _ready_nodes()
    subprocess.run(["bash", str(REPO / "slurm/local/down.sh")], check=False, timeout=120)
