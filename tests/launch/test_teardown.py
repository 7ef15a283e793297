"""A finished rank exits cleanly although gloo's worker thread is still letting go of its last
work (train/teardown.py): the race that aborted finished runs with `terminate called without
an active exception`, forced with tests/launch/gloo_hold.c, first without the kit (plain
torchrun: it aborts), then through the kit's node launcher (it does not). The wait itself is
tested in process, on threads that pose as gloo's."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ddpkit.train import teardown

from tests.trainrun import PY, TORCHRUN, clean_env

HERE = Path(__file__).resolve().parent
ABORT = "terminate called without an active exception"
HELD = "ddpkit-test: a gloo thread is held before the GIL"
ATTEMPTS = 16  # the worker holds the last reference in about 1 run of 3 (the rest: no race)

# A plain DDP script, as a user writes it, plus an object whose cleanup at interpreter exit
# takes a while (so a thread that wakes up 1 s later finds the interpreter finalizing). The
# hold begins with the last step.
RACE = """
import os, pathlib, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowCleanup:
    def __del__(self, sleep=time.sleep):
        sleep(2.0)


dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(4):
    if step == 3:
        pathlib.Path(os.environ["DDPKIT_TEST_HOLD_FLAG"]).touch()
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
print(f"rank {os.environ['RANK']}: finished", flush=True)
slow = SlowCleanup()
"""


@pytest.fixture(scope="module")
def hold_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the LD_PRELOAD that forces the race")
    out = tmp_path_factory.mktemp("shim") / "gloo_hold.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", out, HERE / "gloo_hold.c", "-ldl"],
                   check=True)  # fmt: skip
    return out


def forced_race(cmd: list[str], tmp_path: Path, shim: Path) -> subprocess.CompletedProcess[str]:
    """Run `cmd` on the race script until a run reaches the race (the shim says it held a
    gloo thread), and return that run."""
    (tmp_path / "train.py").write_text(RACE)
    runs = []
    for attempt in range(ATTEMPTS):
        env = clean_env(
            LD_PRELOAD=str(shim),
            DDPKIT_TEST_HOLD_FLAG=str(tmp_path / f"hold-{attempt}"),
            DDPKIT_TEST_HOLD_MS="1000",
        )
        run = subprocess.run([*cmd, "train.py"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        if HELD in run.stderr:
            return run
        assert run.returncode == 0, run.stdout + run.stderr  # no race reached: a clean run
        runs.append(run.returncode)
    pytest.fail(f"the race was not reached in {ATTEMPTS} runs (exit codes {runs})")


@pytest.mark.slow
def test_without_the_kit_a_finished_rank_aborts_when_gloo_lets_go_during_finalization(
    tmp_path, hold_shim
):
    """The reproduction: torch's own launcher, the user's script unchanged."""
    run = forced_race([TORCHRUN, "--standalone", "--nproc-per-node", "2"], tmp_path, hold_shim)
    out = run.stdout + run.stderr
    assert "rank 0: finished" in out and "rank 1: finished" in out, out
    assert ABORT in out, out
    assert run.returncode != 0, out


@pytest.mark.slow
def test_through_the_node_launcher_the_same_race_exits_cleanly(tmp_path, hold_shim):
    cmd = [PY, "-m", "ddpkit.train.node", "--standalone", "--nproc-per-node", "2", "--"]
    run = forced_race(cmd, tmp_path, hold_shim)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert ABORT not in out and "ended by" not in out, out  # not even the forgiven case
    assert "rank 0: finished" in out and "rank 1: finished" in out, out


# --- the wait, in process -----------------------------------------------------------------


def _posing_as_gloo(body, *args) -> threading.Thread:
    """A thread named as gloo's worker threads are (the name is all the wait looks at)."""

    def run() -> None:
        ctypes.CDLL(None).prctl(15, teardown.GLOO_WORKER.encode(), 0, 0, 0)  # PR_SET_NAME
        body(*args)

    before = set(teardown.gloo_workers())  # other tests' process groups may have some
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while set(teardown.gloo_workers()) <= before and time.monotonic() < deadline:
        time.sleep(0.001)
    return thread


def test_no_gloo_thread_means_no_wait(monkeypatch, tmp_path):
    (tmp_path / "7").mkdir()  # a process whose one thread is not gloo's
    (tmp_path / "7" / "comm").write_text("python\n")
    monkeypatch.setattr(teardown, "_TASKS", str(tmp_path))
    assert teardown.gloo_workers() == []
    assert teardown.wait_for_idle_gloo_workers(wait_s=0.0) is True


def test_a_parked_thread_is_idle():
    parked = threading.Event()
    thread = _posing_as_gloo(parked.wait)
    try:
        assert teardown.wait_for_idle_gloo_workers(wait_s=2.0)
    finally:
        parked.set()
        thread.join()


def test_a_thread_that_keeps_waking_up_is_not_idle():
    """As one that waits for the GIL does: it wakes every 5 ms, and our polls free the GIL."""
    stop = threading.Event()

    def napping() -> None:
        while not stop.is_set():
            time.sleep(0.002)

    thread = _posing_as_gloo(napping)
    try:
        assert not teardown.wait_for_idle_gloo_workers(wait_s=0.3)
    finally:
        stop.set()
        thread.join()


def test_the_wait_lasts_until_a_busy_thread_parks():
    """A thread still at work (running or preempted) is waited for, then found parked."""
    done, parked = threading.Event(), threading.Event()

    def busy_then_park() -> None:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
        done.set()
        parked.wait()

    thread = _posing_as_gloo(busy_then_park)
    try:
        assert teardown.wait_for_idle_gloo_workers(wait_s=5.0)
        assert done.is_set()
    finally:
        parked.set()
        thread.join()


def test_install_registers_once(monkeypatch):
    registered = []
    monkeypatch.setattr(teardown, "_installed", False)
    monkeypatch.setattr(teardown.atexit, "register", registered.append)
    teardown.install()
    teardown.install()
    assert registered == [teardown.wait_for_idle_gloo_workers]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_the_trainer_and_a_users_entry_install_it(monkeypatch, tmp_path):
    """Both ways a worker runs under the kit register the wait before any user code."""
    from ddpkit.train import early, node

    calls = []
    monkeypatch.setattr(teardown, "install", lambda: calls.append("installed"))
    monkeypatch.setattr(early, "install", lambda: None)  # signal handlers: not in pytest

    script = tmp_path / "s.py"
    script.write_text("import ddpkit.train.teardown as t\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert node.run_entry([str(script)]) == 0
    from ddpkit.train.__main__ import main

    assert main(["--print-config"]) == 0
    assert calls == ["installed", "installed"]
