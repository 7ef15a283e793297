"""Checkpoints and fault tolerance with real torchrun processes and real signals."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.trainrun import PY, ROOT, clean_env, full_params, train

pytestmark = pytest.mark.slow

# 2 ranks, DDP, 12 steps, a checkpoint every 3: the reference every interrupted run must match.
# --stop-check-s 0: ranks agree on stop signals every step, so a signal sent before step k
# stops the run at a known step (the default agrees every ~0.25 s; tested below).
BASE = (
    "--stop-check-s",
    "0",
    "--steps",
    "12",
    "--batch-size",
    "16",
    "--lr",
    "3e-3",
    "--log-interval",
    "3",
    "--ckpt-interval",
    "3",
    "--synthetic-samples",
    "1024",
    "--no-eval",
)


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step}"


def assert_bitwise(a, b, where: str = "") -> None:
    """Equal structure and bitwise-equal tensors (nested: the optimizer part is a tree)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_bitwise(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise(x, y, f"{where}[{i}]")
    else:
        assert a == b or (a != a and b != b), where  # NaN (no first loss yet) equals NaN


def export(ckpt: Path, out: Path) -> dict:
    p = subprocess.run(
        [PY, "-m", "ddpkit.tools.ckpt", "export", str(ckpt), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return torch.load(out, weights_only=True)


def export_here(ckpt: Path, out: Path) -> dict:
    """`ddpkit ckpt export` in this process (torch is loaded here already; a process costs
    its import again); test_ckpt_inspect_and_export runs the command as a process."""
    from ddpkit.tools.ckpt import main

    assert main(["export", str(ckpt), str(out)]) == 0
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return train(tmp_path_factory.mktemp("ref") / "run", *BASE, nproc=2)


def test_sigkill_mid_run_restarts_and_ends_bitwise_identical(tmp_path):
    # 4 ranks: with more than two, DDP's bucket layout decides the order of the additions
    # (the trainer settles it after a resume), and torchrun reuses its store across attempts.
    reference = train(tmp_path / "ref", *BASE, nproc=4)
    run = train(
        tmp_path / "run",
        *BASE,
        nproc=4,
        torchrun_args=("--max-restarts", "1"),
        env={"DDPKIT_FAULT": "kill@8:1"},
    )  # rank 1 SIGKILLs itself before step 8
    assert "[fault injection] kill on rank 1 at step 8" in run.out
    assert run.summary["resumed_from"].endswith("step-6")
    assert run.summary["param_digest"] == reference.summary["param_digest"]
    a = export_here(step_dir(reference.run_dir, 12), tmp_path / "a.pt")
    b = export_here(step_dir(run.run_dir, 12), tmp_path / "b.pt")
    assert_bitwise(a["model"], b["model"])


def test_sigterm_saves_exits_for_requeue_and_the_rerun_matches(reference, tmp_path):
    rd = tmp_path / "run"
    first = train(rd, *BASE, nproc=2, env={"DDPKIT_FAULT": "signal@5:0:SIGTERM"}, check=False)
    assert first.rc != 0  # torchrun itself reports the signal
    req = json.loads((rd / "requeue.json").read_text())
    assert req["signal"] == "SIGTERM" and 5 <= req["step"] < 12
    assert f"SIGTERM received: saving a checkpoint at step {req['step']}" in first.out
    assert "within the 30 s shutdown timeout; exiting 75 (requeue)" in first.out
    assert (step_dir(rd, req["step"]) / ".complete").is_file()
    second = train(rd, *BASE, nproc=2)  # the requeued job: the same command again
    assert not (rd / "requeue.json").exists()
    assert second.summary["resumed_from"].endswith(f"step-{req['step']}")
    assert second.summary["param_digest"] == reference.summary["param_digest"]


def test_preemption_exit_status_without_torchrun(tmp_path):
    # Default agreement interval (~0.25 s of steps): the stop comes within a few hundred
    # steps of these ~10 ms steps, long before the 2000th.
    args = ("--steps", "2000", "--log-interval", "20", "--ckpt-interval", "0", "--no-eval")
    run = train(tmp_path / "run", *args, env={"DDPKIT_FAULT": "signal@30:0:SIGUSR1"}, check=False)
    assert run.rc == 75, run.out
    step = json.loads((run.run_dir / "requeue.json").read_text())["step"]
    assert 30 <= step < 2000
    assert f"SIGUSR1 received: saving a checkpoint at step {step}" in run.out
    assert "within the 30 s shutdown timeout" in run.out
    assert (step_dir(run.run_dir, step) / ".complete").is_file()


def test_a_save_over_the_shutdown_timeout_is_reported(tmp_path):
    run = train(
        tmp_path / "run",
        *BASE,
        "--shutdown-timeout-s",
        "0.000001",
        env={"DDPKIT_FAULT": "signal@4:0:SIGTERM"},
        check=False,
    )
    assert run.rc == 75
    assert "MORE than the 1e-06 s shutdown timeout" in run.out


def test_async_saves_write_the_same_checkpoint_as_sync(reference, tmp_path):
    run = train(tmp_path / "run", *BASE, "--ckpt-async", nproc=2)
    assert run.summary["param_digest"] == reference.summary["param_digest"]
    for part in ("model", "optim", "train"):
        assert_bitwise(
            full_params(step_dir(reference.run_dir, 9), part),
            full_params(step_dir(run.run_dir, 9), part),
        )
    kept = sorted(p.name for p in (run.run_dir / "checkpoints").iterdir())
    assert kept == ["step-12", "step-6", "step-9"]  # --ckpt-keep 3


def _trace(d: Path) -> list[tuple[int, list[int]]]:
    out = []
    for f in sorted(d.glob("rank*.txt")):
        for line in f.read_text().splitlines():
            ep, *idx = map(int, line.split())
            out.append((ep, idx))
    return out


def test_reshard_four_fsdp_ranks_to_two_ddp_ranks(tmp_path):
    args = (
        "--batch-size",
        "8",
        "--synthetic-samples",
        "512",
        "--lr",
        "3e-3",
        "--no-eval",
        "--log-interval",
        "2",
    )
    trace_a, trace_b = tmp_path / "ta", tmp_path / "tb"
    trace_a.mkdir()
    trace_b.mkdir()
    a = train(
        tmp_path / "a",
        *args,
        "--parallel",
        "fsdp",
        "--sharding",
        "FULL_SHARD",
        "--steps",
        "6",
        nproc=4,
        env={"DDPKIT_TRACE_SAMPLES": str(trace_a)},
    )
    saved = step_dir(a.run_dir, 6)
    # Load under DDP on 2 ranks and save again without training: the state must be equal.
    b = train(tmp_path / "b", *args, "--steps", "6", "--resume", str(saved), nproc=2)
    assert "world size 4 -> 2: global batch 32 -> 16" in b.out
    for part in ("model", "optim"):
        assert_bitwise(full_params(saved, part), full_params(step_dir(b.run_dir, 6), part))
    # Then train the rest of epoch 0 on 2 ranks: 512 - 6*32 = 320 samples = 20 steps of 16.
    c = train(
        tmp_path / "c",
        *args,
        "--steps",
        "26",
        "--resume",
        str(saved),
        nproc=2,
        env={"DDPKIT_TRACE_SAMPLES": str(trace_b)},
    )
    assert c.summary["steps"] == 26
    seen = [i for ep, idx in _trace(trace_a) + _trace(trace_b) if ep == 0 for i in idx]
    assert len(seen) == len(set(seen)) == 512  # every sample of the epoch exactly once


def test_truncated_checkpoint_is_skipped_and_resume_uses_the_previous(tmp_path):
    rd = tmp_path / "run"
    train(rd, *BASE, "--steps", "6")
    newest = step_dir(rd, 6)
    (newest / ".complete").unlink()  # as if killed between the data and the marker
    data = next(newest.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:100])
    run = train(rd, *BASE, "--steps", "8")
    assert f"warning: skipping incomplete checkpoint {newest}" in run.out
    assert run.summary["resumed_from"].endswith("step-3")
    assert (step_dir(rd, 8) / ".complete").is_file()


# A rank hung in a training step: its peer's line names the step's collective and the rank,
# within --timeout-s (tests/process/train/loop/test_hangs.py: test_a_hung_rank_is_stopped_for_the_restart_...
# names the DDP gradient all_reduce; the job's exit 1 within the timeout, not the stall:
# test_a_rank_stalled_at_a_logging_step_is_named_in_one_line and its neighbours there).


def test_resume_from_something_that_is_not_a_checkpoint(tmp_path):
    bogus = tmp_path / "step-3"
    bogus.mkdir()
    run = train(tmp_path / "run", "--resume", str(bogus), "--steps", "2", check=False)
    assert run.rc == 2 and "Traceback" not in run.out
    assert f"--resume {bogus}: not a complete ddpkit checkpoint" in run.out


def test_resume_a_checkpoint_of_another_model(tmp_path):
    rd = tmp_path / "run"
    train(rd, *BASE, "--steps", "3")
    run = train(
        tmp_path / "other",
        "--model",
        "mlp-deep",
        "--steps",
        "4",
        "--resume",
        str(step_dir(rd, 3)),
        check=False,
    )
    assert run.rc == 2 and "Traceback" not in run.out
    assert "holds a different model (mlp" in run.out


def test_ckpt_inspect_and_export(reference, tmp_path):
    ck = step_dir(reference.run_dir, 12)
    p = subprocess.run(
        [PY, "-m", "ddpkit.tools.ckpt", "inspect", str(ck), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    info = json.loads(p.stdout)
    assert (info["step"], info["world_size"], info["parallel"]) == (12, 2, "ddp")
    keys = {e["key"]: e for e in info["entries"]}
    assert keys["model.layers.0.0.weight"]["shape"] == [256, 784]
    assert keys["model.layers.0.0.weight"]["bytes"] == 256 * 784 * 4
    exported = export(ck, tmp_path / "m.pt")
    assert exported["meta"]["step"] == 12
    assert exported["model"]["layers.0.0.weight"].shape == (256, 784)
    bad = subprocess.run(
        [PY, "-m", "ddpkit.tools.ckpt", "inspect", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert bad.returncode == 2 and "not a DCP checkpoint" in bad.stderr
    assert "Traceback" not in bad.stderr
