"""The memory planner: ZeRO accounting, exact FSDP2 shard sizes, the CLI, and (slow) the
planner's state bytes against what real training measures with 1, 2 and 4 ranks.

Here the tests that start processes; the in-process ones in tests/unit/tools/test_memory.py.
Helpers both use are in tests/unit/tools/test_memory.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ddpkit.tools.planner.memory import make_plan

from tests.trainrun import memory_here
from tests.unit.tools.test_memory import run_cli

ROOT = Path(__file__).resolve().parents[3]


def test_model_path_counts_and_activation_estimate():
    import argparse

    from ddpkit.tools.planner.model import describe_model, saved_activation_bytes

    ns = argparse.Namespace(model="mlp", config=None, batch_size=64)
    desc = describe_model(ns)
    assert desc.num_params == 784 * 256 + 256 + 256 * 10 + 10
    a64 = saved_activation_bytes(desc.cfg, 64, "fp32")
    a128 = saved_activation_bytes(desc.cfg, 128, "fp32")
    assert a64 > 64 * 784 * 4  # at least the input batch that the first Linear saves
    assert a128 == pytest.approx(2 * a64, rel=0.05)
    assert saved_activation_bytes(desc.cfg, 64, "bf16") < a64
    r = run_cli("--model", "gpt", "--gpus", "2", "--batch-size", "4")
    assert r.returncode == 0, r.stderr
    assert "activations ~" in r.stdout and "(estimate)" in r.stdout


# --- against real training -----------------------------------------------------------------

# 1, 2 and 4 ranks; DDP, FULL_SHARD (under bf16 the fp32 shards stay), HYBRID_SHARD on a 2x2
# mesh. FULL_SHARD on 4 ranks splits the 10-row output layer 3/3/3/1: exact shard sizes matter.
CASES = [
    (1, ["--parallel", "ddp"], "DDP", None),
    (
        2,
        ["--parallel", "fsdp", "--sharding", "FULL_SHARD", "--mixed-precision", "bf16"],
        "FULL_SHARD",
        None,
    ),
    (4, ["--parallel", "fsdp", "--sharding", "FULL_SHARD"], "FULL_SHARD", None),
    (
        4,
        ["--parallel", "fsdp", "--sharding", "HYBRID_SHARD", "--replicate-degree", "2"],
        "HYBRID_SHARD",
        2,
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "flags", "strategy", "replicate"), CASES)
def test_planner_matches_measured_state_bytes(tmp_path, world, flags, strategy, replicate):
    if not (ROOT / "train" / "__main__.py").exists():
        pytest.skip("train/ is not runnable yet")
    import argparse

    from ddpkit.tools.planner.model import describe_model

    run_dir = tmp_path / "run"
    if world == 1:  # one plain process: torchrun's agent would import torch once more
        cmd = [sys.executable, "-m", "ddpkit.train"]
    else:
        cmd = [shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"]
        cmd += ["--standalone", "--nproc-per-node", str(world), "-m", "ddpkit.train"]
    cmd += ["--model", "mlp", "--dataset", "synthetic", "--synthetic-samples", "512"]
    cmd += ["--batch-size", "16", "--steps", "2", "--log-interval", "1", "--no-eval"]
    cmd += ["--no-ckpt-final", "--run-dir", str(run_dir), *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    measured = summary["state_bytes_per_rank"]
    assert len(measured) == world

    desc = describe_model(argparse.Namespace(model="mlp", config=None))
    plan = make_plan(
        0, gpus=world, replicate_degree=replicate, shapes=desc.shapes, strategies=(strategy,)
    )
    assert summary["num_params"] == plan.num_params
    for rank, (want, got) in enumerate(zip(plan.strategies[0].per_rank, measured, strict=True)):
        for key in ("params", "grads", "optim", "total"):
            expect = want.as_dict()[key]
            assert got[key] == pytest.approx(expect, rel=0.05), (rank, key, got, want)
    if world == 2:  # the charts `make train` draws, from a real metrics.jsonl
        from ddpkit.tools import plot  # its main() here; tests/process/tools/test_plot.py runs it

        assert plot.main([str(run_dir)]) == 0
        assert (run_dir / "loss.png").is_file() and (run_dir / "memory.png").is_file()


def _user_project(tmp_path: Path) -> Path:
    """A user's project: a models/ package whose factory takes 3x32x32 images (not MNIST's)."""
    proj = tmp_path / "proj"
    (proj / "models").mkdir(parents=True)
    (proj / "models" / "__init__.py").write_text(
        "import torch.nn as nn\n\n\n"
        "def build_model(cfg=None, in_shape=None, num_classes=None):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))\n"
    )
    return proj


def test_memory_plans_the_users_own_model_from_the_workspace(
    tmp_path, one_line_error, capsys, monkeypatch
):
    """`ddpkit memory --model models:build_model` from the directory holding models/ imports
    it (no PYTHONPATH); the input shape comes from a flag or the job's dataset; a model the
    planner cannot run on the input it has is one line, exit 2. The installed command runs
    from the project twice (the import, and the one-line refusal as a process); the other
    cases run the planner's main() in this process, from the same directories."""
    ddpkit = str(Path(sys.executable).with_name("ddpkit"))
    proj = _user_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    monkeypatch.delitem(sys.modules, "models", raising=False)  # the user's, imported below

    def memory(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [ddpkit, "memory", "--gpus", "8", "--json", *args],
            cwd=proj, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    def here(*args: str, cwd: Path = proj) -> subprocess.CompletedProcess[str]:
        return memory_here(capsys, "--gpus", "8", "--json", *args, cwd=cwd)

    params = 3 * 32 * 32 * 10 + 10
    flagged = memory("--model", "models:build_model", "--input-shape", "3,32,32")
    assert flagged.returncode == 0, flagged.stderr
    assert json.loads(flagged.stdout)["num_params"] == params
    line = one_line_error(memory("--model", "models:build_model"))  # MNIST's 1x28x28 by default
    assert "models:build_model" in line and "--input-shape" in line and "1x28x28" in line
    try:
        for how in (["--dry-run"], ["--step-time"]):
            line = one_line_error(here("--model", "models:build_model", *how))
            assert "models:build_model" in line and "--input-shape" in line and "1x28x28" in line
        # the job's dataset shapes the input, and the job file's directory is the workspace
        job_file = proj / "job.toml"
        job_file.write_text('[train]\nmodel = "models:build_model"\ndataset = "cifar10"\n')
        job = here("--config", str(job_file), "--dry-run", cwd=tmp_path)
        assert job.returncode == 0, job.stderr
        assert json.loads(job.stdout)["params"] == params
        bad = one_line_error(here("--model", "models:build_model", "--input-shape", "3,x"))
        assert "--input-shape" in bad
    finally:
        for name in [m for m in sys.modules if m == "models" or m.startswith("models.")]:
            del sys.modules[name]


def test_cli_json_and_fit():
    r = run_cli("--params", "7B", "--gpus", "8", "--gpu-mem", "80", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    states = {s["strategy"]: s["state_bytes"] for s in d["strategies"]}
    assert states["DDP"] == 8 * states["FULL_SHARD"]
    r = run_cli("--params", "7B", "--gpus", "8", "--gpu-mem", "80")
    ddp_line = next(line for line in r.stdout.splitlines() if line.startswith("DDP "))
    fsdp_line = next(line for line in r.stdout.splitlines() if line.startswith("FULL_SHARD "))
    assert ddp_line.rstrip().endswith("NO") and fsdp_line.rstrip().endswith("yes")
    assert "112.00 GB" in ddp_line and "14.00 GB" in fsdp_line
    assert "not estimated" in r.stdout  # no model, no activation numbers


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--params", "lots"], "--params"),
        (["--params", "1e9", "--gpus", "6", "--nodes", "4"], "multiple of --nodes"),
        (
            ["--params", "1e9", "--gpus", "6", "--replicate-degree", "4"],
            "replicate degree 4 does not divide world size 6",
        ),
        (["--gpus", "2"], "exactly one of"),
        (["--model", "gpt", "--d-model", "100", "--n-head", "3"], "divisible"),
    ],
)
def test_cli_bad_input(args, needle, one_line_error):
    r = run_cli(*args)
    assert needle in one_line_error(r) and r.stdout == ""
