"""What breaks exactly-once is said, not done silently: ranks that build
datasets of different lengths are refused in one line; a resume that changes the epoch's
order mid-epoch (another --seed, another dataset size) says which samples it affects."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.trainrun import PY, clean_env, train

PER_RANK = """
import os, torch
def data(cfg):
    n = 256 + 64 * int(os.environ.get("RANK", "0"))  # rank 1 sees more samples
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(n, 8, generator=g)
    ys = (xs.sum(1) > 0).long()
    train = [(xs[i], ys[i]) for i in range(n)]
    return train, train[:32]
"""


@pytest.mark.slow
def test_ranks_with_datasets_of_different_lengths_are_refused_in_one_line(tmp_path):
    (tmp_path / "perrank.py").write_text(PER_RANK)
    run = str(tmp_path / "r")
    p = subprocess.run(
        [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2", "--run-dir", run,
         "--", "-m", "ddpkit.train", "--run-dir", run, "--dataset", "perrank:data", "--steps", "2"],
        cwd=tmp_path, env=clean_env(PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "Traceback" not in out, out[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert lines == [
        "error: the training dataset has 256 samples on some ranks and 320 on others: every "
        "rank must build the same dataset (the same files, or the same seed for generated "
        "data); the global order is drawn over one length"
    ], out[-3000:]


BASE = ["--steps", "3", "--synthetic-samples", "8192", "--seed", "0", "--no-eval"]


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """The 3-step run every case below resumes (one run, not one per case)."""
    run_dir = tmp_path_factory.mktemp("base") / "r"
    train(run_dir, *BASE)
    return run_dir


@pytest.mark.parametrize(
    "again, warned",
    [
        (["--seed", "7"], "--seed 7 (the checkpoint's: 0)"),
        (["--synthetic-samples", "4096"], "4096 training samples (the checkpoint's: 8192)"),
        ([], None),
    ],
)
def test_a_resume_that_changes_the_order_mid_epoch_says_what_it_breaks(
    base_run, tmp_path, again, warned
):
    shutil.copytree(base_run, tmp_path / "r")  # each case resumes its own copy
    run = train(tmp_path / "r", *BASE, "--steps", "5", *again)
    assert "resumed from" in run.out
    line = next((x for x in run.out.splitlines() if x.startswith("warning: resumed with")), None)
    if warned is None:
        assert line is None, line
    else:
        assert line is not None and warned in line, run.out[-2000:]
        assert "in the middle of epoch 0" in line and "exactly-once holds again" in line


def _beat(lock: Path, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        lock.touch(exist_ok=True)


def test_a_second_run_in_a_live_run_dir_is_refused_even_with_its_own_checkpoint_dir(tmp_path):
    """Two runs in one run dir would interleave metrics.jsonl and overwrite each other's
    config.json and summary.json: the run dir is locked like the checkpoint dir."""
    rd = tmp_path / "run"
    rd.mkdir()
    other = subprocess.Popen(["sleep", "300"])
    # The owner beats its lock as a live run does (runlock: a lock unbeaten for LOCK_STALE_S
    # is a dead job's): in CI the trainer's start alone once took longer than that.
    beating = threading.Event()
    beat = threading.Thread(target=_beat, args=(rd / ".lock", beating), daemon=True)
    try:
        owner = {"host": socket.gethostname(), "pid": other.pid, "agent_pid": None,
                 "launch_id": "old", "time": time.time()}  # fmt: skip
        (rd / ".lock").write_text(json.dumps(owner))
        beat.start()
        run = train(rd, "--steps", "2", "--ckpt-dir", str(tmp_path / "ck"), check=False)
    finally:
        beating.set()
        other.kill()
        other.wait()
    assert run.rc == 2 and "Traceback" not in run.out, run.out
    [line] = run.out.splitlines()
    assert line.startswith(f"error: {rd} is in use by another job (pid {other.pid} on "), line
    assert sorted(p.name for p in rd.iterdir()) == [".lock"]  # nothing of this run written
    assert not any((tmp_path / "ck").iterdir())  # its own checkpoint dir's lock is gone too
