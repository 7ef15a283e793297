"""Failure classes (train/failclass.py): a user's script whose own code raises is not retried
into the job's restart budget (the default, 3), driven from its project by `ddpkit run`.

Here the tests that start processes; the in-process ones in tests/unit/launch/test_failclass.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

DDPKIT = Path(sys.executable).with_name("ddpkit")
RAISES = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']} rank {dist.get_rank()}", flush=True)
if dist.get_rank() == 1:
    raise KeyError("no column 'label' in data.csv")
dist.barrier()
"""


@pytest.mark.slow
def test_a_script_raising_on_every_attempt_fails_once_with_its_line(tmp_path):
    (tmp_path / "train.py").write_text(RAISES)
    (tmp_path / "ddpkit.toml").write_text(
        'name = "bad"\nnproc_per_node = 2\naccelerator = "cpu"\nscript = "train.py"\n'
    )  # no max_restarts: the default budget applies, and a code failure must not use it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [str(DDPKIT), "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "attempt 0 rank 1" in out and "attempt 1" not in out
    assert (
        f"rank 1 (node 0, host {socket.gethostname()}) failed (exit code 1)" in out
        and "its own code raised KeyError: \"no column 'label' in data.csv\": not retried" in out
    ), out
