"""The end-of-run evaluation runs in training's micro-batches, for at most --eval-steps
batches: its memory is training's, whatever the size of the held-out split."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

RECORDER = """
import json, os, torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.f = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10))
    def forward(self, x):
        if not self.training:  # an eval batch: record its size
            with open(os.environ["EVAL_LOG"], "a") as f:
                f.write(json.dumps(x.shape[0]) + "\\n")
        return self.f(x)

def build(cfg):
    return Net()
"""


@pytest.mark.slow
@pytest.mark.parametrize(("eval_steps", "batches"), [(2, 2), (0, None)])
def test_eval_uses_training_micro_batches_for_at_most_eval_steps(tmp_path, eval_steps, batches):
    (tmp_path / "recorder.py").write_text(RECORDER)
    log = tmp_path / "eval.log"
    r = subprocess.run(
        [sys.executable, "-m", "ddpkit.train", "--model", "recorder:build", "--steps", "2",
         "--batch-size", "8", "--synthetic-samples", "512", "--eval-steps", str(eval_steps),
         "--run-dir", "runs/e"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(tmp_path), "EVAL_LOG": str(log), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    sizes = [json.loads(x) for x in log.read_text().split()]
    assert max(sizes) <= 8  # never more than training's micro-batch
    if batches is not None:
        assert len(sizes) == batches
    else:  # 0: the whole held-out split, still in micro-batches
        assert len(sizes) > 2
    summary = json.loads((tmp_path / "runs/e/summary.json").read_text())
    assert "eval_loss" in summary or "eval_accuracy" in json.dumps(summary)
