"""A finished rank exits cleanly although gloo's worker thread is still letting go of its last
work (train/teardown.py): the race that aborted finished runs with `terminate called without
an active exception`, forced with tests/process/launch/gloo_hold.c, first without the kit (plain
torchrun: it aborts), then through the kit's node launcher (it does not). The wait itself is
tested in process, on threads that pose as gloo's.

Here the tests that run in this process; those that start processes in
tests/process/launch/test_teardown.py."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

from ddpkit.train import teardown


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


def test_the_trainer_and_a_users_entry_install_it(monkeypatch, tmp_path):
    """Both ways a worker runs under the kit register the wait before any user code."""
    from ddpkit.train import signals
    from ddpkit.train.launch import entry

    calls = []
    monkeypatch.setattr(teardown, "install", lambda: calls.append("installed"))
    monkeypatch.setattr(signals, "install", lambda: None)  # signal handlers: not in pytest

    script = tmp_path / "s.py"
    script.write_text("import ddpkit.train.teardown as t\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert entry.run_entry([str(script)]) == 0
    from ddpkit.train.__main__ import main

    assert main(["--print-config"]) == 0
    assert calls == ["installed", "installed"]
