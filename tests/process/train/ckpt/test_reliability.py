"""Never keep a bad state: a non-finite loss, a failed save or a bad resume leaves the last good
checkpoint as it was. Real `python -m ddpkit.train` processes (torchrun + gloo where
the item needs ranks; a single process where it does not, which is much cheaper)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ddpkit.train.contract import EXIT_DIVERGED

from tests.trainrun import PY, ROOT, clean_env, full_params, torchrun_cmd, train

pytestmark = pytest.mark.slow

SMALL = ("--batch-size", "16", "--synthetic-samples", "1024", "--no-eval", "--log-interval", "1")


def test_reshard_with_less_than_one_global_batch_left_goes_to_the_next_epoch(tmp_path):
    # 1 process stops 16 samples before the end of epoch 0 (64 batches of 16); 2 ranks need
    # 32 per step: the rest of epoch 0 is their dropped tail, so they start epoch 1.
    rd = tmp_path / "run"
    first = train(rd, *SMALL, "--steps", "63").summary
    run = train(rd, *SMALL, "--steps", "65", nproc=2, timeout=120)
    assert "global batch 16 -> 32" in run.out
    assert [m["epoch"] for m in run.metrics()][-2:] == [1, 1]
    assert run.summary["steps"] == 65
    # item 4: the run's first loss survives the restart (it is in the train state)
    assert run.summary["first_loss"] == first["first_loss"] == run.metrics()[0]["loss"]


# --- item 1: divergence ----------------------------------------------------------------------


def _error_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("error: ")]


def _worker_tracebacks(out: str) -> int:
    """Tracebacks other than torchrun's own report of a failed worker."""
    return out.count("Traceback (most recent call last)") - out.count('bin/torchrun", line')


def test_divergence_stops_and_keeps_the_finite_checkpoints(tmp_path):
    # The case: loss nan from about step 15; keep-3 used to prune every finite one.
    rd = tmp_path / "run"
    args = ("--lr", "50", "--optimizer", "sgd", "--ckpt-interval", "10", "--ckpt-keep", "3")
    run = train(rd, *SMALL, *args, "--steps", "60", check=False)
    assert run.rc == EXIT_DIVERGED, run.out
    [line] = _error_lines(run.out)
    m = re.search(r"non-finite loss or gradient norm at step (\d+);", line)
    assert m, line
    bad = int(m.group(1))
    good = [p for p in (rd / "checkpoints").iterdir()]
    assert good and all(int(p.name[5:]) < bad for p in good)
    newest = max(good, key=lambda p: int(p.name[5:]))
    assert f"the last finite checkpoint is {newest}" in line and f"--resume {newest}" in line
    params = full_params(newest)
    assert all(torch.isfinite(t).all() for t in params.values() if isinstance(t, torch.Tensor))
    assert not (rd / "summary.json").exists()


def test_a_nan_on_one_rank_stops_every_rank_with_one_line(tmp_path):
    rd = tmp_path / "run"
    env = {"DDPKIT_FAULT": "nan@5:1"}
    run = train(rd, *SMALL, "--steps", "8", "--ckpt-interval", "3", nproc=2, env=env, check=False)
    assert run.rc != 0 and "exitcode  : 3" in run.out  # torchrun's report of the workers
    assert _worker_tracebacks(run.out) == 0
    [line] = _error_lines(run.out)  # rank 0 only
    assert "at step 5;" in line and f"--resume {rd / 'checkpoints' / 'step-3'}" in line
    assert sorted(p.name for p in (rd / "checkpoints").iterdir()) == ["step-3"]


def test_max_bad_steps_skips_the_step_on_every_rank(tmp_path):
    rd = tmp_path / "run"
    env = {"DDPKIT_FAULT": "nan@5:1"}
    run = train(rd, *SMALL, "--steps", "8", "--max-bad-steps", "1", nproc=2, env=env)
    assert "warning: step 5: non-finite loss or gradient norm, skipped (1 of" in run.out
    assert run.summary["steps"] == 8
    assert all(math.isfinite(m["loss"]) for m in run.metrics() if m["step"] != 5)
    params = full_params(rd / "checkpoints" / "step-8")
    assert all(torch.isfinite(t).all() for t in params.values() if isinstance(t, torch.Tensor))


# --- item 6: workers die with their agent; one job per checkpoint dir -------------------------


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for_line(p: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no {text!r} within {timeout} s:\n{''.join(seen)[-3000:]}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_workers_die_when_their_torchrun_agent_is_killed(tmp_path):
    cmd = torchrun_cmd(2) + ["--run-dir", str(tmp_path / "run"), "--progress", "plain"]
    cmd += [*SMALL, "--steps", "100000", "--ckpt-interval", "0"]
    p = subprocess.Popen(
        cmd, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    workers: list[int] = []
    try:
        _wait_for_line(p, "step      2/")
        workers = _children(p.pid)
        assert len(workers) == 2, workers
        p.kill()  # SIGKILL: the agent cannot forward anything
        p.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers), "workers outlived their agent"
    finally:
        p.kill()
        for w in workers:  # never leave a training process behind, even when this fails
            if _alive(w):
                os.kill(w, signal.SIGKILL)


def _lock(run_dir: Path, pid: int) -> Path:
    lock = run_dir / "checkpoints" / ".lock"
    lock.parent.mkdir(parents=True)
    owner = {"host": socket.gethostname(), "pid": pid, "agent_pid": None, "launch_id": "old"}
    lock.write_text(json.dumps({**owner, "time": time.time()}))
    return lock


def test_a_second_job_on_a_live_checkpoint_dir_is_refused(tmp_path):
    rd = tmp_path / "run"
    other = subprocess.Popen(["sleep", "300"])
    try:
        _lock(rd, other.pid)
        run = train(rd, *SMALL, "--steps", "2", check=False)
    finally:
        other.kill()
        other.wait()
    assert run.rc == 2 and "Traceback" not in run.out
    [line] = run.out.splitlines()
    assert line == (
        f"error: {rd / 'checkpoints'} is in use by another job (pid {other.pid} on "
        f"{socket.gethostname()}, launch old, lock {rd / 'checkpoints' / '.lock'}); wait for "
        "it to end or cancel it, or use another --ckpt-dir / --run-dir"
    )
    assert sorted(p.name for p in rd.iterdir()) == ["checkpoints"]  # nothing written


def test_a_stale_lock_of_a_dead_job_is_taken_over(tmp_path):
    rd = tmp_path / "run"
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = _lock(rd, dead.pid)
    run = train(rd, *SMALL, "--steps", "2")
    assert f"warning: taking over the stale lock {lock} of a dead job (pid {dead.pid}" in run.out
    assert not lock.exists()  # released at the end


# --- items 12 and 14: stop signals at start-up, in the last steps, USR1 then TERM -------------


def _catches(pid: int, signum: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def test_a_signal_during_start_up_saves_and_asks_for_a_requeue(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "requeue.json").write_text(json.dumps({"launch_id": "old", "step": 9}))  # stale
    cmd = [PY, "-m", "ddpkit.train", "--run-dir", str(rd), "--progress", "plain", *SMALL]
    env = clean_env(DDPKIT_LAUNCH_ID="new")
    p = subprocess.Popen(
        cmd + ["--steps", "50"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _catches(p.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)  # while torch is still importing
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 75, out
    assert "SIGTERM received: saving a checkpoint at step 0" in out
    marker = json.loads((rd / "requeue.json").read_text())
    assert (marker["launch_id"], marker["step"], marker["signal"]) == ("new", 0, "SIGTERM")
    assert (rd / "checkpoints" / "step-0" / ".complete").is_file()


def test_a_signal_in_the_last_step_ends_in_a_finished_run_that_says_so(tmp_path):
    env = {"DDPKIT_FAULT": "signal@12:0:SIGTERM"}  # sent to itself before the last step
    run = train(tmp_path / "run", *SMALL, "--steps", "12", env=env)
    assert "SIGTERM received during the last steps: the run finished instead" in run.out
    assert run.summary["signal"] == "SIGTERM" and run.summary["steps"] == 12
    assert not (tmp_path / "run" / "requeue.json").exists()


def test_usr1_then_term_to_the_agent_saves_and_writes_the_marker(tmp_path):
    rd = tmp_path / "run"
    cmd = torchrun_cmd(2) + ["--run-dir", str(rd), "--progress", "plain", *SMALL]
    cmd += ["--steps", "100000", "--ckpt-interval", "0"]
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean_env(DDPKIT_LAUNCH_ID="L1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        head = _wait_for_line(p, "step      3/")
        p.send_signal(signal.SIGUSR1)
        time.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        out = "".join(head) + p.communicate(timeout=120)[0]
    finally:
        p.kill()
    marker = json.loads((rd / "requeue.json").read_text())
    assert marker["launch_id"] == "L1" and marker["signal"] == "SIGUSR1", out
    assert (rd / "checkpoints" / f"step-{marker['step']}" / ".complete").is_file()
    assert f"SIGUSR1 received: saving a checkpoint at step {marker['step']}" in out


# --- item 8: a full disk ----------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """A 1.5 MB tmpfs (an mlp checkpoint with AdamW state is ~2.4 MB): needs root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the disk-full cases run as root in CI)")
    d = tmp_path / "tmpfs"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", str(d)],
                       capture_output=True, text=True)  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    yield d
    subprocess.run(["umount", str(d)], check=False)


NO_SPACE = re.compile(
    r"^error: no space left on device writing (\S+) \((\d+) bytes free(, about (\d+) needed)?\); "
)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_full_disk_during_a_save_is_one_line(tmpfs, mode):
    rd = tmpfs / "run"
    extra = ("--ckpt-async",) if mode == "async" else ()
    run = train(rd, *SMALL, "--steps", "4", "--ckpt-interval", "2", *extra, check=False)
    assert run.rc == 2 and "Traceback" not in run.out, run.out
    [line] = [x for x in run.out.splitlines() if x.startswith("error: ")]
    m = NO_SPACE.match(line)
    assert m and m.group(1) == str(rd / "checkpoints" / "step-2"), line
    assert int(m.group(4)) > 2_000_000  # the state of the mlp and AdamW
    assert not (rd / "checkpoints" / "step-2").exists()  # the partial save is gone


def test_a_full_run_dir_is_one_line(tmpfs, tmp_path):
    rd = tmpfs / "run"
    filler = tmpfs / "fill"
    with open(filler, "wb") as f:  # leave ~20 KB: the metrics lines fill it during training
        f.write(b"\0" * (1500 * 1024 - 20 * 1024))
    args = ("--steps", "2000", "--ckpt-dir", str(tmp_path / "ck"), "--no-ckpt-final")
    run = train(rd, *SMALL, *args, check=False)
    assert run.rc == 2 and "Traceback" not in run.out, run.out[-2000:]
    [line] = [x for x in run.out.splitlines() if x.startswith("error: ")]
    assert NO_SPACE.match(line) and str(rd) in line, line
