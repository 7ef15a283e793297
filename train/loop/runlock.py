"""One job per checkpoint dir: `<ckpt_dir>/.lock` names its owner and is kept fresh.

Two jobs writing the same checkpoints (a requeued job starting while the old one's workers
still run, or two submissions with the same run dir) corrupt each other's saves and prune
each other's checkpoints. Rank 0 holds a lock file with the owner's host, pid, torchrun
agent pid, launch id and a heartbeat (its mtime, touched every LOCK_HEARTBEAT_S). A newcomer:
- takes over silently from its own job (same host and agent: a torchrun restart);
- takes over with a warning when the owner is dead: same host and its pid is gone, or no
  heartbeat for LOCK_STALE_S (another host: it waits that long before deciding);
- otherwise refuses: ConfigError naming the owner (one line, exit 2, nothing written).
A lock that names no owner is never waited on forever: an empty one older than
LOCK_SETTLE_S (a newcomer writes its owner right after creating it) or one that holds
garbage (not JSON of LOCK_SHAPE) is a dead job's, taken over with a warning saying what is
wrong with it; a directory or an unreadable file in
its place is refused in one line (it is not the kit's to delete).
Torch-free: it runs before the run dir is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ddpkit.train.contract import LAUNCH_ID_ENV, pid_alive
from ddpkit.train.errors import ConfigError
from ddpkit.train.jsonshape import Opt, ShapeError, loads

LOCK_FILE = ".lock"
LOCK_HEARTBEAT_S = 5.0
LOCK_STALE_S = 30.0  # no heartbeat for this long: the owner is gone (any host)
LOCK_SETTLE_S = 2.0  # an empty lock younger than this is a newcomer about to write its owner
# What _me() writes: a lock of another shape names no owner the kit can ask ("garbage").
LOCK_SHAPE = {
    "host": str,
    "pid": int,
    "agent_pid": Opt((int, None)),
    "launch_id": Opt((str, None)),
    "time": Opt(float),
}


def _me() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "agent_pid": os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None,
        "launch_id": os.environ.get(LAUNCH_ID_ENV),
        "time": time.time(),
    }


def _read(path: Path) -> tuple[dict[str, Any] | None, float, str]:
    """(owner, mtime, what): what is "none" (no lock), "owner" (a readable one), "empty",
    "garbage: WHY" (not JSON of LOCK_SHAPE), "dir" or "unreadable" (then owner is None)."""
    try:
        mtime = path.stat().st_mtime
        if path.is_dir():
            return None, mtime, "dir"
        text = path.read_text(errors="replace")  # not UTF-8: garbage, below
    except FileNotFoundError:
        return None, 0.0, "none"
    except OSError:
        return None, 0.0, "unreadable"
    if not text.strip():
        return None, mtime, "empty"
    try:
        return loads(text, LOCK_SHAPE), mtime, "owner"
    except ShapeError as e:
        return None, mtime, f"garbage: {e}"


class RunLock:
    def __init__(self, ckpt_dir: str | Path, log: Any = print) -> None:
        self.path = Path(ckpt_dir) / LOCK_FILE
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _verdict(self) -> tuple[str, str]:
        """("free" | "ours" | "dead" | "live" | "wait" | "settle", who)."""
        owner, mtime, what = _read(self.path)
        if what == "none":
            return "free", ""
        if what in ("dir", "unreadable"):
            kind = "a directory" if what == "dir" else "unreadable"
            raise ConfigError(
                f"the lock {self.path} is {kind}, not a lock file this kit wrote; remove it if "
                "no job uses this checkpoint dir, or use another --ckpt-dir / --run-dir"
            )
        if owner is None:  # empty or garbage: it names no owner to ask
            if what == "empty" and time.time() - mtime < LOCK_SETTLE_S:
                return "settle", ""
            return "dead", f"an owner-less lock: {what}"
        me = _me()
        who = f"pid {owner.get('pid')} on {owner.get('host')}" + (
            f", launch {owner['launch_id']}" if owner.get("launch_id") else ""
        )
        same_host = owner.get("host") == me["host"]
        if same_host and owner.get("pid") == me["pid"]:
            return "ours", who
        if same_host and me["agent_pid"] and owner.get("agent_pid") == me["agent_pid"]:
            return "ours", who  # torchrun restarted its workers
        if same_host and isinstance(owner.get("pid"), int) and not pid_alive(owner["pid"]):
            return "dead", who
        if time.time() - mtime > LOCK_STALE_S:
            return "dead", who
        return ("live" if same_host else "wait"), who

    def acquire(self) -> None:
        deadline = time.time() + LOCK_STALE_S + LOCK_HEARTBEAT_S
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            verdict, who = self._verdict()
            if verdict == "wait" and time.time() < deadline:
                time.sleep(1.0)  # another host: alive only while its heartbeat moves
                continue
            if verdict == "settle":
                time.sleep(0.2)  # a newcomer's lock, about to name its owner
                continue
            if verdict == "free":
                try:  # O_EXCL: of two jobs starting at once, one wins; the other looks again
                    os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    time.sleep(0.05)
                    continue
            break
        if verdict in ("live", "wait"):
            raise ConfigError(self.in_use(who))
        if verdict == "dead":
            self.log(f"warning: taking over the stale lock {self.path} of a dead job ({who})")
        tmp = self.path.with_name(f"{LOCK_FILE}.tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(_me()) + "\n")
            os.replace(tmp, self.path)
        except OSError:  # e.g. a full disk: leave nothing behind
            tmp.unlink(missing_ok=True)
            if verdict == "free":
                self.path.unlink(missing_ok=True)
            raise
        self._thread = threading.Thread(target=self._beat, daemon=True, name="ddpkit-lock")
        self._thread.start()

    def in_use(self, who: str) -> str:
        return (
            f"{self.path.parent} is in use by another job ({who}, lock {self.path}); "
            "wait for it to end or cancel it, or use another --ckpt-dir / --run-dir"
        )

    def refuse_if_live(self, grace_s: float = LOCK_HEARTBEAT_S) -> None:
        """Before any worker starts (the node launcher): a lock a live job on this host
        holds is refused now, with acquire's line. Else the refusal came from rank 0 after
        every rank's start-up (torch, the model, the data, the process group): tens of
        seconds of a loaded node's CPU taken from the job that holds the dir. An owner about
        to leave (a requeued job's old workers still exiting) gets grace_s, idle, to do so.
        Reads only."""
        deadline = time.time() + grace_s
        while True:
            verdict, who = self._verdict()
            if verdict != "live":
                return
            if time.time() >= deadline:
                raise ConfigError(self.in_use(who))
            time.sleep(0.5)

    def _beat(self) -> None:
        while not self._stop.wait(LOCK_HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread = None
        owner, _, _ = _read(self.path)
        if owner is not None and owner.get("pid") == os.getpid():
            # A dir that turned read-only keeps the lock: the next run takes it over as a
            # dead job's; the error that ended this run is the one the user sees.
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)
