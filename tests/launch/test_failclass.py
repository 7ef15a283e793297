"""Failure classes (train/failclass.py): a user's script whose own code raises is not retried
into the job's restart budget (the default, 3), driven from its project by `ddpkit run`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.train import failclass

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
        "rank 1 failed (exit code 1)" in out
        and "its own code raised KeyError: \"no column 'label' in data.csv\": not retried" in out
    ), out


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (KeyError("label"), failclass.CODE),
        (ValueError("shapes (3,) and (4,) not aligned"), failclass.CODE),
        (RuntimeError("Connection closed by peer [10.0.0.2]:4242"), failclass.INFRA),
        (RuntimeError("NCCL communicator was aborted on rank 3"), failclass.INFRA),
        (TimeoutError("store get"), failclass.INFRA),
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), failclass.INFRA),
    ],
)
def test_the_cause_of_an_exception(error, cause):
    assert failclass.cause_of(error) == cause
    assert failclass.is_code_failure(1, cause) is (cause == failclass.CODE)


def test_bad_input_and_divergence_are_never_retried_and_signals_always_are():
    assert failclass.is_code_failure(2, "") and failclass.is_code_failure(3, "")
    assert not failclass.is_code_failure(-9, failclass.CODE)
    assert not failclass.is_code_failure(1, "")  # unexplained: a restart may cure it
