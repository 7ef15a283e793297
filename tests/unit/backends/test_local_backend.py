"""The node launcher (train/node.py) and the `local` backend, with real torchrun processes.

- the plain torchrun script (examples/plain_torchrun, knows nothing of ddpkit) runs through
  `python -m ddpkit.tools.submit submit local` on 2 ranks;
- bad input is one line + exit 2 before any process group (launcher and node launcher), and
  a worker's own exit 2 stays 2 without torch's ChildFailedError dump;
- the preemption contract (train/preempt.py) with a real SIGTERM: save + requeue -> 75 and a
  resume; a script that ignores it ends with 143 and one line; a requeue marker left by an
  earlier launch does not turn a crash into 75.

Here the tests that run in this process; those that start processes in
tests/process/backends/test_local_backend.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from ddpkit.train.contract import REQUEUE_MARKER

from tests.badjson import cases, damaged
from tests.trainrun import PY, ROOT, clean_env

PLAIN_JOB = "examples/plain_torchrun/job.toml"


def launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "ddpkit.tools.submit", *args],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def test_render_local_is_the_node_launcher_command(tmp_path: Path) -> None:
    p = launch("render", "local", "--config", PLAIN_JOB, "--set", f"train.run_dir={tmp_path}")
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith(f"exec {PY} -m ddpkit.train.node --run-dir {tmp_path}")
    assert "--standalone --nproc-per-node=2" in last
    assert last.endswith("-- ddp_fit.py --steps 50 --out runs/plain-torchrun/result.json")
    assert not tmp_path.joinpath("local").exists()  # render writes nothing


def test_fresh_requeue_marker_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpkit.train.contract import fresh_requeue_marker, write_requeue_marker

    monkeypatch.setenv("DDPKIT_LAUNCH_ID", "launch-a")
    write_requeue_marker(tmp_path, step=3)
    assert fresh_requeue_marker(tmp_path, "launch-a", since=0)
    assert not fresh_requeue_marker(tmp_path, "launch-b", since=0)  # an earlier attempt's
    # A writer that records no launch id: the file's time decides.
    marker = tmp_path / REQUEUE_MARKER
    marker.write_text('{"signal": "SIGUSR1"}')
    os.utime(marker, (1000.0, 1000.0))
    assert not fresh_requeue_marker(tmp_path, "launch-b", since=2000.0)
    assert fresh_requeue_marker(tmp_path, "launch-b", since=500.0)


def test_each_nodes_local_rank_0_asks_for_the_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """request_requeue writes on each node's local rank 0, also where the global rank is not
    0 (a node whose run dir is its own, like a pod without a claim); other ranks write nothing."""
    from ddpkit.train import preempt
    from ddpkit.train.contract import RUN_DIR_ENV

    for rank, local, writes in (("2", "0", True), ("3", "1", False), ("0", "0", True)):
        run = tmp_path / f"rank{rank}"
        monkeypatch.setenv(RUN_DIR_ENV, str(run))
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local)
        got = preempt.request_requeue(step=7)
        assert (got is not None) is writes and (run / REQUEUE_MARKER).exists() is writes
    monkeypatch.delenv("LOCAL_RANK")  # outside torchrun: RANK alone decides
    monkeypatch.setenv("RANK", "1")
    assert preempt.request_requeue(step=7) is None


def test_a_rank_goes_by_the_agreed_signal_so_a_cancel_learned_from_peers_asks_for_no_requeue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SLURM (requeue on USR1 only): each node's slurmd signals its own processes, so after a
    plain scancel a rank may stop on its peers' word before its own SIGTERM comes. Agreed on
    the signal (MAX), it knows the stop is a cancel and writes no marker; the MAX makes a
    cancel win over a preemption signal that came at the same moment elsewhere."""
    from ddpkit.train import preempt
    from ddpkit.train.contract import REQUEUE_SIGNALS_ENV, RUN_DIR_ENV

    monkeypatch.setenv(REQUEUE_SIGNALS_ENV, "SIGUSR1")
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    for own, agreed, marker in (
        (None, signal.SIGTERM, None),  # no signal here yet: a peer's scancel
        (signal.SIGUSR1, signal.SIGTERM, None),  # USR1 here, a cancel elsewhere: a cancel
        (None, signal.SIGUSR1, "SIGUSR1"),  # a peer's preemption: requeue, and say which
    ):
        monkeypatch.setattr(preempt, "_received", {})
        (tmp_path / REQUEUE_MARKER).unlink(missing_ok=True)
        assert preempt.signal_number() == 0 and not preempt.agree(0)
        if own is not None:
            preempt._handler(own, None)
        assert preempt.signal_number() == (own or 0)
        assert preempt.agree(agreed) and preempt.signal_number() == agreed
        assert preempt.seconds_left() > 0
        got = preempt.request_requeue(step=4)
        assert (got is None) is (marker is None), (own, agreed)
        if marker:
            assert json.loads((tmp_path / REQUEUE_MARKER).read_text())["signal"] == marker


STAMP = {"launch_id": "launch-a", "time": 1.7e9, "step": 3}
STAMPS = cases(damaged(STAMP, {"launch_id": ("string", "null"), "time": ("number", "null")}))


@pytest.mark.parametrize("label", list(STAMPS))
@pytest.mark.parametrize("name", [REQUEUE_MARKER, "summary.json"])
def test_a_damaged_requeue_marker_or_summary_is_not_this_launchs(tmp_path, capsys, name, label):
    """The node launcher asks after a stop whether this launch asked for a requeue (or
    finished), polling: a marker of another shape is no, with one warning for all polls."""
    from ddpkit.train.contract import finished_in_launch, fresh_requeue_marker

    ask = fresh_requeue_marker if name == REQUEUE_MARKER else finished_in_launch
    (tmp_path / name).write_bytes(STAMPS[label])
    assert not ask(tmp_path, "launch-a", 0.0)
    assert not ask(tmp_path, "launch-a", 0.0)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: ignoring {tmp_path / name} ("), line
