"""Every strategy starts from identical replicas: a user model whose initialisation differs
per rank trains as rank 0's model under FSDP (NO_SHARD, FULL_SHARD), as DDP does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PER_RANK_INIT = """
import os, torch

def build(cfg, per_rank=True):
    # numpy-style seeding a user might write: a different init on every rank
    torch.manual_seed(int(os.environ.get("RANK", "0")) if per_rank else 0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10))
"""


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["NO_SHARD", "FULL_SHARD"])
def test_a_per_rank_init_trains_as_rank_0s_model(tmp_path, sharding):
    (tmp_path / "perrank.py").write_text(PER_RANK_INIT)
    digests = []
    for per_rank in ("true", "false"):
        run = tmp_path / f"runs/{per_rank}"
        r = subprocess.run(
            [sys.executable, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2",
             "--", "-m", "ddpkit.train", "--model", "perrank:build", "--model-args",
             json.dumps({"per_rank": per_rank == "true"}), "--parallel", "fsdp", "--sharding",
             sharding, "--steps", "6", "--no-eval", "--ckpt-interval", "0", "--run-dir", str(run)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        digests.append(json.loads((run / "summary.json").read_text())["param_digest"])
    assert digests[0] == digests[1]
