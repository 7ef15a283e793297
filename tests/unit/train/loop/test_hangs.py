"""What must never hang: a lock that names no owner, a second fit() in one process, a rank
that dies or stalls before a barrier. Each ends within its bound, with one line that names
the cause.

Here the tests that run in this process; those that start processes in
tests/process/train/loop/test_hangs.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from ddpkit.train.config import ConfigError
from ddpkit.train.loop.runlock import LOCK_SETTLE_S, RunLock

from tests.badjson import cases, damaged


def _lock_of(ckpt: Path, body: str | None) -> Path:
    """<ckpt>/.lock with `body` (None: a directory), made old enough to be no newcomer's."""
    lock = ckpt / ".lock"
    ckpt.mkdir(parents=True, exist_ok=True)
    if body is None:
        lock.mkdir()
    else:
        lock.write_text(body)
    old = time.time() - 10 * LOCK_SETTLE_S
    os.utime(lock, (old, old))
    return lock


@pytest.mark.timeout(30)
@pytest.mark.parametrize("body", ["", "\n", "{not json", "[1, 2]", '"a string"', "\x00\xff"])
def test_a_lock_that_names_no_owner_is_taken_over_with_a_warning(tmp_path, body):
    lock = _lock_of(tmp_path, body)
    said: list[str] = []
    run_lock = RunLock(tmp_path, log=said.append)
    run_lock.acquire()
    try:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert len(said) == 1 and "taking over the stale lock" in said[0], said
        assert "owner-less lock" in said[0]
    finally:
        run_lock.release()
    assert not lock.exists()


# A lock as RunLock writes it (another host's: only its shape decides), and its keys' types.
LOCK = {"host": "elsewhere", "pid": 4242, "agent_pid": None, "launch_id": "L1", "time": 1.7e9}
LOCKS = cases(
    damaged(
        LOCK,
        {"host": ("string",), "pid": ("integer",), "agent_pid": ("integer", "null"),
         "launch_id": ("string", "null"), "time": ("number",)},
        required={"host", "pid"},
    )
)  # fmt: skip


@pytest.mark.timeout(30)
@pytest.mark.parametrize("label", list(LOCKS))
def test_a_lock_of_another_shape_is_an_owner_less_one(tmp_path, label):
    """Every damage of a lock file (wrong-typed owner fields, another JSON type, not JSON) is
    a lock that names no owner: taken over with one warning saying so, never a traceback."""
    lock = tmp_path / ".lock"
    lock.write_bytes(LOCKS[label])
    old = time.time() - 10 * LOCK_SETTLE_S
    os.utime(lock, (old, old))
    said: list[str] = []
    run_lock = RunLock(tmp_path, log=said.append)
    run_lock.acquire()
    try:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        [line] = said
        assert line.startswith(f"warning: taking over the stale lock {lock} of a dead job (an ")
        assert "owner-less lock" in line and "\n" not in line, line
    finally:
        run_lock.release()


@pytest.mark.timeout(30)
def test_a_lock_whose_owner_is_a_zombie_is_taken_over(tmp_path):
    """An owner killed but never reaped (a container whose PID 1 reaps no orphans: the
    kit's own launcher there) is dead: its lock is taken over, not refused as in use (a
    torchft group restarted in a container found its killed rank's lock held)."""
    owner = subprocess.Popen(["sleep", "300"])
    try:
        owner.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{owner.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "never became a zombie"
            time.sleep(0.05)
        (tmp_path / ".lock").write_text(
            json.dumps({"host": socket.gethostname(), "pid": owner.pid})
        )
        said: list[str] = []
        run_lock = RunLock(tmp_path, log=said.append)
        run_lock.acquire()
        try:
            assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
            assert len(said) == 1 and "taking over the stale lock" in said[0], said
        finally:
            run_lock.release()
    finally:
        owner.wait()  # reaped only now


def test_a_directory_in_place_of_the_lock_is_refused_in_one_line(tmp_path):
    lock = _lock_of(tmp_path, None)
    with pytest.raises(ConfigError, match="is a directory, not a lock file") as e:
        RunLock(tmp_path).acquire()
    assert "\n" not in str(e.value) and str(lock) in str(e.value)
    assert lock.is_dir()  # not the kit's to delete


def test_the_other_path_sentence_names_only_the_ranks_whose_own_code_called():
    from ddpkit.train.diagnosis import _other_path

    phase, when = "forward/backward (DDP gradient all_reduce)", "at step 1"
    assert _other_path({0: "", 1: ""}, phase, when) == ""  # all in the kit's collective
    assert _other_path({0: "barrier() at m.py:3 (in f)", 1: "barrier() at m.py:3 (in f)"},
                       phase, when) == ""  # fmt: skip
    text = _other_path({0: "barrier() at m.py:3 (in f)", 1: "", 2: ""}, phase, when)
    assert text.startswith("rank 0 called barrier() at m.py:3 (in f), while ranks [1, 2] were")


def _agent_store(round_: int) -> tuple[object, dict[str, str]]:
    """A real TCPStore standing in for torchrun's agent store, and the environment torchrun
    gives a worker of rendezvous round `round_` (keep the server referenced while used)."""
    import torch.distributed as dist

    from tests.trainrun import free_port

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, None, is_master=True, wait_for_workers=False)
    env = {
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "DDPKIT_RDZV_ROUND": str(round_),
    }
    return server, env


def test_a_users_env_rendezvous_in_a_restart_cannot_read_the_attempt_befores_keys(monkeypatch):
    """A user's script (run_entry) calls init_process_group through env://, whose store is
    torchrun's agent store, the same for every attempt. Scoped to the attempt, the keys the
    first attempt's gloo published (its ranks' addresses) are not what the restart reads:
    a restarted rank read a dead peer's address ("connectFullMesh ... Connection refused")
    or waited there until the timeout. The restart's own keys meet, whatever the scheme."""
    import importlib
    from datetime import timedelta

    from ddpkit.train import diagnosis

    registry = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    for scheme in ("env", "tcp"):  # restored after the test
        monkeypatch.setitem(registry, scheme, registry[scheme])
    server, env = _agent_store(0)
    env.update(RANK="0", WORLD_SIZE="1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    diagnosis.scope_rendezvous_to_attempt()
    diagnosis.scope_rendezvous_to_attempt()  # once only: a second call wraps nothing twice
    url = "env://?rank=0&world_size=1"
    first, _, _ = next(registry["env"](url, timeout=timedelta(seconds=5)))
    first.set("rank_1", "the first attempt's rank 1")
    monkeypatch.setenv("DDPKIT_RDZV_ROUND", "1")
    again, _, _ = next(registry["env"](url, timeout=timedelta(seconds=5)))
    assert not again.check(["rank_1"])  # the restart waits for its own rank 1
    again.set("rank_1", "the restart's rank 1")
    tcp = f"tcp://127.0.0.1:{env['MASTER_PORT']}?rank=0&world_size=1"
    same, _, _ = next(registry["tcp"](tcp, timeout=timedelta(seconds=5)))
    assert same.get("rank_1") == b"the restart's rank 1"
    assert first.get("rank_1") == b"the first attempt's rank 1"
    del server
